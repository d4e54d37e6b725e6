"""Every fault leaves a run that can be found and stopped (issue 27): a deleted run
directory, a deleted socket, an agent and holder both killed, two attach racing to adopt.
Real agents, holders and trainers (tests/helpers/scripts/steady.py)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.e2e.conftest import PYTHON, run_trainctl, start_trainctl

pytestmark = pytest.mark.e2e

STEADY = str(Path(__file__).resolve().parents[1] / "helpers" / "scripts" / "steady.py")


def steady(batches: int, batch_time: float = 0.1) -> list[str]:
    return [PYTHON, STEADY, "--epochs", "1", "--batches", str(batches), "--batch-time", str(batch_time)]


def info_keys(events) -> list[str]:
    return [e.key for e in events if e.type == "info"]


@pytest.mark.timeout(120)
def test_the_run_directory_deleted_mid_run_is_made_again_and_the_training_goes_on():
    """It used to end FAILED: the holder's status file gone, its trainer's clean exit read
    as a lost holder (-9), and the restart could not make side-2.jsonl."""
    with start_trainctl(["run", "--json", "--", *steady(40)]) as tc:
        tc.wait_event(lambda e: e.type == "progress" and (e.batch or 0) >= 5, 30, "batch 5")
        shutil.rmtree(tc.run_dir)
        r = tc.wait(90)
    assert r.returncode == 0, r.describe()
    assert r.of_type("state")[-1].state == "FINISHED", r.describe()
    assert len(r.of_type("start")) == 1, "restarted: " + r.describe()
    assert "run_dir.remade" in info_keys(r.events), r.describe()
    assert r.events[0].type == "start" and r.events[0].seq == 0   # the journal whole
    log = (r.run_dir / "train.log").read_text()
    missing = [b for b in range(1, 41) if f"batch={b}/40 " not in log]
    assert not missing, f"train.log lost batches {missing}"


@pytest.mark.timeout(120)
def test_a_deleted_socket_is_made_again_and_status_and_stop_reach_the_agent():
    with start_trainctl(["run", "--json", "--", *steady(3000, 0.05)]) as tc:
        tc.wait_event("progress", 30)
        (tc.run_dir / "agent.sock").unlink()
        tc.wait_event(lambda e: e.type == "info" and e.key == "socket.remade", 30, "socket.remade")
        st = run_trainctl(["status", "--json", str(tc.run_dir)], 60)
        assert st.returncode == 0 and json.loads(st.stdout).get("live") is True, st.describe()
        stop = run_trainctl(["ctl", str(tc.run_dir), "stop"], 60)
        assert stop.returncode == 0, stop.describe()
        r = tc.wait(60)
    assert r.of_type("state")[-1].state == "STOPPED", r.describe()
