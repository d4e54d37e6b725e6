"""The agent's socket server keeps descriptors for its own work: a connection that would
take them is refused at once with a hello that says why, and the next one, once room is
back, is served."""

from __future__ import annotations

import asyncio
import resource

import pytest

from trainctl.agent import server as S
from trainctl.client.connection import AgentClient, AgentNotResponding, UnixTransport
from trainctl.store.journal import Journal


async def _command(name, args):
    return {"ok": True, "result": None}


def _server(tmp_path) -> S.ClientServer:
    journal = Journal(tmp_path / "events.jsonl")
    return S.ClientServer(tmp_path / "agent.sock", journal, lambda: {"op": "hello", "live": True}, _command)


def test_a_connection_without_room_is_refused_with_the_reason_then_one_with_room_is_served(
    tmp_path, monkeypatch
):
    async def main():
        server = _server(tmp_path)
        await server.start()
        try:
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            monkeypatch.setattr(S, "FD_RESERVE", soft)  # no descriptor left for any client
            client = AgentClient(UnixTransport(tmp_path / "agent.sock"))
            with pytest.raises(AgentNotResponding) as refused:
                await client.connect()
            await client.close()
            assert "keeps" in str(refused.value) and "file descriptors" in str(refused.value)
            assert server._connections == 0

            monkeypatch.setattr(S, "FD_RESERVE", 8)
            client = AgentClient(UnixTransport(tmp_path / "agent.sock"))
            hello = await client.connect()
            assert hello["live"] is True
            await client.close()
        finally:
            await server.close()

    asyncio.run(main())


def test_idle_connections_past_the_room_never_take_the_reserve(tmp_path, monkeypatch):
    """Many clients that never say hello: the agent's open descriptors stay FD_RESERVE
    below its limit however many connect."""
    import os
    import socket

    async def main():
        server = _server(tmp_path)
        await server.start()
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        base = len(os.listdir("/proc/self/fd"))
        room = 60  # pretend the limit is base + FD_RESERVE + room (the test's own 40 sockets count too)
        monkeypatch.setattr(S, "FD_RESERVE", soft - base - room)
        socks = []
        try:
            for _ in range(40):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.setblocking(False)
                s.connect(str(tmp_path / "agent.sock"))
                socks.append(s)
            await asyncio.sleep(0.5)
            assert len(os.listdir("/proc/self/fd")) <= base + room + 1  # + the listing's own
            assert 1 <= server._connections < 40
        finally:
            for s in socks:
                s.close()
            await server.close()

    asyncio.run(main())
