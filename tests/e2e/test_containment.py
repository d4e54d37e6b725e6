"""Containment (issue 14): a trainer that double-forks a `setsid` daemon leaves nothing
behind after stalls, kills and restarts: the holder is the daemon's subreaper and ends it."""
from __future__ import annotations

import time
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
    with start_trainctl(["run", "--json", "--stall-timeout", "2", "--max-restarts", "2",
                         "--", PYTHON, str(script), marker]) as tc:
        tc.wait_event(lambda e: e.type == "start" and e.attempt == 2, 60, "the second attempt")
        r = tc.wait(90)
    assert r.returncode == 1, r.describe()     # every attempt hangs: the budget runs out
    assert len(r.of_type("start")) >= 2
    try:
        wait_until(lambda: not marked(marker), 15, what="no daemon left")
    except TimeoutError:
        pytest.fail(f"left behind: {[p.info['cmdline'] for p in marked(marker)]}")
