"""Containment (issue 14): a trainer that double-forks a `setsid` daemon leaves nothing
behind after stalls, kills and restarts: the holder is the daemon's subreaper and ends it."""

from __future__ import annotations

import uuid

import psutil
import pytest

from tests.e2e.conftest import PYTHON, start_trainctl
from tests.helpers.hangs import wait_until

pytestmark = pytest.mark.e2e

DAEMONIZING = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        while True:          # the daemon: keeps the trainer's stdout open, lives forever
            time.sleep(0.2)
    os._exit(0)
print("epoch=1/1 batch=1/100 loss=1.0", flush=True)
time.sleep(3600)
"""


def marked(marker: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if marker in " ".join(p.info["cmdline"] or []):
            out.append(p)
    return out


@pytest.mark.timeout(120)
def test_daemons_of_every_attempt_are_gone_after_restarts_and_the_end(tmp_path):
    marker = f"daemonizing-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "daemonizing.py"
    script.write_text(DAEMONIZING)
    with start_trainctl(
        ["run", "--json", "--stall-timeout", "2", "--max-restarts", "2", "--", PYTHON, str(script), marker]
    ) as tc:
        tc.wait_event(lambda e: e.type == "start" and e.attempt == 2, 60, "the second attempt")
        r = tc.wait(90)
    assert r.returncode == 1, r.describe()  # every attempt hangs: the budget runs out
    assert len(r.of_type("start")) >= 2
    try:
        wait_until(lambda: not marked(marker), 15, what="no daemon left")
    except TimeoutError:
        pytest.fail(f"left behind: {[p.info['cmdline'] for p in marked(marker)]}")


PROPER_DAEMON = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:         # a proper daemon: std fds to /dev/null, out of the tree
        fd = os.open(os.devnull, os.O_RDWR)
        for n in (0, 1, 2):
            os.dup2(fd, n)
        while True:
            time.sleep(0.2)
    os._exit(0)
i = 0
while True:
    i += 1
    print(f"epoch=1/1 batch={i}/100000 loss=1.0", flush=True)
    time.sleep(0.05)
"""


def _command(sock_path, name: str) -> dict:
    import json
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(sock_path))
    f = s.makefile("rwb")
    f.write(json.dumps({"op": "hello", "since": 10**9}).encode() + b"\n")
    f.write(json.dumps({"op": "cmd", "id": 1, "cmd": name, "args": {}}).encode() + b"\n")
    f.flush()
    for line in f:
        msg = json.loads(line)
        if msg.get("op") == "reply":
            s.close()
            return msg
    raise AssertionError("no reply")


@pytest.mark.timeout(120)
def test_twenty_restarts_of_a_daemonizing_trainer_leave_nothing(tmp_path):
    marker = f"proper-daemon-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "proper_daemon.py"
    script.write_text(PROPER_DAEMON)
    with start_trainctl(["run", "--json", "--", PYTHON, str(script), marker]) as tc:
        for attempt in range(1, 21):
            start = tc.wait_event(
                lambda e, a=attempt: e.type == "start" and e.attempt == a, 30, f"attempt {attempt}"
            )
            tc.wait_event(
                lambda e, s=start.seq: e.type == "progress" and e.seq > s,
                30,
                f"progress of attempt {attempt}",
            )
            assert _command(tc.run_dir / "agent.sock", "restart")["ok"]
        tc.wait_event(lambda e: e.type == "start" and e.attempt == 21, 30, "attempt 21")
        assert _command(tc.run_dir / "agent.sock", "stop")["ok"]
        r = tc.wait(30)
    assert r.returncode == 130 and len(r.of_type("start")) == 21
    try:
        wait_until(lambda: not marked(marker), 10, what="no daemon left")
    except TimeoutError:
        pytest.fail(f"left behind: {len(marked(marker))} processes")
