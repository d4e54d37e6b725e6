"""A client that stops reading costs the agent a bounded backlog, then is dropped with a
reason and where to catch up from (issue 14: memory per client bounded in bytes)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import PYTHON, run_trainctl, start_trainctl

pytestmark = pytest.mark.e2e

FLOOD = """
import sys, time
line = "x" * 190
t0 = time.monotonic()
i = 0
while time.monotonic() - t0 < float(sys.argv[1]):
    i += 1
    sys.stdout.write(f"epoch=1/1 batch={i}/99999999 loss=0.5 {line}\\n" * 100)
    sys.stdout.flush()
    time.sleep(0.01)
"""


@pytest.mark.timeout(90)
def test_a_client_that_never_reads_is_dropped_and_the_agent_stays_small(tmp_path):
    script = tmp_path / "flood.py"
    script.write_text(FLOOD)
    with start_trainctl(["run", "--json", "--", PYTHON, str(script), "16"]) as tc:
        tc.wait_event("progress", 30)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(str(tc.run_dir / "agent.sock"))
        sock.sendall(json.dumps({"op": "hello", "since": 0}).encode() + b"\n")
        agent = psutil.Process(tc.pid)
        rss = []
        end = time.monotonic() + 14
        while time.monotonic() < end:  # the client reads nothing meanwhile
            rss.append(agent.memory_info().rss)
            time.sleep(0.5)
        data = b""
        sock.settimeout(10)
        while chunk := sock.recv(1 << 20):
            data += chunk
        sock.close()
        r = tc.wait(60)
    assert r.returncode == 0, r.describe()
    last = json.loads(data.splitlines()[-1])
    assert last["op"] == "bye" and ("read nothing" in last["reason"] or "behind" in last["reason"]), last
    assert last["next_seq"] > 0
    assert max(rss) < 150 * 2**20, f"agent RSS peaked at {max(rss) / 2**20:.0f} MiB"
    print(f"agent RSS peak {max(rss) / 2**20:.0f} MiB; the client was dropped: {last['reason']}")


@pytest.mark.timeout(90)
def test_two_hundred_clients_connecting_at_once_all_get_their_hello(tmp_path):
    """The accept backlog holds 200 clients that connect in the same instant (a dashboard
    per user, scripts polling `status`): none fails at connect (issue 27)."""
    import asyncio

    from trainctl.client.connection import AgentClient, UnixTransport

    async def storm(sock_path) -> list[str]:
        async def one() -> str | None:
            client = AgentClient(UnixTransport(sock_path), hello_timeout=30)
            try:
                await client.connect(since=10**12)
                return None
            except Exception as e:  # noqa: BLE001 - counted and shown
                return repr(e)
            finally:
                await client.close()

        results = await asyncio.gather(*(one() for _ in range(200)))
        return [r for r in results if r is not None]

    with start_trainctl(["run", "--json", "--", PYTHON, "-c", "import time; time.sleep(60)"]) as tc:
        tc.wait_event("start", 30)
        agent = psutil.Process(tc.pid)
        agent.suspend()  # the agent accepts nothing meanwhile: all 200 wait in its backlog
        try:
            sock = tc.run_dir / "agent.sock"
            raw = []
            for _ in range(200):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.setblocking(False)
                try:
                    s.connect(str(sock))
                    raw.append(s)
                except OSError as e:
                    raw.append(e)
        finally:
            agent.resume()
        refused = [r for r in raw if isinstance(r, OSError)]
        for s in raw:
            if isinstance(s, socket.socket):
                s.close()
        failed = asyncio.run(storm(sock))
        tc.kill()
    assert not refused, f"{len(refused)} of 200 refused at connect: {refused[:3]}"
    assert not failed, f"{len(failed)} of 200 failed: {failed[:3]}"


FLOOD_SCRIPT = Path(__file__).resolve().parents[1] / "helpers" / "scripts" / "flood.py"


@pytest.mark.timeout(120)
def test_status_answers_while_the_trainer_writes_50_mb_a_second(tmp_path):
    """Issue 27, failure 8: the agent parses output far slower than 50 MB/s, and it used to
    read train.log chunk after chunk without giving its clients a turn: `status` exited 4
    ("no hello within 3 s").  Now each chunk is followed by a turn of the loop."""
    with start_trainctl(["run", "--json", "--", PYTHON, str(FLOOD_SCRIPT), "50", "12"]) as tc:
        tc.wait_event("progress", 30)
        log = tc.run_dir / "train.log"
        size0, t0 = log.stat().st_size, time.monotonic()
        codes = []
        for _ in range(3):
            r = run_trainctl(["status", "--json", str(tc.run_dir)], 60)
            codes.append((r.returncode, r.stderr.strip()[-200:]))
        rate = (log.stat().st_size - size0) / (time.monotonic() - t0)
        tc.kill()
    print(f"trainer wrote {rate / 1e6:.0f} MB/s while status answered: {codes}")
    assert all(code == 0 for code, _ in codes), codes
    assert rate > 10e6, f"the trainer wrote only {rate / 1e6:.0f} MB/s: not a flood"
