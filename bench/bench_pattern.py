"""A catastrophic `[progress]` pattern against a real run (issue 27, failure 6): prints
figures; asserts nothing.

The job's pattern is ``'^(?P<batch>\\d*)(a+)+$'`` (nested quantifiers: exponential time for a
backtracking engine on a line of ``a`` ending in ``!``); its trainer prints ``--lines`` such
lines of ``--length`` ``a`` and a ``!``, one every 0.1 s, then ends.  Measured, with a real
`trainctl run --json` (its own agent), in two runs:

1. the run's wall time (the trainer itself takes lines x 0.1 s), and the slowest `trainctl
   status --json` answer while it runs (asked every 0.5 s; exit 4 = "agent not responding");
2. SIGTERM sent to `trainctl run --json` once the trainer has printed 3 lines (the agent is
   matching them): how long until it exits.

Usage: .venv/bin/python bench/bench_pattern.py [--lines 30] [--length 26] [--only-sigterm]
(on a backtracking engine a line of 26 ``a`` costs about 7 s: keep --length <= 24 there)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
PATTERN = r"^(?P<batch>\d*)(a+)+$"


def trainctl(*args: str, env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "trainctl", *args], env=env, **kw)


def printed(run_dir: Path) -> int:
    try:
        return (run_dir / "train.log").read_bytes().count(b"\n")
    except OSError:
        return 0


def one_run(tmp: Path, lines: int, length: int, sigterm: bool) -> dict:
    job = tmp / f"job-{time.monotonic_ns()}"
    job.mkdir()
    (job / "t.py").write_text(
        "import time\n"
        f"for i in range({lines}):\n"
        f"    print('a' * {length} + '!', flush=True)\n"
        "    time.sleep(0.1)\n"
    )
    (job / "trainctl.toml").write_text(
        f'kind = "command"\ncommand = ["{PY}", "t.py"]\n[progress]\npattern = \'{PATTERN}\'\n'
    )
    run_dir = job / "run"
    env = {**os.environ, "TRAINCTL_RUNS_DIR": str(tmp / "runs"), "TRAINCTL_CONFIG_DIR": str(tmp / "config")}
    t0 = time.monotonic()
    proc = trainctl(
        "run",
        "--json",
        "--run-dir",
        str(run_dir),
        str(job / "trainctl.toml"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    slowest, not_responding, termed = 0.0, 0, None
    try:
        while proc.poll() is None:
            if sigterm and termed is None and printed(run_dir) >= 3:
                proc.send_signal(signal.SIGTERM)
                termed = time.monotonic()
            if not sigterm and (run_dir / "agent.sock").exists():
                s0 = time.monotonic()
                r = subprocess.run(
                    [PY, "-m", "trainctl", "status", "--json", str(run_dir)],
                    env=env,
                    capture_output=True,
                    timeout=120,
                )
                slowest = max(slowest, time.monotonic() - s0)
                not_responding += r.returncode == 4
            time.sleep(0.05 if sigterm else 0.5)
            if time.monotonic() - t0 > 600:
                proc.kill()
                break
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    end = time.monotonic()
    states = [json.loads(ln).get("state") for ln in out.splitlines() if '"state"' in ln]
    warned = [json.loads(ln).get("text") for ln in out.splitlines() if "pattern" in ln and '"info"' in ln]
    return {
        "wall_s": end - t0,
        "slowest_status_s": slowest,
        "not_responding": not_responding,
        "after_sigterm_s": None if termed is None else end - termed,
        "rc": proc.returncode,
        "last_state": states[-1] if states else None,
        "said": warned[:1],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=30)
    ap.add_argument("--length", type=int, default=26)
    ap.add_argument("--only-sigterm", action="store_true", help="leave out the first run")
    a = ap.parse_args()
    from trainctl.core.user_pattern import compile_user_pattern

    engine = type(compile_user_pattern(PATTERN).regex).__module__
    print(
        f"pattern {PATTERN!r}, {a.lines} lines of {a.length} 'a' + '!' (trainer alone: "
        f"{a.lines * 0.1:.1f} s); pattern engine: {engine}"
    )
    with tempfile.TemporaryDirectory(prefix="tc-pat-") as tmp:
        if not a.only_sigterm:
            r = one_run(Path(tmp), a.lines, a.length, False)
            print(
                f"run --json: {r['wall_s']:.1f} s, final state {r['last_state']}; slowest status "
                f"{r['slowest_status_s']:.2f} s, 'not responding' {r['not_responding']} times"
            )
        t = one_run(Path(tmp), a.lines, a.length, True)
        if t["after_sigterm_s"] is None:
            print(f"SIGTERM: the run ended before its trainer printed 3 lines ({t['wall_s']:.1f} s)")
        else:
            print(
                f"SIGTERM after 3 lines printed: exited {t['after_sigterm_s']:.1f} s later "
                f"(rc {t['rc']}, final state {t['last_state']})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
