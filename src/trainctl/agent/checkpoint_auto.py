"""``checkpoint_every = "auto"`` in the agent: after each measured save pause and each change
of the running preset's risk (an incident, a restart, a new preset), Young's interval is
re-decided (:func:`trainctl.core.checkpoint_interval.decide`); a change is written to the
run's ``checkpoint-every.json`` (the trainer follows it: src/trainctl/inside/checkpoint_every.py)
and journaled with its numbers."""

from __future__ import annotations

import json
from pathlib import Path

from trainctl.agent.preset_feed import FeedContext
from trainctl.core import events as E
from trainctl.core.checkpoint_interval import SavePauses, decide
from trainctl.core.preset_risk import estimate
from trainctl.inside.checkpoint_every import every_file
from trainctl.store.paths import write_private

INFO_KEY = "checkpoint.auto"
_RISK_MOVES = ("start", "stall", "restart")


class CheckpointAuto:
    """Subscribed to the bus's journaled events after the preset feed (its risks are fresh)."""

    def __init__(self, ctx: FeedContext) -> None:
        self.ctx = ctx
        self.pauses = SavePauses()
        self.every_s: float | None = None  # the interval decided last (None: the job's default)
        self.preset: str | None = ctx.projector.preset  # the preset the next saves are under
        self.path = every_file(Path(ctx.files.dir))

    def __call__(self, ev: E.Event) -> None:
        if isinstance(ev, (E.Start, E.Restart)) and ev.preset is not None:
            self.preset = ev.preset  # a restart names the next attempt's preset: decide for it
        measured = self.pauses.on_event(ev)
        if measured or ev.type in _RISK_MOVES:
            self.redecide()

    def redecide(self) -> None:
        preset = self.preset
        risk = self.ctx.projector.risks.get(preset or "") or estimate(0.0, 0)
        decision = decide(self.every_s, self.pauses.median(), risk)
        if decision is None or self.path is None:
            return
        try:
            write_private(self.path, json.dumps({"every_s": decision.every_s, "preset": preset}))
        except OSError as e:
            self.ctx.info(f"checkpoint_every auto: cannot write {self.path}: {e}", INFO_KEY)
            return
        self.every_s = decision.every_s
        self.ctx.info(decision.text(), INFO_KEY)
