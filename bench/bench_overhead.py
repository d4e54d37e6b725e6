"""The supervisor's own cost: agent CPU per trainer line, training throughput bare vs supervised.

Prints figures; asserts nothing.  Goals: the agent <= 1 % of one core at 50 lines/s;
training under `trainctl run --headless` <= 2 % slower than bare.

Usage: .venv/bin/python bench/bench_overhead.py [--seconds S] [--repeats N] [--rates R,R,..]
       [--burst N] [--train-seconds S] [--train-repeats N] [--loop-batches N] [--threads N]
       [--skip-cpu] [--skip-throughput] [--keep]

1. Agent CPU.  Each run is a real `python -m trainctl run --headless --run-dir TMP --
   python bench_overhead.py _gen KIND RATE SECONDS STATUS`: a generator (started as this
   file with a hidden first argument) that writes lines at a fixed rate, one write + flush
   each, then stays quiet for a moment and exits.  KIND is `ul84` (Ultralytics 8.4 progress
   frames: "\\r\\x1b[K" + frame, no newline until the epoch ends, an "Epoch GPU_mem ..."
   header line per epoch, like tests/data/logs/ultralytics84_cpu.log) or `kv` (plain
   "epoch=1/3 batch=5/100 loss=0.1234" lines, like tests/helpers/scripts/train_loop.py).
   While the agent runs, this script polls psutil.Process(agent).cpu_times() (user + system
   of the trainctl process itself, all its threads; not its children: the trainer's CPU and
   the dmesg follower's are not in it) every 0.1 s; the generator records on CLOCK_MONOTONIC
   when it wrote its first and last line and how many lines it had written every 0.25 s.
   The figures come from the steady window [first line + 1 s, last line]: agent CPU seconds
   in it (interpolated between polls; the kernel counts CPU in 10 ms ticks) / lines written
   in it.  "% core" is that CPU / the window's wall time.  "marginal" subtracts the agent's
   CPU rate with an idle trainer (0 lines/s: the 1 s ticks, process sampling, ...), so it is
   the cost of the lines alone.  When the agent cannot keep up, the pipe fills and the
   generator blocks: "achieved" then falls short of the rate asked for.  Also printed: the
   agent's CPU from its start to the first line (interpreter + imports + setup) and its
   total CPU at the last poll before it exited.  With --burst N one more row writes
   key=value lines at 50/s N at a time (back to back, each flushed): the same lines in
   fewer reads, which shows how much of the cost is per wake-up of the agent rather than
   per line.  Each
   configuration runs --repeats times; the table shows medians.  Agent CPU time hardly
   depends on what else the machine runs (the calibration line says how fast this core is).

2. Throughput.  A real PyTorch training loop (`python bench_overhead.py _train ...`) run
   three ways: bare with its stdout to a file (`python train.py > train.log`), bare through
   a pipe to a reader that does nothing (`python train.py | cat > /dev/null`: what any
   pipe reader costs the trainer, tee or a terminal alike) and under
   `trainctl run --headless`; in alternating rounds (file, pipe, agent, then agent, pipe,
   file, ...).
   Workloads: `mlp` (compute-bound: a 3-layer MLP on 1 torch thread, DataLoader with 0
   workers, one key=value line per batch, a few dozen batches/s, which is what real training
   prints) and `train_loop` (tests/helpers/scripts/train_loop.py --workers 0 --batch-time 0,
   run in-process by the same wrapper: a tiny model, so it prints thousands of lines/s;
   the worst case for the agent).  The trainer times itself (perf_counter around the
   training loop, after imports and warm-up), so the agent's start-up is not counted;
   batches/s is wall time (throughput is what the user waits for), so it is sensitive to
   load on a shared machine: read the medians and the spread; the trainer's own CPU ms per
   batch (process_time) is printed beside it as a load-insensitive check.

3. Start-up.  The time from the command's start to the trainer's first statement and to its
   first batch, for the same small trainer (`python bench_overhead.py _first STATUS`: it
   notes CLOCK_MONOTONIC at its first statement, imports torch, trains one batch of a small
   MLP, notes the time again, prints one key=value line and exits), started bare
   (`python train.py`), under `trainctl run --json` (the agent in the CLI's process) and
   `trainctl run --detach` (the agent in a tmux session of a private server, as a user's
   `trainctl run` starts it; the CLI returns once the agent answers) and
   `--detach --no-tmux` (a detached process); --startup-repeats alternating rounds, medians
   and the spread.  "+ s" is the median over the bare start, per point: what trainctl adds
   before the trainer runs (the agent's interpreter, imports and set-up) and while it starts
   (what the agent does meanwhile on the same cores).  "returned" is when the command gave
   back the prompt (`--json`: after the run ended; `--detach`: once the agent answered).
   With --compare-src DIR each trainctl start also runs with trainctl imported from DIR (an
   older tree's src/, e.g. `git archive COMMIT src | tar -x -C DIR/..`), in the same rounds:
   before and after at the same load.  Bytecode is cached in every part (PYTHONDONTWRITEBYTECODE
   is dropped from the environment; the first run compiles).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
THIS = Path(__file__).resolve()
TRAIN_LOOP_DIR = ROOT / "tests" / "helpers" / "scripts"
PY = sys.executable
POLL_S = 0.1
SKIP_S = 1.0  # the steady window starts this long after the first line
QUIET_S = 0.5  # the generator's silence after its last line (the agent drains the pipe)


# ====================================================================== trainer side
def _gen_main(argv: list[str]) -> int:
    """`_gen KIND RATE SECONDS STATUS [BURST]`: write lines at RATE/s for SECONDS (BURST lines
    back to back at a time, each flushed), then record when."""
    kind, rate, seconds, status = argv[0], float(argv[1]), float(argv[2]), argv[3]
    burst = int(argv[4]) if len(argv) > 4 else 1
    out = sys.stdout
    write, flush = out.write, out.flush
    batches = 500  # per epoch (ul84 and kv alike)
    n = 0
    marks: list[tuple[float, int]] = []

    def line(i: int) -> str:
        epoch, b = 1 + i // batches, i % batches + 1
        if kind == "kv":
            return f"epoch={epoch}/1000 batch={b}/{batches} loss={0.9 / (1 + i / 1000):.4f}\n"
        # Ultralytics 8.4: a header line per epoch, then \r\x1b[K frames, a newline at the end.
        head = (
            "\n      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size\n"
            if b == 1
            else ""
        )
        pct = b * 100 // batches
        fill = b * 12 // batches
        bar = "━" * fill + "─" * (12 - fill)
        frame = (
            f"\r\x1b[K{f'{epoch}/1000':>11}{'0G':>11}{1.2 - i % 7 / 100:11.4g}{0.9 + i % 5 / 100:11.4g}"
            f"{1.05:11.4g}{7 + i % 9:11d}{640:11d}: {pct}% {bar} {b}/{batches} "
            f"{rate / 10:.1f}it/s {i / rate:.1f}s<{(batches - b) / rate:.1f}s"
        )
        return head + frame + ("\n" if b == batches else "")

    if rate > 0:
        t0 = time.monotonic()
        marks.append((t0, 0))
        next_mark = t0 + 0.25
        while True:
            now = time.monotonic()
            if now - t0 >= seconds:
                break
            due = min((int((now - t0) * rate) // burst + 1) * burst, int(seconds * rate))
            while n < due:
                write(line(n))
                flush()
                n += 1
            if now >= next_mark:
                marks.append((time.monotonic(), n))
                next_mark += 0.25
            time.sleep(max(0.0005, min(t0 + n / rate - time.monotonic(), 0.05)))
        t1 = time.monotonic()
    else:
        t0 = time.monotonic()
        marks.append((t0, 0))
        time.sleep(seconds)
        t1 = time.monotonic()
    marks.append((t1, n))
    if kind == "ul84":
        write("\n")
        flush()
    time.sleep(QUIET_S)
    Path(status).write_text(json.dumps({"t0": t0, "t1": t1, "n": n, "marks": marks}))
    return 0


def _first_main(argv: list[str]) -> int:
    """`_first STATUS`: the start-up trainer (part 3): its first statement, then one batch."""
    t_exec = time.monotonic()
    import torch

    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    t_batch = time.monotonic()
    print(f"epoch=1/1 batch=1/1 loss={loss.item():.4f}", flush=True)
    Path(argv[0]).write_text(json.dumps({"exec": t_exec, "batch": t_batch}))
    return 0


def _train_main(argv: list[str]) -> int:
    """`_train STATUS mlp SECONDS THREADS` or `_train STATUS train_loop ARGS...`."""
    status, workload = argv[0], argv[1]
    import torch

    if workload == "train_loop":
        sys.path.insert(0, str(TRAIN_LOOP_DIR))
        import train_loop

        loop_argv = argv[2:]
        batches = next(int(loop_argv[i + 1]) for i, a in enumerate(loop_argv) if a == "--batches")
        epochs = next(int(loop_argv[i + 1]) for i, a in enumerate(loop_argv) if a == "--epochs")
        w0, c0 = time.perf_counter(), time.process_time()
        rc = train_loop.main(loop_argv)
        wall, cpu, n = time.perf_counter() - w0, time.process_time() - c0, batches * epochs
    else:
        from torch.utils.data import DataLoader, TensorDataset

        seconds, threads = float(argv[2]), int(argv[3])
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(8192, 512), torch.randint(0, 10, (8192,)))
        loader = DataLoader(data, batch_size=128, shuffle=True, num_workers=0)
        model = torch.nn.Sequential(
            torch.nn.Linear(512, 1024),
            torch.nn.ReLU(),
            torch.nn.Linear(1024, 1024),
            torch.nn.ReLU(),
            torch.nn.Linear(1024, 10),
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        per_epoch = len(loader)
        warmup, n, epoch, rc = 10, 0, 0, 0
        w0 = c0 = None
        deadline = None
        while deadline is None or time.perf_counter() < deadline:
            epoch += 1
            for b, (x, y) in enumerate(loader, start=1):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                print(f"epoch={epoch}/1000 batch={b}/{per_epoch} loss={loss.item():.4f}", flush=True)
                n += 1
                if deadline is None and n == warmup:
                    w0, c0 = time.perf_counter(), time.process_time()
                    deadline = w0 + seconds
                    n = 0
                elif deadline is not None and time.perf_counter() >= deadline:
                    break
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    Path(status).write_text(json.dumps({"batches": n, "wall": wall, "cpu": cpu, "end": time.monotonic()}))
    return rc


# ====================================================================== bench side
def _kill_tree(procs: dict[int, psutil.Process], root: subprocess.Popen | None) -> None:
    """SIGKILL what is left of the processes we saw (each in its own session/group)."""
    for p in procs.values():
        with contextlib.suppress(psutil.Error, OSError):
            if p.is_running():
                with contextlib.suppress(OSError):
                    os.killpg(os.getpgid(p.pid), signal.SIGKILL)
                p.kill()
    if root is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            root.wait(10)
    psutil.wait_procs([p for p in procs.values()], timeout=5)


class Run:
    """One process (a trainctl agent or a bare trainer) in its own session, polled for CPU
    until it exits; finish() stops it (SIGINT first: the agent then stops its whole tree)."""

    def __init__(self, argv: list[str], env: dict[str, str], stdout: Path, via_cat: bool = False) -> None:
        self._out = open(stdout, "wb")  # noqa: SIM115 (closed by finish())
        self.cat: subprocess.Popen | None = None
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if via_cat else self._out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(ROOT),
            start_new_session=True,
        )
        if via_cat:  # `python train.py | cat > /dev/null`: a pipe with a reader that does nothing
            self.cat = subprocess.Popen(
                ["cat"], stdin=self.proc.stdout, stdout=subprocess.DEVNULL, start_new_session=True
            )
            self.proc.stdout.close()
        self.ps = psutil.Process(self.proc.pid)
        self.samples: list[tuple[float, float]] = []  # (monotonic, user + system of the process)
        self.seen: dict[int, psutil.Process] = {self.proc.pid: self.ps}
        self.helper_cpu: dict[int, float] = {}  # children that are not a trainer

    def _poll_children(self) -> None:
        try:
            for c in self.ps.children(recursive=True):
                p = self.seen.setdefault(c.pid, c)
                with contextlib.suppress(psutil.Error):
                    cmd = p.cmdline()
                    if cmd[1:2] != [str(THIS)]:  # not the generator itself (the holder is a helper)
                        t = p.cpu_times()
                        self.helper_cpu[p.pid] = t.user + t.system
        except psutil.Error:
            pass

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        k = 0
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.proc.args[:4]}... still running after {timeout:.0f} s")
            with contextlib.suppress(psutil.Error):
                t = self.ps.cpu_times()
                self.samples.append((time.monotonic(), t.user + t.system))
            if k % 10 == 0:
                self._poll_children()
            k += 1
            time.sleep(POLL_S)
        return self.proc.returncode

    def cpu_at(self, t: float) -> float:
        """The process's CPU seconds at monotonic time ``t`` (linear between polls)."""
        ts = [s[0] for s in self.samples]
        i = bisect.bisect_left(ts, t)
        if i == 0:
            return self.samples[0][1]
        if i >= len(ts):
            return self.samples[-1][1]
        (ta, ca), (tb, cb) = self.samples[i - 1], self.samples[i]
        return ca + (cb - ca) * (t - ta) / (tb - ta) if tb > ta else cb

    def finish(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(15)
        self._poll_children()
        _kill_tree(self.seen, self.proc)
        if self.cat is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.cat.wait(5)  # EOF once the trainer is gone
            if self.cat.poll() is None:
                self.cat.kill()
                self.cat.wait()
        self._out.close()


def bench_env(tmp: Path) -> dict[str, str]:
    env = dict(
        os.environ,
        TRAINCTL_CONFIG_DIR=str(tmp / "config"),
        TRAINCTL_RUNS_DIR=str(tmp / "runs"),
        PYTHONUNBUFFERED="1",
    )
    env.pop("GITHUB_ACTIONS", None)
    # bytecode cached, as an installed package's (pip compiles at install): a start that
    # compiles every module of trainctl and torch is no user's
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def supervised(tmp: Path, tag: str, command: list[str], env: dict[str, str]) -> list[str]:
    return [
        PY,
        "-m",
        "trainctl",
        "run",
        "--headless",
        "--run-dir",
        str(tmp / f"run-{tag}"),
        "--name",
        tag.split("-")[0],
        "--",
        *command,
    ]


# ---------------------------------------------------------------------- 1. agent CPU
def _lines_at(marks: list[list[float]], t: float) -> float:
    ts = [m[0] for m in marks]
    i = bisect.bisect_left(ts, t)
    if i == 0:
        return marks[0][1]
    if i >= len(ts):
        return marks[-1][1]
    (ta, na), (tb, nb) = marks[i - 1], marks[i]
    return na + (nb - na) * (t - ta) / (tb - ta) if tb > ta else nb


def cpu_run(
    tmp: Path, env: dict[str, str], kind: str, rate: float, seconds: float, tag: str, burst: int = 1
) -> dict:
    status = tmp / f"{tag}.json"
    gen = [PY, str(THIS), "_gen", kind, str(rate), str(seconds), str(status), str(burst)]
    run = Run(supervised(tmp, tag, gen, env), env, tmp / f"{tag}.out")
    try:
        rc = run.wait(seconds + 60)
    finally:
        run.finish()
    if rc != 0 or not status.exists():
        raise RuntimeError(f"agent run {tag} failed (exit {rc}); see {tmp / f'{tag}.out'}")
    st = json.loads(status.read_text())
    w0, w1 = st["t0"] + SKIP_S, st["t1"]
    lines = _lines_at(st["marks"], w1) - _lines_at(st["marks"], w0)
    cpu = run.cpu_at(w1) - run.cpu_at(w0)
    progress = 0
    with contextlib.suppress(OSError):
        for line in (tmp / f"run-{tag}" / "events.jsonl").read_text().splitlines():
            progress += '"type":"progress"' in line
    return {
        "wall": w1 - w0,
        "lines": lines,
        "cpu": cpu,
        "startup": run.cpu_at(st["t0"]),
        "total": run.samples[-1][1] if run.samples else float("nan"),
        "n": st["n"],
        "achieved": lines / (w1 - w0),
        "helpers": sum(run.helper_cpu.values()),
        "progress": progress,
    }


def _med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def bench_cpu(tmp: Path, env: dict[str, str], a: argparse.Namespace) -> None:
    print(
        f"\n1. agent CPU (psutil cpu_times of the trainctl process, user+sys, polled every {POLL_S:g} s; "
        f"window = first line + {SKIP_S:g} s .. last line; median of {a.repeats} run(s) each)"
    )
    slow = 2 * a.seconds  # a longer window where there is little CPU to count
    idle = [cpu_run(tmp, env, "kv", 0, slow + SKIP_S, f"idle-{r}") for r in range(a.repeats)]
    idle_pct = statistics.median(r["cpu"] / r["wall"] for r in idle)
    rows = [("idle trainer (no output)", 0, idle)]
    for kind, label in (("kv", "key=value lines"), ("ul84", "Ultralytics 8.4 frames")):
        for rate in a.rates:
            secs = (slow if rate <= 100 else a.seconds) + SKIP_S
            rows.append(
                (
                    label,
                    rate,
                    [cpu_run(tmp, env, kind, rate, secs, f"{kind}{rate:g}-{r}") for r in range(a.repeats)],
                )
            )
    if a.burst > 1:
        rows.append(
            (
                f"key=value, {a.burst} per write",
                50,
                [
                    cpu_run(tmp, env, "kv", 50, slow + SKIP_S, f"kvburst-{r}", a.burst)
                    for r in range(a.repeats)
                ],
            )
        )
    print(
        f"{'trainer output':26s} {'asked/s':>8s} {'achieved/s':>10s} {'lines':>8s} {'agent CPU':>10s} "
        f"{'% core':>7s} {'ms CPU/1000 lines':>18s} {'marginal':>9s}"
    )
    at50: dict[str, float] = {}
    for label, rate, runs in rows:
        pct = statistics.median(100 * r["cpu"] / r["wall"] for r in runs)
        if rate:
            per = statistics.median(1000 * 1000 * r["cpu"] / r["lines"] for r in runs)
            marg = statistics.median(
                1000 * 1000 * (r["cpu"] - idle_pct * r["wall"]) / r["lines"] for r in runs
            )
            per_s, marg_s = f"{per:18.1f}", f"{marg:9.1f}"
            if any(r["progress"] == 0 for r in runs):
                label += " (NOT PARSED as progress!)"
        else:
            per_s, marg_s = f"{'-':>18s}", f"{'-':>9s}"
        if rate == 50 and "per write" not in label:
            at50[label] = pct
        print(
            f"{label:26s} {rate:8,.0f} {_med(runs, 'achieved'):10,.0f} {_med(runs, 'lines'):8,.0f} "
            f"{_med(runs, 'cpu'):9.3f}s {pct:6.2f}% {per_s} {marg_s}"
        )
    every = [r for _, _, runs in rows for r in runs]
    print(
        f"agent start-up to the first line: {statistics.median(r['startup'] for r in every):.2f} s CPU "
        f"(median); whole run, last poll before exit: {min(r['total'] for r in every):.2f} .. "
        f"{max(r['total'] for r in every):.2f} s CPU"
    )
    print(
        f"agent helper processes (kernel-log follower, ...), CPU per run: "
        f"{statistics.median(r['helpers'] for r in every):.3f} s median (not in the figures above)"
    )
    short = [
        f"{label} ({rate:,.0f}/s asked, {statistics.median(r['achieved'] for r in runs):,.0f}/s achieved)"
        for label, rate, runs in rows
        if rate and "per write" not in label and statistics.median(r["achieved"] for r in runs) < 0.97 * rate
    ]
    if short:
        print("the agent could not keep up (the pipe filled, the trainer blocked): " + "; ".join(short))
    if at50:
        worst = max(at50.values())
        print(
            f"goal: <= 1 % of one core at 50 lines/s -> {'met' if worst <= 1 else 'NOT met'} "
            f"({', '.join(f'{k}: {v:.2f} %' for k, v in at50.items())})"
        )


# ---------------------------------------------------------------------- 2. throughput
def train_run(tmp: Path, env: dict[str, str], cmd: list[str], tag: str, mode: str, timeout: float) -> dict:
    """One timed training run; ``mode``: file (bare, stdout to a file), pipe (bare, stdout
    through a pipe to `cat > /dev/null`) or agent (under `trainctl run --headless`)."""
    status = tmp / f"{tag}.json"
    argv = [PY, str(THIS), "_train", str(status), *cmd]
    run = Run(
        supervised(tmp, tag, argv, env) if mode == "agent" else argv,
        env,
        tmp / f"{tag}.out",
        via_cat=mode == "pipe",
    )
    try:
        rc = run.wait(timeout)
    finally:
        run.finish()
    if rc != 0 or not status.exists():
        raise RuntimeError(f"training run {tag} failed (exit {rc}); see {tmp / f'{tag}.out'}")
    st = json.loads(status.read_text())
    agent_pct = float("nan")
    if mode == "agent" and len(run.samples) > 2:  # the agent's CPU over the trainer's timed loop
        end = st["end"]
        agent_pct = 100 * (run.cpu_at(end) - run.cpu_at(end - st["wall"])) / st["wall"]
    return {
        "rate": st["batches"] / st["wall"],
        "cpu_ms": 1000 * st["cpu"] / st["batches"],
        "agent_pct": agent_pct,
        "batches": st["batches"],
    }


MODES = ("file", "pipe", "agent")


def bench_throughput(tmp: Path, env: dict[str, str], a: argparse.Namespace) -> None:
    print(
        f"\n2. training throughput: bare with stdout to a file (`> train.log`), bare through a pipe "
        f"(`| cat > /dev/null`) and under `trainctl run --headless`; {a.train_repeats} alternating rounds "
        f"(file, pipe, agent / agent, pipe, file, ...); the trainer times itself; medians"
    )
    workloads = [
        (
            "mlp",
            f"MLP 512-1024-1024-10, batch 128, {a.threads} torch thread(s)",
            ["mlp", str(a.train_seconds), str(a.threads)],
        ),
        (
            "loop",
            f"train_loop.py --workers 0 --batch-time 0, {a.loop_batches:,} batches",
            [
                "train_loop",
                "--workers",
                "0",
                "--batch-time",
                "0",
                "--epochs",
                "1",
                "--batches",
                str(a.loop_batches),
            ],
        ),
    ]
    print(
        f"{'workload':52s} {'it/s file':>10s} {'pipe':>9s} {'agent':>9s} {'agent/file':>11s} "
        f"{'agent/pipe':>10s}  {'trainer CPU ms/it file/pipe/agent':>33s} {'agent %core':>11s}"
    )
    verdicts = []
    for key, label, cmd in workloads:
        res: dict[str, list[dict]] = {m: [] for m in MODES}
        for r in range(a.train_repeats):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                res[mode].append(
                    train_run(tmp, env, cmd, f"{key}-{mode}-{r}", mode, a.train_seconds * 20 + 120)
                )
        rate = {m: statistics.median(x["rate"] for x in res[m]) for m in MODES}
        cpu = {m: statistics.median(x["cpu_ms"] for x in res[m]) for m in MODES}
        pairs = [s_["rate"] / b_["rate"] for s_, b_ in zip(res["agent"], res["file"])]
        best = max(x["rate"] for x in res["agent"]) / max(x["rate"] for x in res["file"])
        vs_file, vs_pipe = rate["agent"] / rate["file"], rate["agent"] / rate["pipe"]
        spread = (
            100 * (max(x["rate"] for x in res["file"]) - min(x["rate"] for x in res["file"])) / rate["file"]
        )
        verdicts.append(
            (
                key,
                100 * (1 - vs_file),
                100 * (1 - statistics.median(pairs)),
                100 * (1 - best),
                100 * (1 - vs_pipe),
                spread,
            )
        )
        print(
            f"{label:52s} {rate['file']:10,.1f} {rate['pipe']:9,.1f} {rate['agent']:9,.1f} {vs_file:11.3f} "
            f"{vs_pipe:10.3f}  {cpu['file']:13.3f} / {cpu['pipe']:.3f} / {cpu['agent']:<6.3f} "
            f"{statistics.median(x['agent_pct'] for x in res['agent']):10.1f}%"
        )
        print(
            "    runs it/s: "
            + "; ".join(f"{m} {', '.join(format(x['rate'], ',.1f') for x in res[m])}" for m in MODES)
            + f"; agent/file per round {', '.join(f'{r:.3f}' for r in pairs)}, best-of {best:.3f}"
        )
    print(
        "(it/s = batches/s = the trainer's lines/s, wall time; agent/file = the throughput ratio, "
        "1 - ratio = the slowdown)"
    )
    print(
        "goal: <= 2 % slower than bare -> "
        + "; ".join(
            f"{key}: {'met' if s <= 2 else 'NOT met'} ({s:.1f} % by medians, {sp:.1f} % median of rounds, "
            f"{sb:.1f} % best-of; {spipe:.1f} % vs the bare pipe; the bare runs alone vary by {spread:.1f} %)"
            for key, s, sp, sb, spipe, spread in verdicts
        )
    )


# ---------------------------------------------------------------------- 3. start-up
STARTS = ("bare", "run --json", "run --detach (tmux)", "run --detach --no-tmux")


def _wait_gone(run_dir: Path, timeout: float = 60) -> None:
    """Until the run's agent has let go of its lock (the run ended, its agent exited)."""
    import fcntl

    deadline = time.monotonic() + timeout
    lock = run_dir / "agent.lock"
    while time.monotonic() < deadline:
        try:
            with open(lock, "rb") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
        except FileNotFoundError:
            pass
        except BlockingIOError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"the agent of {run_dir} still runs after {timeout:.0f} s")


def start_run(tmp: Path, env: dict[str, str], how: str, tag: str, src: str | None = None) -> dict:
    """One start (part 3): seconds from the command's start to the trainer's first statement,
    its first batch, and the command's return."""
    status = tmp / f"{tag}.json"
    trainer = [PY, str(THIS), "_first", str(status)]
    run_dir = tmp / f"run-{tag}"
    if src is not None:  # trainctl from another tree (the trainer imports none of it)
        env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")])))
    if how == "bare":
        argv = trainer
    else:
        argv = [PY, "-m", "trainctl", "run", "--run-dir", str(run_dir), "--name", tag.split("-")[0]]
        argv += {"run --json": ["--json"], "run --detach (tmux)": ["--detach"]}.get(
            how, ["--detach", "--no-tmux"]
        )
        argv += ["--", *trainer]
    with open(tmp / f"{tag}.out", "wb") as out:
        t0 = time.monotonic()
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT)
        )
        returned = time.monotonic() - t0
    deadline = time.monotonic() + 60
    while not status.exists() or not status.read_text():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{how}: no trainer status; see {tmp / f'{tag}.out'}")
        time.sleep(0.05)
    if how != "bare":
        _wait_gone(run_dir)
    if proc.returncode != 0:
        raise RuntimeError(f"{how} exited {proc.returncode}; see {tmp / f'{tag}.out'}")
    st = json.loads(status.read_text())
    return {"exec": st["exec"] - t0, "batch": st["batch"] - t0, "returned": returned}


def bench_startup(tmp: Path, env: dict[str, str], a: argparse.Namespace) -> None:
    print(
        f"\n3. start-up: the command's start -> the trainer's first statement and its first batch "
        f"(import torch, one MLP batch); {a.startup_repeats} alternating rounds; medians [min-max]"
    )
    socket = f"bench-startup-{os.getpid()}"
    env = dict(env, TRAINCTL_TMUX_SOCKET=socket)
    srcs: list[tuple[str, str | None]] = [("", None)]
    if a.compare_src:
        srcs.append((f"{Path(a.compare_src).parent.name}: ", str(Path(a.compare_src).resolve())))
    starts = [("bare", None, "bare")] + [(f"{p}{h}", s, h) for h in STARTS[1:] for p, s in srcs]
    res: dict[str, list[dict]] = {label: [] for label, _, _ in starts}
    try:
        for _, src, how in starts:  # bytecode compiled, files cached
            start_run(tmp, env, how, "warmup", src)
        for r in range(a.startup_repeats):
            for i, (label, src, how) in enumerate(starts if r % 2 == 0 else starts[::-1]):
                res[label].append(start_run(tmp, env, how, f"start{i}-{r}", src))
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)
    print(
        f"{'start':38s} {'first statement s':>22s} {'+ s':>6s} {'first batch s':>22s} {'+ s':>6s} {'returned s':>11s}"
    )
    base = {k: statistics.median(x[k] for x in res["bare"]) for k in ("exec", "batch")}
    for how, _, _ in starts:
        xs = res[how]
        cells = []
        for k in ("exec", "batch"):
            med = statistics.median(x[k] for x in xs)
            spread = f"{med:.2f} [{min(x[k] for x in xs):.2f}-{max(x[k] for x in xs):.2f}]"
            cells.append(f"{spread:>22s} {med - base[k]:+6.2f}")
        print(f"{how:38s} {cells[0]} {cells[1]} {statistics.median(x['returned'] for x in xs):11.2f}")
    worst = max(
        statistics.median(x["batch"] for x in res[h]) - base["batch"]
        for h, src, _ in starts
        if h != "bare" and src is None
    )
    print(
        f"goal: <= +0.3 s to the first batch -> {'met' if worst <= 0.3 else 'NOT met'} (worst {worst:+.2f} s)"
    )


def calibrate() -> None:
    timer = timeit.Timer("sum(range(1000))", timer=time.process_time)
    best = min(timer.repeat(number=2000, repeat=7)) / 2000
    print(
        f"calibration: sum(range(1000)) = {best * 1e6:.1f} us on this core "
        "(about 7-10 us on an idle modern x86 core)"
    )


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_gen":
        return _gen_main(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "_train":
        return _train_main(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "_first":
        return _first_main(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--seconds",
        type=float,
        default=2.5,
        help="steady window per agent-CPU run at >100 lines/s (twice that at <=100 and idle)",
    )
    ap.add_argument("--repeats", type=int, default=2, help="runs per agent-CPU configuration (median)")
    ap.add_argument(
        "--rates",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[50, 1000, 10000],
        help="lines/s to ask of the generator, comma-separated (50,1000,10000)",
    )
    ap.add_argument(
        "--burst",
        type=int,
        default=1,
        help="add a row: key=value at 50 lines/s written N at a time (one agent wake-up per N "
        "lines), e.g. 10; 1 (the default) leaves it out",
    )
    ap.add_argument("--train-seconds", type=float, default=2.0, help="timed training per MLP run")
    ap.add_argument("--train-repeats", type=int, default=3, help="rounds (file, pipe, agent) per workload")
    ap.add_argument("--loop-batches", type=int, default=3000, help="batches per train_loop.py run")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the MLP trainer")
    ap.add_argument("--skip-cpu", action="store_true", help="skip part 1 (agent CPU)")
    ap.add_argument("--skip-throughput", action="store_true", help="skip part 2 (throughput)")
    ap.add_argument("--skip-startup", action="store_true", help="skip part 3 (start-up)")
    ap.add_argument("--startup-repeats", type=int, default=5, help="rounds of part 3 (start-up)")
    ap.add_argument(
        "--compare-src", help="part 3 also with trainctl imported from this src/ directory (before/after)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the run directories and outputs and say where")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmpdir:
        tmp = Path(tempfile.mkdtemp(prefix="bench-overhead-")) if a.keep else Path(tmpdir)
        if a.keep:
            print(f"run directories and outputs under {tmp}")
        env = bench_env(tmp)
        t0 = time.monotonic()
        print(
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; python {sys.version.split()[0]}"
        )
        calibrate()
        if not a.skip_cpu:
            bench_cpu(tmp, env, a)
        if not a.skip_throughput:
            bench_throughput(tmp, env, a)
        if not a.skip_startup:
            bench_startup(tmp, env, a)
        print(f"\n(bench took {time.monotonic() - t0:.0f} s; load average now {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
