"""The agent's Unix socket: clients say hello, get the journal from a seq, then live events,
and send commands.  Protocol: docs/internals.md.

Nothing a client does can hold the agent: a client that never says hello is closed after
HELLO_TIMEOUT_S; each client's backlog is bounded in bytes, and one that falls behind
(stops reading) is dropped with a reason and catches up from the journal by seq when it
comes back; requests are bounded in size and checked in type.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path

from trainctl.client.connection import parse_hello
from trainctl.core import events as E
from trainctl.store.journal import iter_journal_lines

HELLO_TIMEOUT_S = 5.0
REQUEST_MAX = 1 << 20  # bytes in one request line
CLIENT_BACKLOG_MAX = 8 << 20  # bytes waiting for one client
SEND_TIMEOUT_S = 10.0  # a client that takes no bytes for this long is dropped
REPLAY_CHUNK = 2000
ACCEPT_BACKLOG = 1024  # clients connecting in one instant (the kernel caps it at somaxconn)


class _Client:
    def __init__(self) -> None:
        self.lines: deque[bytes] = deque()
        self.bytes = 0
        self.wake = asyncio.Event()
        self.dropped: str | None = None

    def push(self, data: bytes) -> None:
        if self.dropped is not None:
            return
        self.lines.append(data)
        self.bytes += len(data)
        if self.bytes > CLIENT_BACKLOG_MAX:
            self.drop(f"it fell {self.bytes >> 20} MiB behind")
        self.wake.set()

    def drop(self, reason: str) -> None:
        if self.dropped is None:
            self.dropped = reason
            self.lines.clear()
            self.bytes = 0
        self.wake.set()

    def take(self) -> bytes:
        data = b"".join(self.lines)
        self.lines.clear()
        self.bytes = 0
        self.wake.clear()
        return data


class ClientServer:
    def __init__(
        self,
        sock_path: Path,
        journal,
        hello: Callable[[], dict],
        command: Callable[[object, object], Awaitable[dict]],  # checks the client's name and args
        snapshot: Callable[[], dict | None] = lambda: None,
    ) -> None:
        self.sock_path = sock_path
        self.journal = journal
        self.hello = hello
        self.command = command
        self.snapshot = snapshot
        self.clients: set[_Client] = set()
        self._server: asyncio.base_events.Server | None = None
        self._ino: int | None = None  # the socket file's, to see it deleted or replaced

    # the bus sink: every event to every client
    def __call__(self, ev: E.Event) -> None:
        if not self.clients:
            return
        data = (E.encode(ev) + "\n").encode()
        for client in list(self.clients):
            client.push(data)

    async def start(self) -> None:
        sock = self.sock_path
        if sock.exists() or sock.is_symlink():
            sock.unlink()
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(
                self._serve, path=str(sock), limit=REQUEST_MAX, backlog=ACCEPT_BACKLOG
            )
        finally:
            os.umask(old)
        os.chmod(sock, 0o600)
        self._ino = os.stat(sock).st_ino

    async def keep_listening(self) -> bool:
        """The socket file deleted (or replaced) while the agent runs: listen on a new one
        (clients connected meanwhile stay).  True when it had to."""
        if self._server is None:
            return False
        try:
            if os.stat(self.sock_path).st_ino == self._ino:
                return False
        except FileNotFoundError:
            pass
        self._server.close()  # the old listener only: no client can reach it any more
        await self.start()
        return True

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await asyncio.sleep(0.2)  # let clients read the last events
            for client in list(self.clients):
                client.drop("the agent has ended")
        try:
            self.sock_path.unlink()
        except FileNotFoundError:
            pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = _Client()
        sender = None
        try:
            try:
                first = await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT_S)
            except TimeoutError:
                return  # an idle connection: it must not hold a file descriptor forever
            asked = parse_hello(first)
            upto = self.journal.next_seq
            since = asked.start(upto)
            snap = self.snapshot() if asked.snapshot_for(since, upto) else None
            self.clients.add(client)
            writer.write((json.dumps(self.hello()) + "\n").encode())
            if snap is not None:  # the view up to upto: nothing to replay
                since = snap["next_seq"]
                sender = asyncio.create_task(self._send(writer, client, since, upto, snap))
            else:
                sender = asyncio.create_task(self._send(writer, client, since, upto))
            while line := await reader.readline():
                reply = await self._request(line)
                if reply is not None:
                    client.push((json.dumps(reply) + "\n").encode())
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # ValueError: a request line over REQUEST_MAX
        finally:
            self.clients.discard(client)
            if sender is not None:
                client.drop("the connection closed")
                try:
                    await asyncio.wait_for(sender, 1.0)
                except Exception:  # noqa: BLE001 - a sender that will not end is cancelled
                    sender.cancel()
            writer.close()

    async def _request(self, line: bytes) -> dict | None:
        try:
            msg = json.loads(line)
        except ValueError:
            return {"op": "reply", "id": None, "ok": False, "error": "not a JSON line", "result": None}
        if not isinstance(msg, dict) or msg.get("op") != "cmd":
            return None
        reply = await self.command(msg.get("cmd"), msg.get("args"))
        rid = msg.get("id")
        reply.update(op="reply", id=rid if isinstance(rid, (int, str)) else None)
        return reply

    async def _send(
        self, writer: asyncio.StreamWriter, client: _Client, since: int, upto: int, snap: dict | None = None
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            if snap is not None:
                data = await loop.run_in_executor(None, _encode_line, snap)
                writer.write(data)
                await asyncio.wait_for(writer.drain(), SEND_TIMEOUT_S)
            if since < upto:  # read in chunks: a week-long journal never sits in memory
                lines = iter_journal_lines(self.journal.path, since, upto)
                while chunk := await loop.run_in_executor(None, _chunk, lines):
                    writer.write(chunk)
                    await asyncio.wait_for(writer.drain(), SEND_TIMEOUT_S)
            while True:
                await client.wake.wait()
                data = client.take()
                if data:
                    writer.write(data)
                    await asyncio.wait_for(writer.drain(), SEND_TIMEOUT_S)
                if client.dropped is not None:
                    break
        except TimeoutError:
            client.drop(f"it read nothing for {SEND_TIMEOUT_S:.0f}s")
        except (ConnectionError, RuntimeError):
            pass
        finally:
            self.clients.discard(client)
            if client.dropped is not None:  # why, and where to catch up from (best effort)
                with contextlib.suppress(ConnectionError, RuntimeError):
                    writer.write(
                        (
                            json.dumps(
                                {"op": "bye", "reason": client.dropped, "next_seq": self.journal.next_seq}
                            )
                            + "\n"
                        ).encode()
                    )
            writer.close()


def _chunk(lines) -> bytes:
    """The next REPLAY_CHUNK lines of a replay (b"" at its end)."""
    return "".join(itertools.islice(lines, REPLAY_CHUNK)).encode()


def _encode_line(msg: dict) -> bytes:
    return (json.dumps(msg, separators=(",", ":")) + "\n").encode()
