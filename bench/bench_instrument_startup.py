"""What the zero-code bootstrap costs a Python trainer that imports none of the integrated
libraries (prints figures; asserts nothing).

Usage: .venv/bin/python bench/bench_instrument_startup.py [--runs 40] [--python PYTHON]

Starts ``PYTHON -c pass`` and ``PYTHON -c "import json"`` ``--runs`` times each, alternating
plain and instrumented (the bootstrap first on PYTHONPATH, its settings in
TRAINCTL_INSTRUMENT, as the agent gives them), and prints the median and the spread of the
wall time and of the CPU time (user + system: less disturbed by other load) of each, and
the differences.  Interpreter start-up is noisy on a loaded machine:
compare the medians, and run it again.  With PYTHONDONTWRITEBYTECODE set (and no
``bootstrap/__pycache__``) the bootstrap is compiled at each start: a few ms more.

Measured (2 loaded cores, bytecode cached, Python 3.11): ``-c pass`` +2.4 ms CPU (of 26),
``-c "import json"`` +0.6 ms (the bootstrap's own cost is mostly importing json).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainctl.agent.zero_code import instrument_env


def cost(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU: user + system) seconds of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as run_dir:
        plain = {k: v for k, v in os.environ.items() if not k.startswith("TRAINCTL_")}
        instrumented = instrument_env(plain, Path(run_dir))
        for code in ("pass", "import json"):
            argv = [args.python, "-c", code]
            runs: dict[str, list[tuple[float, float]]] = {"plain": [], "instrumented": []}
            for _ in range(args.runs):
                runs["plain"].append(cost(argv, plain))
                runs["instrumented"].append(cost(argv, instrumented))
            for i, what in enumerate(("wall", "CPU")):
                med = {k: statistics.median(r[i] for r in v) * 1000 for k, v in runs.items()}
                for k, v in runs.items():
                    q = statistics.quantiles([r[i] * 1000 for r in v], n=4)
                    print(
                        f"python -c {code!r:14} {what:4} {k:13} median {med[k]:6.1f} ms "
                        f"(quartiles {q[0]:.1f}-{q[2]:.1f} ms)"
                    )
                print(
                    f"python -c {code!r:14} {what:4} bootstrap cost: {med['instrumented'] - med['plain']:+.1f} ms (median)"
                )


if __name__ == "__main__":
    main()
