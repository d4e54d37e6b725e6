"""Issue 13: no waits without a bound.  A real agent stopped with SIGSTOP: `trainctl status`,
`ctl`, `attach --json` and `bridge` say "agent not responding (pid N, stopped)" once their
own bound for the agent's hello is past (HELLO_TIMEOUT_S, in the line they print) and exit 4
(how long that takes on a busy machine is the benches' to measure, not a clock here); once it is continued, it answers again and a stop ends the run STOPPED (130)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import psutil
import pytest

from tests.e2e.conftest import PYTHON, ROOT, run_trainctl, start_trainctl
from tests.helpers.hangs import STEADY, wait_until
from trainctl.client.connection import HELLO_TIMEOUT_S

pytestmark = pytest.mark.e2e


def _timed(args: list[str], **kw) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run(
        [PYTHON, "-m", "trainctl", *args], capture_output=True, text=True, timeout=30, cwd=str(ROOT), **kw
    )
    return r, time.monotonic() - t0


@pytest.mark.timeout(90)
def test_a_stopped_agent_is_reported_not_waited_on():
    with start_trainctl(
        [
            "run",
            "--json",
            "--",
            PYTHON,
            str(STEADY),
            "--epochs",
            "1",
            "--batches",
            "100000",
            "--batch-time",
            "0.05",
        ]
    ) as tc:
        tc.wait_event(lambda e: e.type == "progress" and (e.batch or 0) >= 3, 30, "progress")
        agent = json.loads((tc.run_dir / "agent.json").read_text())["pid"]
        assert agent == tc.pid  # `run --json` is the agent
        os.kill(agent, signal.SIGSTOP)
        try:
            wait_until(
                lambda: psutil.Process(agent).status() == psutil.STATUS_STOPPED, 5, what="the agent to stop"
            )
            needle = f"agent not responding (pid {agent}, stopped)"
            took = {}
            for name, args, stdin in (
                ("status", ["status", str(tc.run_dir)], None),
                ("ctl", ["ctl", str(tc.run_dir), "stop"], None),
                ("attach", ["attach", str(tc.run_dir), "--json"], None),
                ("bridge", ["bridge", str(tc.run_dir)], '{"op": "hello", "since": 0}\n'),
            ):
                r, took[name] = _timed(args, input=stdin)
                assert r.returncode == 4, (name, r.returncode, r.stdout[-500:], r.stderr[-500:])
                assert needle in r.stderr, (name, r.stderr)
                # ended by its own bound (the run's timeout of 30 s would be a hang)
                assert f"within {HELLO_TIMEOUT_S:g} s" in r.stderr, (name, r.stderr)
            assert "agent not responding" in r.stdout and json.loads(r.stdout)["ok"] is False
            print(f"time to 'agent not responding': {took}")
            status = _timed(["status", str(tc.run_dir), "--json"])[0]
            assert status.returncode == 4 and json.loads(status.stdout)["responding"] is False
        finally:
            os.kill(agent, signal.SIGCONT)
        # It answers again, and the stop that never arrived can be sent now.
        st = run_trainctl(["status", str(tc.run_dir), "--json"], timeout=30)
        assert st.returncode == 0 and json.loads(st.stdout)["live"] is True, st.describe()
        # The bridge relays a live agent as before: its hello first, then the journal.
        bridge = subprocess.Popen(
            [PYTHON, "-m", "trainctl", "bridge", str(tc.run_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=str(ROOT),
        )
        try:
            bridge.stdin.write(b'{"op": "hello", "since": 0}\n')
            bridge.stdin.flush()
            lines = [json.loads(bridge.stdout.readline()) for _ in range(3)]
        finally:
            bridge.kill()
            bridge.communicate()
        assert lines[0]["op"] == "hello" and lines[0]["live"] is True, lines
        assert [e.get("seq") for e in lines[1:]] == [0, 1], lines
        assert run_trainctl(["ctl", str(tc.run_dir), "stop"], timeout=30).returncode == 0
        r = tc.wait(30)
    assert r.returncode == 130, r.describe()
    assert r.events[-1].type == "state" and r.events[-1].state == "STOPPED", r.describe()
    assert not [e for e in r.events if e.type == "stall"], "the agent's own stop is no stall"
