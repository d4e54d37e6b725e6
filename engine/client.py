"""How a client (the TUI, `trainctl ctl`, `trainctl status`) talks to an agent."""
from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

from . import events as E
from .journal import read_events
from .paths import RunFiles


class Transport(Protocol):
    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]: ...
    def describe(self) -> str: ...


class AgentUnavailable(ConnectionError):
    pass


class UnixTransport:
    def __init__(self, sock_path: Path | str):
        self.sock_path = Path(sock_path)

    async def open(self):
        try:
            return await asyncio.open_unix_connection(str(self.sock_path), limit=1 << 22)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            raise AgentUnavailable(f"no agent is listening on {self.sock_path} ({e.strerror})") from e

    def describe(self) -> str:
        return str(self.sock_path.parent)


class AgentClient:
    """JSON lines over a transport: a hello, then the journal from `since`, then live events.
    Command replies are matched by id; everything else is an event."""

    def __init__(self, transport: Transport):
        self.transport = transport
        self._reader: asyncio.StreamReader | None = None
        self._writer = None
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future] = {}
        self._events: asyncio.Queue = asyncio.Queue()
        self._pump: asyncio.Task | None = None
        self.last_seq = -1
        self.hello_info: dict = {}

    async def connect(self, since: int = 0) -> dict:
        self._reader, self._writer = await self.transport.open()
        self._writer.write((json.dumps({"op": "hello", "since": since}) + "\n").encode())
        await self._writer.drain()
        line = await self._reader.readline()
        if not line:
            raise AgentUnavailable(f"the agent at {self.transport.describe()} closed the connection")
        try:
            self.hello_info = json.loads(line)
        except ValueError as e:
            raise AgentUnavailable(f"unexpected answer from {self.transport.describe()}: {line[:200]!r}") from e
        self.last_seq = since - 1
        self._events = asyncio.Queue()
        self._pump = asyncio.create_task(self._read_loop())
        return self.hello_info

    async def _read_loop(self) -> None:
        assert self._reader is not None
        try:
            while line := await self._reader.readline():
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if msg.get("op") == "reply":
                    fut = self._waiting.pop(msg.get("id"), None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
                    continue
                try:
                    ev = E.from_dict(msg)
                except (ValueError, TypeError, KeyError):
                    continue
                if ev.seq is not None:
                    if ev.seq <= self.last_seq:
                        continue   # already seen (a replay overlapping live)
                    self.last_seq = ev.seq
                self._events.put_nowait(ev)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(AgentUnavailable("connection to the agent lost"))
            self._waiting.clear()
            self._events.put_nowait(None)

    async def events(self) -> AsyncIterator[E.Event]:
        while True:
            ev = await self._events.get()
            if ev is None:
                return
            yield ev

    async def command(self, name: str, timeout: float = 60.0, **args) -> dict:
        if self._writer is None:
            raise AgentUnavailable("not connected")
        cid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._waiting[cid] = fut
        self._writer.write((json.dumps({"op": "cmd", "id": cid, "cmd": name, "args": args}) + "\n").encode())
        await self._writer.drain()
        return await asyncio.wait_for(fut, timeout)

    async def close(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:
                pass
        if self._pump is not None:
            self._pump.cancel()


def replay_journal(path: Path | str) -> list[E.Event]:
    return list(read_events(Path(path)))


def local_client(run_dir: Path | str) -> AgentClient:
    return AgentClient(UnixTransport(RunFiles(run_dir).sock))
