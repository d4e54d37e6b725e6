"""A client that stops reading costs the agent a bounded backlog, then is dropped with a
reason and where to catch up from (issue 14: memory per client bounded in bytes)."""
from __future__ import annotations

import json
import socket
import time

import psutil
import pytest

from tests.e2e.conftest import PYTHON, start_trainctl

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
        while time.monotonic() < end:           # the client reads nothing meanwhile
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
