"""The agent's Unix socket: clients say hello, get the journal from a seq, then live events,
and send commands.  Protocol: docs/internals.md.

Nothing a client does can hold the agent: a client that never says hello is closed after
HELLO_TIMEOUT_S; a connection that would leave the agent fewer than FD_RESERVE free file
descriptors (its own restarts, diagnoses and journal need them) is refused at once with a
hello that says why; each client's backlog is bounded in bytes, and one that falls behind
(stops reading) is dropped with a reason and catches up from the journal by seq when it
comes back; requests are bounded in size and checked in type.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import resource
import socket
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
FD_RESERVE = 24  # descriptors no client may take: a restart, a diagnosis, the journal need them
ACCEPT_RETRY_S = 0.5  # after an accept failed for want of descriptors


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
        self._listener: socket.socket | None = None
        self._acceptor: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()  # one per connection being served
        self._connections = 0
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
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(str(sock))
        except OSError:
            listener.close()
            raise
        finally:
            os.umask(old)
        os.chmod(sock, 0o600)
        listener.listen(ACCEPT_BACKLOG)
        listener.setblocking(False)
        self._ino = os.stat(sock).st_ino
        self._listener = listener
        self._acceptor = asyncio.create_task(self._accept(listener))

    async def _accept(self, listener: socket.socket) -> None:
        """One connection at a time: each is served, or refused and closed before the next
        is taken, so idle connections never use up the descriptors the agent's own work needs."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError:  # EMFILE/ENFILE: the descriptors are taken, by the agent's own work
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            if (why := self._no_room()) is not None:
                _refuse(conn, why)
                continue
            self._connections += 1
            task = asyncio.create_task(self._open(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _no_room(self) -> str | None:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        try:
            in_use = len(os.listdir("/proc/self/fd"))
        except OSError:
            in_use = soft  # not even one descriptor to list them with
        if soft != resource.RLIM_INFINITY and in_use + FD_RESERVE > soft:
            return (
                f"the agent has {in_use} of its {soft} file descriptors open and keeps {FD_RESERVE} "
                f"for its own work; it serves {self._connections} connections: try again when one closes"
            )
        return None

    async def _open(self, conn: socket.socket) -> None:
        try:
            try:
                reader, writer = await asyncio.open_unix_connection(sock=conn, limit=REQUEST_MAX)
            except OSError:
                conn.close()
                return
            await self._serve(reader, writer)
        finally:
            self._connections -= 1

    def _stop_listening(self) -> None:
        if self._acceptor is not None:
            self._acceptor.cancel()
            self._acceptor = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    async def keep_listening(self) -> bool:
        """The socket file deleted (or replaced) while the agent runs: listen on a new one
        (clients connected meanwhile stay).  True when it had to."""
        if self._listener is None:
            return False
        try:
            if os.stat(self.sock_path).st_ino == self._ino:
                return False
        except FileNotFoundError:
            pass
        self._stop_listening()  # the old listener only: no client can reach it any more
        await self.start()
        return True

    async def close(self) -> None:
        if self._listener is not None:
            self._stop_listening()
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


def _refuse(conn: socket.socket, why: str) -> None:
    """A hello that says no (the client raises it as the agent not answering), then close."""
    with contextlib.suppress(OSError):
        conn.setblocking(False)
        conn.send(_encode_line({"op": "hello", "ok": False, "live": True, "error": why}))
    conn.close()


def _chunk(lines) -> bytes:
    """The next REPLAY_CHUNK lines of a replay (b"" at its end)."""
    return "".join(itertools.islice(lines, REPLAY_CHUNK)).encode()


def _encode_line(msg: dict) -> bytes:
    return (json.dumps(msg, separators=(",", ":")) + "\n").encode()
