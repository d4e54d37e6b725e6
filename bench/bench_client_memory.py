"""The agent's memory with a client that stops reading: a trainer writing about 4 MB/s for
60 s, and a real `trainctl attach --json` client that is SIGSTOPped after its hello.

Prints figures; asserts nothing.  Goal: agent RSS under 100 MB all along; the stopped client
is dropped (with a reason) instead of being buffered for.

Usage: .venv/bin/python bench/bench_client_memory.py [--seconds 60] [--mbps 4]
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

import psutil

PY = sys.executable
FLOOD = """
import sys, time
rate, seconds = float(sys.argv[1]) * 1e6, float(sys.argv[2])
line = "epoch=1/1 batch={}/99999999 loss=0.5 " + "x" * 200 + "\\n"
t0, sent, i = time.monotonic(), 0, 0
while time.monotonic() - t0 < seconds:
    chunk = "".join(line.format(i + k) for k in range(200))
    i += 200
    sys.stdout.write(chunk)
    sys.stdout.flush()
    sent += len(chunk)
    ahead = sent / rate - (time.monotonic() - t0)
    if ahead > 0:
        time.sleep(ahead)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--mbps", type=float, default=4.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = dict(os.environ, TRAINCTL_CONFIG_DIR=str(tmp / "config"), TRAINCTL_RUNS_DIR=str(tmp / "runs"))
        (tmp / "flood.py").write_text(FLOOD)
        run_dir = tmp / "run"
        agent = subprocess.Popen(
            [
                PY,
                "-m",
                "trainctl",
                "run",
                "--json",
                "--run-dir",
                str(run_dir),
                "--",
                PY,
                str(tmp / "flood.py"),
                str(a.mbps),
                str(a.seconds),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        while not (run_dir / "agent.sock").exists():
            time.sleep(0.1)
        client = subprocess.Popen(
            [PY, "-m", "trainctl", "attach", "--json", str(run_dir)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        time.sleep(2.0)
        client.send_signal(signal.SIGSTOP)
        ps, rss, t0 = psutil.Process(agent.pid), [], time.monotonic()
        while agent.poll() is None:
            try:
                rss.append(ps.memory_info().rss)
            except psutil.Error:
                break
            time.sleep(0.5)
        client.send_signal(signal.SIGCONT)
        out, _ = client.communicate(timeout=60)
        written = (run_dir / "train.log").stat().st_size
        lines = out.decode(errors="replace").splitlines()
        print(
            f"trainer wrote {written / 1e6:.0f} MB in {time.monotonic() - t0:.0f} s "
            f"({written / 1e6 / a.seconds:.1f} MB/s asked {a.mbps:g})"
        )
        print(
            f"agent RSS: start {rss[0] / 2**20:.0f} MiB, peak {max(rss) / 2**20:.0f} MiB, "
            f"end {rss[-1] / 2**20:.0f} MiB (goal < 100 MiB)"
        )
        print(
            f"stopped client: {len(lines)} lines when resumed; exit {client.returncode}; "
            f"last: {lines[-1][:120] if lines else '-'}"
        )
        events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
        print(f"agent: exit {agent.returncode}, final state {events[-1].get('state')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
