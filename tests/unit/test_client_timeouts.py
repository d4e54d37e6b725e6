"""Issue 13: no waits without a bound.  A Unix server that accepts and never answers (what
a stopped agent's socket does): connect, hello and command replies time out with "agent
not responding (pid N, state)" from agent.json; `attach --json` (follow) ends, exit 4."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time

import pytest

from trainctl.client.connection import (
    AgentClient,
    AgentNotResponding,
    AgentProcess,
    AgentUnavailable,
    UnixTransport,
    agent_process,
    local_client,
)
from trainctl.client.follow import follow
from trainctl.store.paths import RunFiles

pytestmark = pytest.mark.timeout(30)


@contextlib.asynccontextmanager
async def silent_agent(run_dir, answer_hello: bool = False):
    """A socket at run_dir/agent.sock that accepts and reads, and says nothing (or only
    the hello); agent.json names this test's own process (running)."""
    files = RunFiles(run_dir)
    files.dir.mkdir(exist_ok=True)
    files.info.write_text(json.dumps({"pid": os.getpid(), "started": time.time()}))
    files.events.touch()
    held = []

    async def serve(reader, writer):
        held.append(writer)
        await reader.readline()
        if answer_hello:
            writer.write(b'{"op": "hello", "ok": true, "live": true}\n')
            await writer.drain()
        while await reader.readline():
            pass

    server = await asyncio.start_unix_server(serve, path=str(files.sock))
    try:
        yield files
    finally:
        server.close()
        for w in held:
            w.close()


async def test_a_silent_agent_gives_no_hello_and_the_client_says_so(tmp_path):
    async with silent_agent(tmp_path / "run") as files:
        client = AgentClient(UnixTransport(files.sock), hello_timeout=0.5)
        t0 = time.monotonic()
        with pytest.raises(AgentNotResponding) as err:
            await client.connect()
        took = time.monotonic() - t0
        await client.close()
    assert 0.5 <= took < 2.0, took
    assert str(err.value).startswith(f"agent not responding (pid {os.getpid()}, ")
    assert "no hello within 0.5 s" in str(err.value)


async def test_the_local_client_bounds_the_hello_by_default(tmp_path):
    async with silent_agent(tmp_path / "run") as files:
        client = local_client(files.dir)
        assert client.hello_timeout <= 4.0
        t0 = time.monotonic()
        with pytest.raises(AgentNotResponding):
            await client.connect(since=10**12)
        await client.close()
    assert time.monotonic() - t0 < 5.0


async def test_a_command_without_a_reply_times_out(tmp_path):
    async with silent_agent(tmp_path / "run", answer_hello=True) as files:
        client = local_client(files.dir)
        assert (await client.connect())["live"] is True
        with pytest.raises(AgentNotResponding, match=r"no reply to status within 0\.3 s"):
            await client.command("status", timeout=0.3)
        assert client._waiting == {}
        await client.close()


async def test_follow_ends_with_4_on_a_silent_agent_instead_of_retrying(tmp_path):
    async with silent_agent(tmp_path / "run") as files:
        notes = []
        rc = await asyncio.wait_for(
            follow(
                lambda: AgentClient(UnixTransport(files.sock), hello_timeout=0.3),
                lambda ev: None,
                notes.append,
            ),
            10,
        )
    assert rc == 4 and AgentNotResponding.exit_code == 4
    assert notes and notes[-1].startswith("agent not responding (pid "), notes


async def test_a_bridge_whose_agent_is_silent_answers_a_failed_hello(tmp_path):
    """What `ssh HOST trainctl bridge DIR` sends back, and how the client reads it."""
    async with silent_agent(tmp_path / "run") as files:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "trainctl",
            "bridge",
            str(files.dir),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(b'{"op": "hello", "since": 0}\n'), 20)
    assert proc.returncode == 4, err
    hello = json.loads(out.splitlines()[0])
    assert hello["ok"] is False and hello["error"].startswith(f"agent not responding (pid {os.getpid()}")

    class Canned:  # a transport whose far end is that bridge's answer
        def describe(self) -> str:
            return "box:/run"

        async def open(self):
            reader = asyncio.StreamReader()
            reader.feed_data(out)
            reader.feed_eof()
            return reader, _NullWriter()

    with pytest.raises(AgentNotResponding, match="agent not responding"):
        await AgentClient(Canned()).connect()


class _NullWriter:
    def write(self, data: bytes) -> None:
        pass

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_agent_process_names_the_pid_and_its_state_or_that_it_is_gone(tmp_path):
    assert agent_process(tmp_path) == AgentProcess("no agent.json")
    info = tmp_path / "agent.json"
    info.write_text(json.dumps({"pid": os.getpid(), "started": time.time()}))
    here = agent_process(tmp_path)
    assert here.text.startswith(f"pid {os.getpid()}, ") and not here.gone
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    info.write_text(json.dumps({"pid": proc.pid, "started": time.time()}))
    assert agent_process(tmp_path) == AgentProcess(f"pid {proc.pid} is gone", gone=True)
    # The pid lives, but its process began long after the agent wrote agent.json: reused.
    info.write_text(json.dumps({"pid": os.getpid(), "started": 1.0}))
    assert agent_process(tmp_path) == AgentProcess(
        f"pid {os.getpid()} is gone; another process has its number", gone=True
    )
    # no hello in time from an agent that is gone meanwhile: a lost connection, not a wedged agent
    lost = UnixTransport(tmp_path / "agent.sock").not_responding("no hello within 3 s")
    assert type(lost) is AgentUnavailable and "ended before it answered" in str(lost)
    info.write_text(json.dumps({"pid": os.getpid(), "started": time.time()}))
    assert isinstance(UnixTransport(tmp_path / "agent.sock").not_responding("x"), AgentNotResponding)
