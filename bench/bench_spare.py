"""The warm spare by itself: what a parked spare costs, and what it saves at a restart.

    .venv/bin/python bench/bench_spare.py [--park 30] [--imports "torch;torch,ultralytics"] [--tries 3]

A real spare (src/trainctl/inside/spare.py, started as the agent starts one: ``python -c``
with its FIFO) imports ``--imports``, then parks; over ``--park`` s its CPU time (user +
system, of the process and its threads) is read from /proc through psutil, and its RSS and
PSS.  Then it is released to run a script that imports the same modules and prints the time:
release → the script's first line, against a cold ``python script.py`` doing the same (the
interpreter's start-up and the imports), ``--tries`` times each, medians printed.  One row
per set of imports (``;`` between sets), through bench/doc_tables.py (``--docs``: block
``spare``).

    .venv/bin/python bench/bench_spare.py --first-batches [--after 0,30] [--rounds 2] [--train 45]

When to warm it: a plain PyTorch loop (an MLP, a DataLoader with 2 workers, one key=value
line per batch) run under ``trainctl run --headless`` for ``--train`` s of training, with
``--no-spare`` (the baseline) and with the spare warmed ``TRAINCTL_SPARE_AFTER`` s after the
first batch (each of ``--after``), in alternating rounds.  The trainer notes the time of every
batch; the table (block ``spare-when``): batches/s over the 10 s from the first batch and from
each ``--after`` point, per setting (median of the rounds), against the baseline's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from trainctl.agent.spare import launch_argv, launch_env, script_of
from trainctl.inside.spare import encode_request

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_tables import Recorder, add_docs_flag

DOC_TABLES = {
    "spare": (
        "imports",
        "import time while parking s",
        "CPU while parked",
        "RSS MiB",
        "PSS MiB",
        "GPU context",
        "release → script's first line s",
        "cold start → first line s",
    ),
    "spare-when": ("spare", "window after the first batch s", "batches/s", "against --no-spare", "rounds"),
}

SCRIPT = "import time, {imports}\nprint(time.time(), flush=True)\n"


def parked(tmp: Path, imports: str) -> tuple[subprocess.Popen, int, dict]:
    """A spare parked with ``imports`` done: (process, the FIFO's writer fd, its ready note)."""
    fifo = tmp / f"spare-{time.monotonic_ns()}.fifo"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDWR)
    command = script_of([sys.executable, str(tmp / "script.py")])
    assert command is not None
    env = dict(launch_env(command, os.environ, fifo), TRAINCTL_SPARE_IMPORTS=imports)
    proc = subprocess.Popen(
        launch_argv(command, [sys.executable, str(tmp / "script.py")]),
        env=env,
        cwd=tmp,
        stdout=subprocess.PIPE,
    )
    ready = Path(f"{fifo}.ready")
    while not ready.exists():
        if proc.poll() is not None:
            raise SystemExit(f"the spare ended ({proc.returncode}) before it was ready")
        time.sleep(0.05)
    return proc, fd, json.loads(ready.read_text())


def released_s(tmp: Path, imports: str, park_s: float = 0.5) -> float:
    proc, fd, _ = parked(tmp, imports)
    time.sleep(park_s)
    argv = [sys.executable, str(tmp / "script.py")]
    req = encode_request(("path", argv[1], []), argv, dict(os.environ), {}, str(tmp))
    t0 = time.time()
    os.write(fd, req)
    os.close(fd)
    out, _ = proc.communicate(timeout=120)
    return float(out.split()[0]) - t0


def cold_s(tmp: Path) -> float:
    t0 = time.time()
    out = subprocess.run(
        [sys.executable, str(tmp / "script.py")], capture_output=True, check=True, cwd=tmp
    ).stdout
    return float(out.split()[0]) - t0


LOOP = """import json, sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
data = TensorDataset(torch.randn(4096, 256), torch.randint(0, 10, (4096,)))
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
times, seconds, epoch = [], float(sys.argv[2]), 0
while not times or times[-1] - times[0] < seconds:
    epoch += 1
    loader = DataLoader(data, batch_size=64, shuffle=True, num_workers=2)
    for b, (x, y) in enumerate(loader, 1):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        print(f"epoch={epoch}/1000 batch={b}/{len(loader)} loss={loss.item():.4f}", flush=True)
        times.append(time.monotonic())
        if times[-1] - times[0] >= seconds:
            break
open(sys.argv[1], "w").write(json.dumps(times))
"""
WINDOW_S = 10.0


def first_batches(tmp: Path, after: str | None, train_s: float, tag: str) -> list[float]:
    """The batch times of one supervised run (``after`` None: --no-spare)."""
    (tmp / "loop.py").write_text(LOOP)
    status = tmp / f"{tag}.json"
    env = dict(os.environ, TRAINCTL_CONFIG_DIR=str(tmp / "config"), TRAINCTL_RUNS_DIR=str(tmp / "runs"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("TRAINCTL_SPARE_AFTER", None)
    argv = [sys.executable, "-m", "trainctl", "run", "--headless", "--run-dir", str(tmp / f"run-{tag}")]
    if after is None:
        argv.append("--no-spare")
    else:
        env["TRAINCTL_SPARE_AFTER"] = after
    argv += ["--", sys.executable, str(tmp / "loop.py"), str(status), str(train_s)]
    subprocess.run(argv, env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, check=True)
    return json.loads(status.read_text())


def rate_in(times: list[float], start: float) -> float:
    """Batches/s over [first batch + start, + WINDOW_S)."""
    t0 = times[0] + start
    return sum(t0 <= t < t0 + WINDOW_S for t in times) / WINDOW_S


def spare_when(afters: list[str], rounds: int, train_s: float) -> list[list[object]]:
    """The ``spare-when`` rows: each setting's rate in each window, beside the baseline's."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-spare-when-"))
    settings: list[str | None] = [None, *afters]
    runs: dict[str | None, list[list[float]]] = {a: [] for a in settings}
    for r in range(rounds):
        for a in settings if r % 2 == 0 else settings[::-1]:
            runs[a].append(first_batches(tmp, a, train_s, f"r{r}-{a}"))
            print(f"round {r + 1}: spare after {a}: {len(runs[a][-1])} batches", flush=True)
    starts = sorted({0.0, *(float(a) for a in afters)})
    rows: list[list[object]] = []
    for start in starts:
        base = statistics.median(rate_in(t, start) for t in runs[None])
        for a in settings:
            per = [rate_in(t, start) for t in runs[a]]
            med = statistics.median(per)
            label = "none (--no-spare)" if a is None else f"warmed {a} s after the first batch"
            against = "—" if a is None else f"{100 * (med / base - 1):+.1f} %"
            rows.append(
                [
                    label,
                    f"{start:g}–{start + WINDOW_S:g}",
                    f"{med:.1f}",
                    against,
                    ", ".join(f"{x:.1f}" for x in per),
                ]
            )
    return rows


def one_set(imports: str, park: float, tries: int) -> list[object]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-spare-"))
    (tmp / "script.py").write_text(SCRIPT.format(imports=imports))
    proc, fd, ready = parked(tmp, imports)
    me = psutil.Process(proc.pid)
    c0, t0 = me.cpu_times(), time.monotonic()
    time.sleep(park)
    c1, wall = me.cpu_times(), time.monotonic() - t0
    mem = me.memory_full_info()
    cpu = (c1.user + c1.system - c0.user - c0.system) / wall * 100
    os.close(fd)
    proc.wait(30)
    warm = [released_s(tmp, imports) for _ in range(tries)]
    cold = [cold_s(tmp) for _ in range(tries)]

    def median(v: list[float]) -> str:
        return f"{statistics.median(v):.3f} (median of {len(v)}: {', '.join(f'{x:.3f}' for x in v)})"

    return [
        imports.replace(",", ", "),
        f"{ready['import_s']:.2f}",
        f"{cpu:.3f} % of a core over {wall:.0f} s",
        f"{mem.rss / 2**20:.0f}",
        f"{mem.pss / 2**20:.0f}",
        "yes" if ready["cuda_initialized"] else "none",
        median(warm),
        median(cold),
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--park", type=float, default=30.0, help="seconds to watch a parked spare")
    p.add_argument(
        "--imports", default="torch;torch,ultralytics", help="sets of modules the spare imports (; between)"
    )
    p.add_argument("--tries", type=int, default=3)
    p.add_argument("--first-batches", action="store_true", help="when to warm the spare (see above)")
    p.add_argument("--after", default="0,30", help="TRAINCTL_SPARE_AFTER values, comma-separated")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--train", type=float, default=45.0, help="seconds of training per run")
    add_docs_flag(p)
    args = p.parse_args()
    rec = Recorder(DOC_TABLES, args.docs)
    if args.first_batches:
        rec.publish("spare-when", spare_when(args.after.split(","), args.rounds, args.train))
        return 0
    rows = []
    for imports in args.imports.split(";"):
        rows.append(one_set(imports, args.park, args.tries))
        print(" | ".join(map(str, rows[-1])), flush=True)
    rec.publish("spare", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
