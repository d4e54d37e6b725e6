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
    )
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
    add_docs_flag(p)
    args = p.parse_args()
    rec = Recorder(DOC_TABLES, args.docs)
    rows = []
    for imports in args.imports.split(";"):
        rows.append(one_set(imports, args.park, args.tries))
        print(" | ".join(map(str, rows[-1])), flush=True)
    rec.publish("spare", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
