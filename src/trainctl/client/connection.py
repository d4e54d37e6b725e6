"""How a client (the TUI, `trainctl ctl`, `trainctl status`) talks to an agent."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil

from trainctl.core import events as E
from trainctl.core.runview import ViewSnapshot
from trainctl.store.journal import journal_lines, read_events, wire_lines_from
from trainctl.store.paths import RunFiles, read_private
from trainctl.store.snapshot import Covered, load_view


class Transport(Protocol):
    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]: ...
    def describe(self) -> str: ...


#: How long a local agent may take to accept the connection and answer the hello.  A
#: transport may say its own (``hello_timeout``); one that does not (ssh: a login and a
#: remote `trainctl bridge` to start) gets REMOTE_HELLO_TIMEOUT_S.
HELLO_TIMEOUT_S = 3.0
REMOTE_HELLO_TIMEOUT_S = 30.0
SNAPSHOT_OVER = 2000  # events to replay above which a client that asks gets a snapshot
COMMAND_TIMEOUT_S = 60.0  # a stack dump (py-spy on every process) takes seconds


class AgentUnavailable(ConnectionError):
    pass


class AgentNotResponding(AgentUnavailable):
    """The agent is there (its socket accepts) but does not answer in time: stopped
    (SIGSTOP, a debugger), or wedged.  Nothing retries this by itself."""

    exit_code = 4  # `trainctl status`, `ctl`, `attach --json`, `bridge`


@dataclass(frozen=True)
class AgentProcess:
    """What <run_dir>/agent.json's pid is now."""

    text: str  # "pid N, stopped" (psutil's status), "pid N is gone", "no agent.json"
    gone: bool = False  # no such process now: ended (a zombie too), or its number reused


def agent_process(run_dir: Path | str) -> AgentProcess:
    """What <run_dir>/agent.json's pid is now.  A pid whose process began after the agent
    wrote agent.json is another process that got the number: gone too."""
    try:
        info = json.loads(read_private(RunFiles(run_dir).info))
        pid = int(info["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return AgentProcess("no agent.json")
    try:
        proc = psutil.Process(pid)
        status = proc.status()
        started = info.get("started")
        if isinstance(started, (int, float)) and proc.create_time() > started + 2.0:
            return AgentProcess(f"pid {pid} is gone; another process has its number", gone=True)
    except psutil.NoSuchProcess:
        return AgentProcess(f"pid {pid} is gone", gone=True)
    except psutil.Error as e:
        return AgentProcess(f"pid {pid}, {type(e).__name__}")
    if status == psutil.STATUS_ZOMBIE:
        return AgentProcess(f"pid {pid} is gone (a zombie)", gone=True)
    return AgentProcess(f"pid {pid}, {status}")


SOCKET_REMADE_S = 5.0  # how long a client waits for a live agent's deleted socket to come back


def agent_holds(run_dir: Path | str) -> bool:
    """An agent holds this run (alive, even if stopped): its flock on agent.lock is held."""
    import fcntl
    import os

    try:
        fd = os.open(Path(run_dir) / "agent.lock", os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


class UnixTransport:
    """The agent's Unix socket.  With ``journal_fallback``, a run whose agent is gone (the
    run ended, or the agent died) still answers: a hello with ``"live": false`` and the
    journal, read from the run directory, then the end of the stream."""

    hello_timeout = HELLO_TIMEOUT_S

    def __init__(self, sock_path: Path | str, journal_fallback: bool = False):
        self.sock_path = Path(sock_path)
        self.journal_fallback = journal_fallback

    def not_responding(self, what: str) -> AgentUnavailable:
        """No hello in time: a stopped or wedged agent; or one that ended meanwhile (its
        socket accepted before it died, a frozen node's killed at last): a lost connection."""
        agent = agent_process(self.sock_path.parent)
        if agent.gone:
            return AgentUnavailable(f"the agent ({agent.text}) ended before it answered: {what}")
        return AgentNotResponding(f"agent not responding ({agent.text}): {what} from {self.sock_path.parent}")

    async def open(self):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SOCKET_REMADE_S
        while True:
            try:
                return await asyncio.open_unix_connection(str(self.sock_path), limit=1 << 22)
            except (FileNotFoundError, ConnectionRefusedError) as e:
                # An agent holds the run but its socket file is gone (deleted): it makes
                # it again within a second (Agent._keep_run_dir); wait for that, briefly.
                if loop.time() < deadline and agent_holds(self.sock_path.parent):
                    await asyncio.sleep(0.1)
                    continue
                return self._unavailable(e)

    def _unavailable(self, e: OSError):
        run_dir = self.sock_path.parent
        if self.journal_fallback and RunFiles(run_dir).events.exists():
            return _offline_streams(run_dir)
        raise AgentUnavailable(f"no agent is listening on {self.sock_path} ({e.strerror})") from e

    def describe(self) -> str:
        return str(self.sock_path.parent)


class AgentClient:
    """JSON lines over a transport: a hello, then the journal from `since`, then live events.
    Command replies are matched by id; everything else is an event."""

    def __init__(self, transport: Transport, *, hello_timeout: float | None = None):
        self.transport = transport
        self.hello_timeout = (
            hello_timeout
            if hello_timeout is not None
            else getattr(transport, "hello_timeout", REMOTE_HELLO_TIMEOUT_S)
        )
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future] = {}
        self._events: asyncio.Queue = asyncio.Queue()
        self._pump: asyncio.Task | None = None
        self.last_seq = -1
        self.hello_info: dict = {}

    def _not_responding(self, what: str) -> AgentUnavailable:
        describe = getattr(self.transport, "not_responding", None)
        if describe is not None:
            return describe(what)
        return AgentNotResponding(f"agent not responding: {what} from {self.transport.describe()}")

    async def connect(self, since: int = 0, snapshot: bool | str = False, tail: int | None = None) -> dict:
        """Open, say hello, read the agent's hello: all within ``hello_timeout``, else
        AgentNotResponding (the caller closes the client, as after any failure).
        ``snapshot``: a long replay may come as one :class:`ViewSnapshot` (the view up to
        its ``next_seq``) first, then the events after it ("always": whatever the length).
        ``tail``: only the journal's last ``tail`` events, then live ones."""
        hello = {"op": "hello", "since": since}
        if snapshot:
            hello["snapshot"] = snapshot
        if tail is not None:
            hello["tail"] = tail
        try:
            line = await asyncio.wait_for(self._hello(hello), self.hello_timeout)
        except TimeoutError:
            raise self._not_responding(f"no hello within {self.hello_timeout:g} s") from None
        if not line:
            raise AgentUnavailable(f"the agent at {self.transport.describe()} closed the connection")
        try:
            self.hello_info = json.loads(line)
        except ValueError as e:
            raise AgentUnavailable(
                f"unexpected answer from {self.transport.describe()}: {line[:200]!r}"
            ) from e
        if self.hello_info.get("ok") is False:  # a bridge whose agent did not answer
            raise AgentNotResponding(str(self.hello_info.get("error") or "agent not responding"))
        self.last_seq = since - 1 if tail is None else -1
        self._events = asyncio.Queue()
        self._pump = asyncio.create_task(self._read_loop())
        return self.hello_info

    async def _hello(self, hello: dict) -> bytes:
        reader, writer = await self.transport.open()
        self._reader, self._writer = reader, writer
        writer.write((json.dumps(hello) + "\n").encode())
        await writer.drain()
        return await reader.readline()

    async def _read_loop(self) -> None:
        assert self._reader is not None
        try:
            while line := await self._reader.readline():
                try:
                    msg = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if not isinstance(msg, dict):
                    continue
                if msg.get("op") == "reply":
                    rid = msg.get("id")
                    fut = self._waiting.pop(rid, None) if isinstance(rid, int) else None
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
                    continue
                if msg.get("op") == "snapshot":
                    snap = _view_snapshot(msg)
                    if snap is not None and snap.next_seq - 1 > self.last_seq:
                        self.last_seq = snap.next_seq - 1
                        self._events.put_nowait(snap)
                    continue
                try:
                    ev = E.check(E.from_dict(msg))  # a journal line of the wrong types: skipped
                except (ValueError, TypeError, KeyError):
                    continue
                if ev.seq is not None:
                    if ev.seq <= self.last_seq:
                        continue  # already seen (a replay overlapping live)
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

    async def command(self, name: str, /, *, timeout: float = COMMAND_TIMEOUT_S, **args) -> dict:
        """Send command ``name`` with ``args`` and wait for its reply, ``timeout`` at most
        (else AgentNotResponding).  ``name`` is positional-only: read_preset, write_preset
        and set_next_preset take a ``name`` argument of their own."""
        if self._writer is None:
            raise AgentUnavailable("not connected")
        if self.hello_info.get("live") is False:
            raise AgentUnavailable(offline_reply(self.hello_info.get("run_dir", "?"), self.hello_info))
        if self._pump is not None and self._pump.done():
            raise AgentUnavailable("connection to the agent lost")
        cid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._waiting[cid] = fut
        self._writer.write((json.dumps({"op": "cmd", "id": cid, "cmd": name, "args": args}) + "\n").encode())

        async def reply() -> dict:
            assert self._writer is not None
            await self._writer.drain()
            return await fut

        try:
            return await asyncio.wait_for(reply(), timeout)
        except TimeoutError:
            raise self._not_responding(f"no reply to {name} within {timeout:g} s") from None
        finally:
            self._waiting.pop(cid, None)

    async def close(self) -> None:
        """Close the connection, and the transport's own process if it has one (ssh)."""
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # noqa: BLE001 - closing a dead writer on teardown
                pass
        if self._pump is not None:
            self._pump.cancel()
        closer = getattr(self.transport, "close", None)
        if closer is not None:
            await closer()


def _view_snapshot(msg: dict) -> ViewSnapshot | None:
    seq, view = msg.get("next_seq"), msg.get("view")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0 or not isinstance(view, dict):
        return None
    return ViewSnapshot(view, seq)


def replay_journal(path: Path | str) -> list[E.Event]:
    return list(read_events(Path(path)))


def local_client(run_dir: Path | str) -> AgentClient:
    return AgentClient(UnixTransport(RunFiles(run_dir).sock, journal_fallback=True))


# ---------------------------------------------------------------------- no agent: the journal
def offline_hello(run_dir: Path | str, covered: Covered | None = None) -> dict:
    """The hello an agent would give, from the run directory alone (``"live": false``):
    the spec, and the view of the journal (its snapshot and the lines after it)."""
    from trainctl.store.spec import RunSpec

    files = RunFiles(run_dir)
    hello = {
        "op": "hello",
        "ok": True,
        "live": False,
        "run_dir": str(files.dir),
        "state": "UNKNOWN",
        "job": files.dir.name,
    }
    try:
        spec = RunSpec.load(files.spec)
        hello.update(
            job=spec.job_name,
            host=spec.host,
            preset=spec.preset,
            fallback=spec.fallback,
            auto_recover=spec.auto_recover,
            deadline=spec.deadline,
            budget=spec.budget,
            currency=spec.currency,
        )
    except (OSError, ValueError, TypeError):
        pass
    view = (covered or offline_view(files.dir)).view
    if view.last_seq >= 0:
        hello["state"] = view.state
    if view.attempt is not None:
        hello.update(attempt=view.attempt, preset=view.preset)
    if view.unreadable:
        hello["unreadable"] = view.unreadable
    if torn_tail(files.events):
        hello["torn"] = True
    return hello


def torn_tail(journal: Path) -> bool:
    """Whether the journal ends in a line without its newline (its writer died mid-line)."""
    try:
        with open(journal, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            return size > 0 and f.seek(size - 1) >= 0 and f.read(1) != b"\n"
    except OSError:
        return False


def offline_view(run_dir: Path | str) -> Covered:
    """The run's view from its directory: the snapshot and the journal after it (an older
    journal is folded whole, once: the snapshot is written then)."""
    return load_view(RunFiles(run_dir).dir)


def offline_reply(run_dir: Path | str, hello: dict) -> str:
    return (
        f"no agent is running for {RunFiles(run_dir).dir} (the run is {hello.get('state')}); "
        "its journal is all there is"
    )


class _OfflineWriter:
    """The writer side of an offline 'connection': the hello request says from where to
    replay; the whole answer is fed to the reader at once, then the end of the stream."""

    def __init__(self, run_dir: Path, reader: asyncio.StreamReader):
        self.run_dir, self.reader, self.answered = run_dir, reader, False

    def write(self, data: bytes) -> None:
        if self.answered or self.reader.at_eof():
            return
        self.answered = True
        for line in offline_lines(self.run_dir, parse_hello(data.split(b"\n", 1)[0])):
            self.reader.feed_data(line.encode())
        self.reader.feed_eof()

    async def drain(self) -> None:
        return None

    def write_eof(self) -> None:
        return None

    def close(self) -> None:
        return None


@dataclass(frozen=True)
class HelloRequest:
    """What a client's hello line asks: the journal from ``since``, or its last ``tail``
    events; ``snapshot_over``: a replay longer than this many events comes as a snapshot
    and the events after it (None: never; 0: always)."""

    since: int = 0
    tail: int | None = None
    snapshot_over: int | None = None

    def start(self, next_seq: int) -> int:
        """The first seq to send of a journal of ``next_seq`` lines."""
        if self.tail is not None:
            return max(0, next_seq - self.tail)
        return self.since

    def snapshot_for(self, start: int, next_seq: int) -> bool:
        return self.snapshot_over is not None and next_seq - start > self.snapshot_over


def _count(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def parse_hello(first: bytes | str) -> HelloRequest:
    """A client's hello line (missing or malformed parts: a replay from 0)."""
    try:
        asked = json.loads(first) if first.strip() else {}
        asked.get("since")
    except (ValueError, AttributeError):
        return HelloRequest()
    snapshot = asked.get("snapshot")
    over = SNAPSHOT_OVER if snapshot is True else 0 if snapshot == "always" else None
    return HelloRequest(_count(asked.get("since")) or 0, _count(asked.get("tail")), over)


def offline_lines(run_dir: Path | str, request: HelloRequest | int = 0) -> list[str]:
    """What an offline replay sends for a hello (``request``, or the seq it asks from):
    the hello, then the journal from where it asks; or, for one that takes a snapshot
    when the replay is long, the hello, the snapshot and the journal's lines after it."""
    if isinstance(request, int):
        request = HelloRequest(since=max(0, request))
    files = RunFiles(run_dir)
    covered = offline_view(files.dir)
    hello = json.dumps(offline_hello(run_dir, covered)) + "\n"
    start = request.start(covered.next_seq)

    def after() -> list[str]:  # lines written since the view
        return wire_lines_from(files.events, covered.offset, covered.next_seq, covered.view.progress)

    if request.snapshot_for(start, covered.next_seq):
        snap = {"op": "snapshot", "next_seq": covered.next_seq, "view": covered.view.to_dict()}
        return [hello, json.dumps(snap, separators=(",", ":")) + "\n", *after()]
    if start >= covered.next_seq:  # nothing old asked (`status`, `ctl`): no need to read it
        return [hello, *(line for line in after() if _seq_of(line) >= start)]
    return [hello, *journal_lines(files.events, start)]


def _seq_of(line: str) -> int:
    try:
        return int(json.loads(line).get("seq", -1))
    except (ValueError, TypeError, AttributeError):
        return -1


def _offline_streams(run_dir: Path) -> tuple[asyncio.StreamReader, _OfflineWriter]:
    reader = asyncio.StreamReader(limit=1 << 22)
    return reader, _OfflineWriter(run_dir, reader)
