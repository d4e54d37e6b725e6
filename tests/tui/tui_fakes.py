"""A fake agent for the TUI tests and the bench: the client API over a recorded journal.

``FakeAgent`` holds the journal (events with ``seq``), the presets and the commands it was
sent; ``FakeAgent.client`` is the ``client_factory`` the app takes.  Each client replays
``journal[since:]`` and then follows live events; ``drop()`` cuts every connection (the
clients' ``events()`` raise ConnectionError, new connects are refused) until ``restore()``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from trainctl.config import preset_problems
from trainctl.core.commands import CommandError, check_request
from trainctl.core.events import EPHEMERAL, Event, decode, with_seq

ROOT = Path(__file__).resolve().parents[2]
JOURNAL = ROOT / "tests" / "data" / "journals" / "handmade_run.jsonl"
_DROP = object()


def replay_journal(path: Path = JOURNAL) -> list[Event]:
    """Every event of an events.jsonl, in order (a local stand-in for the client's helper)."""
    with open(path, encoding="utf-8") as fh:
        return [decode(line) for line in fh if line.strip()]


class FakeAgent:
    def __init__(
        self,
        journal: list[Event],
        hello: dict[str, Any],
        presets: dict[str, Path],
        shown_dir: str | None = None,
    ) -> None:
        self.journal = [e if e.seq is not None else with_seq(e, i) for i, e in enumerate(journal)]
        self.hello = hello
        self.presets = presets  # name -> path of a TOML file (written on save)
        self.shown_dir = shown_dir  # the folder paths are reported in (snapshots)
        self.up = True
        self.snapshot_over: int | None = None  # a longer replay asked with snapshot=True: a ViewSnapshot
        self.commands: list[tuple[str, dict[str, Any]]] = []
        self.connects: list[int] = []  # the `since` of every successful connect
        self.replies: dict[str, dict[str, Any]] = {}  # forced replies by command name
        self._queues: list[asyncio.Queue[Any]] = []

    def client(self) -> FakeClient:
        return FakeClient(self)

    # ------------------------------------------------------------------ driving
    def append(self, event: Event) -> Event:
        """Journal a new event (it gets the next seq) and send it to every client."""
        event = with_seq(event, len(self.journal))
        self.journal.append(event)
        self._deliver(event)
        return event

    def emit(self, event: Event) -> None:
        """Send an ephemeral event (tick, log) to every client."""
        assert event.type in EPHEMERAL
        self._deliver(event)

    def _deliver(self, item: Any) -> None:
        for queue in self._queues:
            queue.put_nowait(item)

    def drop(self) -> None:
        self.up = False
        self._deliver(_DROP)

    def restore(self) -> None:
        self.up = True

    def shown(self, path: Path) -> str:
        return f"{self.shown_dir}/{path.name}" if self.shown_dir else str(path)

    def names(self, command: str) -> list[dict[str, Any]]:
        return [args for name, args in self.commands if name == command]

    # ------------------------------------------------------------------ commands
    def handle(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        self.commands.append((name, dict(args)))
        try:  # the agent's own registry: a name or argument it would refuse is refused here
            check_request(name, args)
        except CommandError as e:
            return {"ok": False, "error": str(e), "result": None}
        if name in self.replies:
            return self.replies[name]
        ok: dict[str, Any] = {"ok": True, "error": None, "result": None}
        if name == "list_presets":
            return {
                **ok,
                "result": [
                    {"name": n, "path": self.shown(p), "description": f"preset {n}"}
                    for n, p in sorted(self.presets.items())
                ],
            }
        if name == "read_preset":
            path = self.presets.get(args.get("name", ""))
            if path is None:
                return {"ok": False, "error": f"no preset {args.get('name')!r}", "result": None}
            return {
                **ok,
                "result": {
                    "name": args["name"],
                    "path": self.shown(path),
                    "text": path.read_text(encoding="utf-8"),
                },
            }
        if name == "write_preset":
            path = self.presets.get(args["name"]) or next(iter(self.presets.values())).with_name(
                f"{args['name']}.toml"
            )
            problems = preset_problems(args["text"], self.shown(path))
            if problems:
                return {"ok": False, "error": str(problems[0]), "result": None}
            path.write_text(args["text"], encoding="utf-8")
            self.presets[args["name"]] = path
            return {**ok, "result": {"name": args["name"], "path": self.shown(path)}}
        if name in ("switch_preset", "set_next_preset"):
            preset = args.get("preset") or args.get("name")
            if preset not in self.presets:
                return {"ok": False, "error": f"no preset {preset!r}", "result": None}
        if name == "auto_recover":
            self.hello = {**self.hello, "auto_recover": bool(args["on"])}
        return ok


class FakeClient:
    """Implements the AgentClient API against a FakeAgent."""

    def __init__(self, agent: FakeAgent) -> None:
        self.agent = agent
        self._queue: asyncio.Queue[Any] | None = None
        self._backlog: list[Event] = []

    async def connect(self, since: int = 0, snapshot: bool = False) -> dict[str, Any]:
        """With ``snapshot`` and the agent's ``snapshot_over`` set, a replay longer than
        that comes as the journal's view (a ViewSnapshot), as a real agent sends it."""
        if not self.agent.up:
            raise ConnectionRefusedError("agent not running")
        self.agent.connects.append(since)
        self._queue = asyncio.Queue()
        self.agent._queues.append(self._queue)
        self._backlog = self.agent.journal[since:]
        over = self.agent.snapshot_over
        if snapshot and over is not None and len(self._backlog) > over:
            from trainctl.core.runview import RunView, ViewSnapshot

            view = RunView()
            view.apply_all(self.agent.journal)
            self._backlog = [ViewSnapshot(view.to_dict(), len(self.agent.journal))]
        return dict(self.agent.hello)

    async def events(self) -> AsyncIterator[Event]:
        assert self._queue is not None, "connect() first"
        for event in self._backlog:
            yield event
        while True:
            item = await self._queue.get()
            if item is _DROP:
                raise ConnectionError("agent went away")
            yield item

    async def command(self, name: str, /, **args: Any) -> dict[str, Any]:
        if not self.agent.up or self._queue is None:
            raise ConnectionError("agent went away")
        await asyncio.sleep(0)
        return self.agent.handle(name, args)

    async def close(self) -> None:
        if self._queue is not None and self._queue in self.agent._queues:
            self.agent._queues.remove(self._queue)
        self._queue = None


def shifted(event: Event, dt: float) -> Event:
    return dataclasses.replace(event, ts=event.ts + dt)
