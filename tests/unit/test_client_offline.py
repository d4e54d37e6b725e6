"""A run whose agent is gone still answers from its run directory: a hello with live=false
and the journal, then the end of the stream; commands fail at once with a clear reason, and
`attach --json` (follow) ends instead of retrying forever."""

from __future__ import annotations

import asyncio
import time

import pytest

from trainctl.client.connection import AgentUnavailable, UnixTransport, local_client, offline_lines
from trainctl.client.follow import follow
from trainctl.core import events as E
from trainctl.store.journal import Journal
from trainctl.store.paths import RunFiles
from trainctl.store.spec import RunSpec

pytestmark = pytest.mark.timeout(20)


def make_run(tmp_path, final: str | None):
    files = RunFiles(tmp_path / "run")
    files.dir.mkdir()
    RunSpec(
        job_name="yolo", kind="command", command=["python", "t.py"], preset="A", fallback="B", host="box"
    ).save(files.spec)
    j = Journal(files.events)
    t = 1000.0
    j.append(E.Start(t, 1, 42, "A", ("python", "t.py")))
    j.append(E.State(t + 1, "RUNNING", "progress"))
    for b in range(1, 4):
        j.append(E.Progress(t + 1 + b, 1, 2, b, 3, {"loss": 1.0 / b}))
    j.append(E.Restart(t + 5, 2, "restart requested by the user", "B", None))
    j.append(E.Start(t + 6, 2, 43, "B", ("python", "t.py")))
    if final:
        j.append(E.State(t + 9, final, "the trainer finished"))
    j.close()
    return files.dir


async def test_no_agent_replays_the_journal_with_an_offline_hello(tmp_path):
    run_dir = make_run(tmp_path, "FINISHED")
    client = local_client(run_dir)
    hello = await client.connect(since=2)
    assert hello["live"] is False and hello["state"] == "FINISHED"
    assert (hello["job"], hello["preset"], hello["attempt"], hello["fallback"]) == ("yolo", "B", 2, "B")
    seqs = [ev.seq async for ev in client.events()]
    assert seqs == list(range(2, 8))
    t0 = time.monotonic()
    with pytest.raises(AgentUnavailable, match="no agent is running .* FINISHED"):
        await client.command("stop")
    assert time.monotonic() - t0 < 1
    await client.close()


async def test_without_the_fallback_or_a_journal_it_is_unavailable(tmp_path):
    run_dir = make_run(tmp_path, None)
    with pytest.raises(AgentUnavailable, match="no agent is listening"):
        await UnixTransport(RunFiles(run_dir).sock).open()
    with pytest.raises(AgentUnavailable, match="no agent is listening"):
        await UnixTransport(tmp_path / "nowhere" / "agent.sock", journal_fallback=True).open()


@pytest.mark.parametrize("final, code", [("FINISHED", 0), ("FAILED", 1), ("STOPPED", 130), (None, 3)])
async def test_follow_ends_on_an_offline_run(tmp_path, final, code):
    run_dir = make_run(tmp_path, final)
    seen, notes = [], []
    rc = await asyncio.wait_for(follow(lambda: local_client(run_dir), seen.append, notes.append), 5)
    assert rc == code
    assert [e.seq for e in seen] == list(range(7 + (final is not None)))
    if final is None:
        assert "killed or crashed" in notes[-1] and "RUNNING" in notes[-1], notes


def test_offline_lines_start_with_the_hello_then_the_journal_from_since(tmp_path):
    run_dir = make_run(tmp_path, "FINISHED")
    lines = offline_lines(run_dir, 5)
    assert '"live": false' in lines[0]
    assert [E.decode(x).seq for x in lines[1:]] == [5, 6, 7]
