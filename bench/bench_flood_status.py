"""Does the agent answer while its trainer floods its output? (issue 27, failure 8)

    .venv/bin/python bench/bench_flood_status.py [--rates 50,200] [--seconds 20] [--probes 8]

Prints figures; asserts nothing.  For each RATE (MB/s) a real `trainctl run` supervises a
trainer (tests/helpers/scripts/flood.py) that writes RATE MB/s of ~120-byte lines (1 in 50
a progress line) in 256 KiB writes, paced by the clock, for SECONDS.  Once the trainer floods, PROBES times, one after
another:

* hello: connect to agent.sock, send a hello, time until the hello line comes back (the
  client's bound is HELLO_TIMEOUT_S = 3 s), then a ``status`` command, time until its reply;
* `trainctl status --json RUN`: its wall time and exit code (4: "no hello within 3 s").

The trainer's achieved rate is train.log's growth over the window; the agent's backlog is
how far its intake offset (intake.json) trails train.log at the end of the window.

trainctl runs from a scratch directory, so PYTHONPATH may name another tree's `trainctl`
(an older commit's, as links: see tests/unit/test_import_hygiene.py) for a before/after
on the same machine; the holder (`python -I`) is always this venv's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

FLOOD = ROOT / "tests" / "helpers" / "scripts" / "flood.py"


def hello_probe(sock_path: Path) -> tuple[float | None, float | None]:
    """(seconds to the hello, seconds to the status reply); None where none came in 10 s."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    t0 = time.monotonic()
    hello_at = reply_at = None
    try:
        s.connect(str(sock_path))
        s.sendall(b'{"op": "hello", "since": 1000000000000}\n')
        buf = b""
        sent_cmd = False
        while reply_at is None:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                if msg.get("op") == "hello" and hello_at is None:
                    hello_at = time.monotonic() - t0
                    s.sendall(b'{"op": "cmd", "id": 1, "cmd": "status", "args": {}}\n')
                    sent_cmd = True
                elif msg.get("op") == "reply" and sent_cmd:
                    reply_at = time.monotonic() - t0
    except (OSError, ValueError):
        pass
    finally:
        s.close()
    return hello_at, reply_at


def one_rate(rate: float, seconds: float, probes: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run_dir = tmp / "run"
        env = {**os.environ, "XDG_DATA_HOME": str(tmp / "data"), "XDG_CONFIG_HOME": str(tmp / "cfg")}
        agent = subprocess.Popen(
            [
                PY,
                "-m",
                "trainctl",
                "run",
                "--json",
                "--no-tmux",
                "--run-dir",
                str(run_dir),
                "--name",
                f"flood{int(rate)}",
                "--",
                PY,
                str(FLOOD),
                str(rate),
                str(seconds),
            ],
            cwd=tmp,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            log = run_dir / "train.log"
            deadline = time.monotonic() + 30
            while not (log.exists() and log.stat().st_size > (1 << 20)):
                if time.monotonic() > deadline:
                    print(f"{rate:5.0f} MB/s: the trainer never started")
                    return
                time.sleep(0.05)
            size0, t0 = log.stat().st_size, time.monotonic()
            hellos, replies, cli, codes = [], [], [], []
            for _ in range(probes):
                h, r = hello_probe(run_dir / "agent.sock")
                hellos.append(h)
                replies.append(r)
                c0 = time.monotonic()
                p = subprocess.run(
                    [PY, "-m", "trainctl", "status", "--json", str(run_dir)],
                    cwd=tmp,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                cli.append(time.monotonic() - c0)
                codes.append(p.returncode)
                if time.monotonic() - t0 > seconds - 3:
                    break
            window = time.monotonic() - t0
            size1 = log.stat().st_size
            try:
                offset = json.loads((run_dir / "intake.json").read_text()).get("log", 0)
            except (OSError, ValueError):
                offset = 0

            def fig(xs):
                got = [x for x in xs if x is not None]
                if not got:
                    return "none came"
                return f"median {1000 * statistics.median(got):6.0f} ms, max {1000 * max(got):6.0f} ms" + (
                    f", {len(xs) - len(got)} of {len(xs)} never" if len(got) < len(xs) else ""
                )

            print(
                f"{rate:5.0f} MB/s asked, {(size1 - size0) / window / 1e6:5.0f} MB/s written "
                f"({len(hellos)} probes):"
            )
            print(f"    hello            {fig(hellos)}")
            print(f"    status reply     {fig(replies)}")
            print(
                f"    `trainctl status` median {statistics.median(cli):.2f} s, max {max(cli):.2f} s; "
                f"exit codes {codes} ({sum(1 for c in codes if c != 0)} of {len(codes)} not 0)"
            )
            print(
                f"    agent's intake {max(0, size1 - offset) / 1e6:.0f} MB behind train.log "
                f"(its last saved offset)"
            )
        finally:
            try:
                os.killpg(agent.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                agent.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="50,200", help="MB/s, comma-separated")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--probes", type=int, default=8)
    a = ap.parse_args()
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    for rate in (float(r) for r in a.rates.split(",")):
        one_rate(rate, a.seconds, a.probes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
