"""Feeds the preset history during the run: every journaled event goes to a
:class:`~trainctl.core.preset_usage.PresetUsage`, and this run's file in the history is
rewritten at most every :data:`WRITE_EVERY_S` and at once on an incident, its cost known, a
restart and the run's end (so a run killed with -9 keeps what it had up to its last write).  After each
write the projector gets each preset's risk (the other runs' records of this job, machine
and preset content, plus this run's) in :attr:`~trainctl.core.projection.Projector.risks`:
this module is the one writer of that attribute."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from trainctl.config import ConfigError
from trainctl.core import events as E
from trainctl.core.preset_risk import Risk
from trainctl.core.preset_usage import PresetUsage
from trainctl.core.projection import Projector
from trainctl.store.preset_history import PresetHistory, Record, RecordKey, preset_content
from trainctl.system.machine import machine_id

WRITE_EVERY_S = 30.0  # the most often this run's history file is rewritten
_AT_ONCE = ("stall", "restart", "exit", "state")


class FeedContext(Protocol):
    """What the feed reads of the run's context (src/trainctl/agent/context.py)."""

    projector: Projector
    facts: Any  # its gpu_probe: the machine's GPU

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def spec(self) -> Any: ...  # its job_name

    @property
    def files(self) -> Any: ...  # its dir: the run directory (the run's id is its name)

    def info(self, text: str, key: str = "") -> None: ...

    def load_preset(self, name: str | None) -> Any: ...


class PresetFeed:
    """Subscribed to the bus's journaled events (:meth:`__call__`)."""

    def __init__(self, ctx: FeedContext, history: PresetHistory | None = None) -> None:
        self.ctx = ctx
        self.history = history if history is not None else PresetHistory()
        self.run_id = Path(ctx.files.dir).name
        self.usage = PresetUsage(self.content_of)
        self._contents: dict[str | None, str] = {}
        self._machine: str | None = None
        self._machine_of_run = False  # _machine has the run's own devices' model
        self._earlier: list[Record] = []  # this run's records from before an agent restart
        self._others: list[Record] = []  # the other runs' records of this job
        self._written: float | None = None
        self._failed = False
        self._load()

    def _load(self) -> None:
        try:
            self._earlier = self.history.read_run(self.history.run_file(self.run_id))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, UnicodeDecodeError, TypeError) as e:
            self.ctx.info(
                f"this run's preset history was unreadable ({e}); it starts a fresh record", "preset_history"
            )
        self._others, problems = self.history.read(self.ctx.spec.job_name, exclude_run=self.run_id)
        for text in problems:
            self.ctx.info(text, "preset_history")
        self._publish(self.ctx.clock())

    @property
    def machine(self) -> str:
        """This machine's id with the model of the run's own devices once the watch read
        them (agent/gpus.py); before, the machine's first GPU's (read once)."""
        model = getattr(self.ctx.facts, "gpu_model", None)
        if self._machine is not None and (self._machine_of_run or model is None):
            return self._machine
        if model is not None:
            self._machine, self._machine_of_run = machine_id(model), True
            return self._machine
        probe = self.ctx.facts.gpu_probe  # found by the service before the first attempt
        if probe is None:
            return machine_id()
        sample = probe.sample()
        self._machine = machine_id(getattr(sample, "name", None))
        return self._machine

    def content_of(self, preset: str | None) -> str:
        """The hash of what ``preset`` sets, read once per run and name ("" without one)."""
        if preset not in self._contents:
            try:
                p = self.ctx.load_preset(preset)
            except ConfigError:
                p = None
            self._contents[preset] = preset_content(p)
        return self._contents[preset]

    def __call__(self, ev: E.Event) -> None:
        paying_back = self.usage.paying_back
        self.usage.on_event(ev)
        paid = paying_back and not self.usage.paying_back  # an incident's cost is now known
        due = self._written is None or ev.ts - self._written >= WRITE_EVERY_S
        if ev.type in _AT_ONCE or paid or (due and ev.type in ("progress", "start")):
            self.write(ev.ts)

    # ------------------------------------------------------------------ records
    def records(self, now: float) -> list[Record]:
        """This run's records: what an earlier agent of this run wrote, plus this agent's."""
        mine = {r.key: r for r in self._earlier}
        for (preset, content), tally in self.usage.tallies(now).items():
            key = RecordKey(self.ctx.spec.job_name, self.machine, preset, content)
            r = Record.of_tally(key, tally)
            mine[key] = replace(mine[key].merged(r), runs=1) if key in mine else r  # one run still
        return list(mine.values())

    def write(self, now: float) -> None:
        self._written = now
        records = self.records(now)
        try:
            self.history.write_run(self.run_id, records, now)
            self._failed = False
        except OSError as e:
            if not self._failed:  # once per failing stretch
                self.ctx.info(f"cannot write the preset history {self.history.dir}: {e}", "preset_history")
            self._failed = True
        self._publish(now, records)

    def _publish(self, now: float, mine: list[Record] | None = None) -> None:
        """Each preset's risk (this machine, the content it has now) to the projector."""
        merged: dict[str, Record] = {}
        ours = mine if mine is not None else self.records(now)
        for r in self._others + ours:
            if r.key.machine != self.machine or r.key.content != self.content_of(r.key.preset or None):
                continue
            merged[r.key.preset] = merged[r.key.preset].merged(r) if r.key.preset in merged else r
        shown = {r.key.preset for r in ours}
        risks: dict[str, Risk] = {name: r.risk(this_run=name in shown) for name, r in merged.items()}
        self.ctx.projector.risks = risks
