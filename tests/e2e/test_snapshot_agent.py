"""Snapshots with a real agent (issue 20): it writes snapshot.json as the run goes; a client
that asks gets the view and then live events, no replay; after a kill -9 the adopting agent
goes on from the snapshot and the journal, and the last snapshot equals the whole journal
folded."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time

import pytest

from tests.e2e.conftest import PYTHON, ROOT, of_type, read_journal, start_trainctl
from tests.e2e.test_agent_faults import agent_pid, trainers, write_counter
from tests.helpers.hangs import wait_until
from trainctl.client.connection import AgentClient, UnixTransport
from trainctl.core.runview import RunView, ViewSnapshot
from trainctl.store.journal import read_events
from trainctl.store.snapshot import read_snapshot

pytestmark = pytest.mark.e2e


def folded(run_dir, upto: int | None = None) -> RunView:
    view = RunView()
    view.apply_all([e for e in read_events(run_dir / "events.jsonl") if upto is None or e.seq < upto])
    return view


async def live_snapshot(run_dir) -> tuple[ViewSnapshot, list]:
    client = AgentClient(UnixTransport(run_dir / "agent.sock"))
    try:
        await client.connect(snapshot="always")
        got = []
        async for item in client.events():
            got.append(item)
            if len([e for e in got if getattr(e, "seq", None) is not None]) >= 2:
                break
    finally:
        await client.close()
    return got[0], got[1:]


@pytest.mark.timeout(90)
def test_snapshots_follow_the_run_and_an_adopting_agent_goes_on_from_them(tmp_path):
    script = write_counter(tmp_path)
    run_dir = tmp_path / "run"
    env = {"TRAINCTL_SNAPSHOT_EVERY": "3"}
    first = start_trainctl(
        [
            "run",
            "--json",
            "--run-dir",
            str(run_dir),
            "--stall-timeout",
            "20",
            "--",
            PYTHON,
            str(script),
            "110",
            "0.1",
        ],
        env=env,
    )
    attach = None
    try:
        first.wait_event("start", 30)
        wait_until(
            lambda: (s := read_snapshot(run_dir)) is not None and s.next_seq >= 6,
            20,
            what="a snapshot of the first events",
        )
        snap, after = asyncio.run(live_snapshot(run_dir))
        assert isinstance(snap, ViewSnapshot)
        assert [e.seq for e in after if e.seq is not None][0] == snap.next_seq  # no replay, no gap
        view = RunView()
        view.load_dict(snap.view)
        assert view.state_key() == folded(run_dir, snap.next_seq).state_key()

        os.kill(agent_pid(run_dir), signal.SIGKILL)
        time.sleep(0.3)
        assert len(trainers(script)) == 1
        attach = subprocess.Popen(
            [PYTHON, "-m", "trainctl", "attach", "--json", "--from-snapshot", str(run_dir)],
            cwd=str(ROOT),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env={**os.environ, **env},
        )
        out, err = attach.communicate(timeout=60)
        assert attach.returncode == 0, err.decode()[-2000:]
    finally:
        first.kill()
        if attach is not None and attach.poll() is None:
            attach.kill()
            attach.wait()
    # (the note that a detached agent started comes on stdout too: not a JSON line)
    lines = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    assert lines[0]["op"] == "snapshot" and lines[1]["seq"] == lines[0]["next_seq"]
    events = read_journal(run_dir)
    assert of_type(events, "state")[-1].state == "FINISHED"
    assert [e.key for e in of_type(events, "info") if e.key == "adopt"] == ["adopt"]
    last = read_snapshot(run_dir)  # the adopting agent's last one, at its end
    assert last is not None and last.next_seq == len(events)
    assert last.view.state_key() == folded(run_dir).state_key()
    assert last.view.state == "FINISHED" and last.view.losses["loss"].xs
    wait_until(lambda: not trainers(script), 10, what="the trainer to end")
