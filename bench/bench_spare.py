"""The warm spare by itself: what a parked spare costs, and what it saves at a restart.

    .venv/bin/python bench/bench_spare.py [--park 30] [--imports torch] [--tries 3]

A real spare (src/trainctl/inside/spare.py, started as the agent starts one: ``python -c``
with its FIFO) imports ``--imports``, then parks; over ``--park`` s its CPU time (user +
system, of the process and its threads) is read from /proc through psutil, and its RSS and
PSS.  Then it is released to run a script that imports the same modules and prints the time:
release → the script's first line, against a cold ``python script.py`` doing the same (the
interpreter's start-up and the imports), ``--tries`` times each, medians printed.
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--park", type=float, default=30.0, help="seconds to watch a parked spare")
    p.add_argument("--imports", default="torch", help="comma-separated modules the spare imports")
    p.add_argument("--tries", type=int, default=3)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-spare-"))
    (tmp / "script.py").write_text(SCRIPT.format(imports=args.imports))
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    proc, fd, ready = parked(tmp, args.imports)
    me = psutil.Process(proc.pid)
    c0, t0 = me.cpu_times(), time.monotonic()
    time.sleep(args.park)
    c1, wall = me.cpu_times(), time.monotonic() - t0
    mem = me.memory_full_info()
    cpu = (c1.user + c1.system - c0.user - c0.system) / wall * 100
    os.close(fd)
    proc.wait(30)
    print(
        f"imports ({args.imports}) while parking: {ready['import_s']:.2f} s; GPU context: {ready['cuda_initialized']}"
    )
    print(
        f"parked {wall:.1f} s: CPU {cpu:.3f} % of a core; RSS {mem.rss / 2**20:.0f} MiB, PSS {mem.pss / 2**20:.0f} MiB"
    )
    warm = [released_s(tmp, args.imports) for _ in range(args.tries)]
    cold = [cold_s(tmp) for _ in range(args.tries)]
    print(
        f"release → the script's first line: median {statistics.median(warm):.3f} s ({', '.join(f'{w:.3f}' for w in warm)})"
    )
    print(
        f"cold python script.py → its first line: median {statistics.median(cold):.3f} s ({', '.join(f'{c:.3f}' for c in cold)})"
    )
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
