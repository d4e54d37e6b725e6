"""The one bridge between the agent client and Textual.

:class:`Bridge` is the only code that touches an ``AgentClient``.  It runs in one async
worker (``group="engine"``, ``exclusive=True``): connect, replay the journal, follow live
events, and when the agent goes away, say so and reconnect with backoff from
``last_seq + 1`` (no gap, no duplicates).  Events are batched into
:class:`~trainctl.tui.messages.EventBatch` messages: a flusher posts what arrived every
``interval`` seconds (or every ``max_batch`` events), keeping only the newest tick and
the last ``LOG_KEEP`` log lines.  The bridge asks for a snapshot: a long replay (a first
attach to a week-long run) comes as the run's view up to a seq, carried by the next batch
before its events.  Commands go through :meth:`Bridge.command`, which
never raises.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, Protocol

from textual.dom import DOMNode
from textual.message_pump import MessagePump
from textual.worker import Worker

from trainctl.core.events import Event, Log, Tick
from trainctl.core.recovery import FINAL_STATES
from trainctl.core.runview import ViewSnapshot
from trainctl.tui.messages import AgentConnected, AgentDisconnected, EventBatch
from trainctl.tui.model import LOG_KEEP


class ClientLike(Protocol):
    """The part of ``trainctl.client.connection.AgentClient`` the bridge uses."""

    async def connect(self, since: int = 0, snapshot: bool = False) -> dict[str, Any]: ...
    def events(self) -> Any: ...
    async def command(self, name: str, /, **args: Any) -> dict[str, Any]: ...
    async def close(self) -> None: ...


ClientFactory = Callable[[], ClientLike]


OFFLINE_RELOOK_S = 2.0  # a run with no agent: its journal read again this often at most
_FINAL = frozenset(state.value for state in FINAL_STATES)


class Bridge:
    """Follows one agent for ``target`` (a screen), posting batched messages to it."""

    def __init__(
        self,
        client_factory: ClientFactory,
        target: MessagePump,
        *,
        interval: float = 0.05,
        max_batch: int = 5000,
        backoff: tuple[float, float] = (0.5, 10.0),
        gen: int = 0,
    ) -> None:
        self._factory = client_factory
        self.gen = gen  # tags every message: the dashboard drops those of a bridge it left
        self._target = target
        self._interval = interval
        self._max_batch = max_batch
        self._backoff_min, self._backoff_max = backoff
        self._client: ClientLike | None = None
        self._live, self._ended = True, False  # the last hello: an agent's, the run over
        self.next_seq = 0
        self._events: list[Event] = []
        self._snapshot: ViewSnapshot | None = None
        self._tick: Tick | None = None
        self._lines: list[str] = []
        self._dropped = 0
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Future[None]] = set()

    @property
    def connected(self) -> bool:
        return self._client is not None

    def start(self, owner: DOMNode) -> Worker[None]:
        """Run the follow loop as ``owner``'s exclusive engine worker."""
        return owner.run_worker(
            self.follow(), name="bridge", group="engine", exclusive=True, exit_on_error=False
        )

    # ------------------------------------------------------------------ commands
    async def command(self, name: str, /, **args: Any) -> dict[str, Any]:
        """Send one command; failures come back as ``{"ok": False, "error": ...}``.

        ``name`` is positional-only: ``read_preset`` and ``write_preset`` take a ``name``
        argument of their own.
        """
        client = self._client
        if client is None:
            return {"ok": False, "error": "not connected to the agent", "result": None}
        try:
            reply = await client.command(name, **args)
        except Exception as exc:  # noqa: BLE001 - any failure is reported, not raised
            return {"ok": False, "error": f"{name}: {exc or type(exc).__name__}", "result": None}
        return reply if isinstance(reply, dict) else {"ok": False, "error": "bad reply", "result": reply}

    # ------------------------------------------------------------------ follow
    async def follow(self) -> None:
        """Connect, replay, follow; on a drop, post AgentDisconnected and retry forever."""
        flusher = asyncio.create_task(self._flush_loop())
        delay, attempts = self._backoff_min, 0
        try:
            while True:
                was_connected, reason = await self._session()
                if was_connected and self._live:
                    delay, attempts = self._backoff_min, 0
                elif was_connected:  # the journal only (no agent): look again, not every 0.5 s
                    attempts = 0  # (each look reads the snapshot); an ended run, rarely
                    cap = self._backoff_max if self._ended else OFFLINE_RELOOK_S
                    delay = min(max(delay, self._backoff_min), cap)
                attempts += 1
                await self._flush()
                self._target.post_message(AgentDisconnected(reason, delay, attempts, self.gen))
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._backoff_max)
        finally:
            flusher.cancel()

    async def _session(self) -> tuple[bool, str]:
        """One connection: whether it was made, and why it ended."""
        client = self._factory()
        try:
            try:
                hello = await client.connect(since=self.next_seq, snapshot=True)
            except Exception as exc:  # noqa: BLE001 - refused, no socket, ssh failed...
                return False, f"cannot connect: {exc or type(exc).__name__}"
            self._client = client
            self._live = hello.get("live", True) is not False
            self._ended = hello.get("state") in _FINAL
            self._target.post_message(AgentConnected(dict(hello), self.next_seq, self.gen))
            count = 0
            try:
                async for event in client.events():
                    self._take(event)
                    count += 1
                    if count % 1000 == 0:  # let the UI run during a fast replay
                        await asyncio.sleep(0)
            except Exception as exc:  # noqa: BLE001 - ConnectionError, EOF, reset...
                return True, f"connection lost: {exc or type(exc).__name__}"
            return True, "the agent closed the connection"
        finally:
            self._client = None
            # Its own task, so a cancelled follow (the app quitting) still ends the ssh
            # process; aclose() waits for it while the event loop is alive.
            closing = asyncio.ensure_future(_close_quietly(client))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
            await asyncio.shield(closing)  # a cancel stops the wait, not the close

    async def aclose(self, timeout: float = 5.0) -> None:
        """Wait (bounded) for the connections being closed: the app calls this on exit."""
        client = self._client
        if client is not None:
            self._client = None
            self._closing.add(asyncio.ensure_future(_close_quietly(client)))
        if self._closing:
            await asyncio.wait(set(self._closing), timeout=timeout)

    def _take(self, event: Event | ViewSnapshot) -> None:
        if isinstance(event, ViewSnapshot):
            # the view up to its next_seq: what was not posted yet is older, and in it
            self._snapshot = event
            self._events = [e for e in self._events if e.seq is None or e.seq >= event.next_seq]
            self.next_seq = max(self.next_seq, event.next_seq)
        elif isinstance(event, Tick):
            self._tick = event
        elif isinstance(event, Log):
            self._lines.extend(event.lines)
            if len(self._lines) > 2 * LOG_KEEP:
                self._dropped += len(self._lines) - LOG_KEEP
                del self._lines[:-LOG_KEEP]
        elif event.seq is None or event.seq >= self.next_seq:
            if event.seq is not None:
                self.next_seq = event.seq + 1
            self._events.append(event)
        else:
            return  # a journal event seen before: never twice
        self._wake.set()

    async def _flush_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self._flush()
            await asyncio.sleep(self._interval)

    async def _flush(self) -> None:
        """Post what arrived, in EventBatch chunks, waiting while the screen is behind."""
        async with self._lock:
            while self._events or self._tick or self._lines or self._snapshot:
                while self._target.message_queue_size > 4:
                    await asyncio.sleep(self._interval / 5)
                events = self._events[: self._max_batch]
                del self._events[: self._max_batch]
                last = not self._events
                lines = tuple(self._lines[-LOG_KEEP:]) if last else ()
                dropped = self._dropped + max(0, len(self._lines) - LOG_KEEP) if last else 0
                batch = EventBatch(
                    tuple(events), self._tick if last else None, lines, dropped, self._snapshot, self.gen
                )
                self._snapshot = None
                if last:
                    self._tick, self._lines, self._dropped = None, [], 0
                self._target.post_message(batch)


async def _close_quietly(client: ClientLike) -> None:
    with contextlib.suppress(Exception):  # closing a dead connection
        await client.close()
