"""``checkpoint_every = "auto"``: the interval between mid-epoch saves from Young's formula,
``√(2 × save time × mean time between failures)`` (J. W. Young, "A first order
approximation to the optimum checkpoint interval", CACM 1974): saving more often costs more
pauses, less often more work redone after an incident.  Pure: the measured save pauses and
the preset's risk are arguments.

The save time is the median of the recent measured pauses (phase "save" to its checkpoint
event, :class:`SavePauses`); the mean time between failures is the running preset's
estimate (:mod:`trainctl.core.preset_risk`, its prior before any data: one incident in
two hours).  The interval is bounded to :data:`MIN_S` .. :data:`MAX_S` and re-decided only
when it moves by more than :data:`REDECIDE_CHANGE` (no churn on a noisy pause).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from trainctl.core.events import Checkpoint, Event, Phase, Start
from trainctl.core.preset_risk import Risk

MIN_S = 30.0  # never save more often than this
MAX_S = 1800.0  # nor less often
REDECIDE_CHANGE = 0.2  # a new interval within 20 % of the current one is not a change
KEEP_PAUSES = 10  # the save pauses the median is taken over


def young_interval(save_s: float, mean_time_between_s: float) -> float:
    """Young's optimum checkpoint interval (unbounded)."""
    return math.sqrt(2.0 * max(save_s, 0.0) * max(mean_time_between_s, 0.0))


@dataclass(frozen=True)
class IntervalDecision:
    every_s: float  # the interval decided (bounded)
    young_s: float  # Young's interval before the bounds
    save_s: float  # the measured save pause it used
    mean_time_between_h: float  # the preset's mean time between incidents it used
    previous_s: float | None

    def text(self) -> str:
        bound = "" if self.every_s == self.young_s else f", bounded from {self.young_s:.0f} s"
        was = f" (was {self.previous_s:.0f} s)" if self.previous_s is not None else ""
        return (
            f"checkpoint_every auto: {self.every_s:.0f} s{was} = √(2 × {self.save_s:.2f} s save × "
            f"{self.mean_time_between_h:.2f} h between incidents){bound}"
        )


def decide(current_s: float | None, save_s: float | None, risk: Risk) -> IntervalDecision | None:
    """The new interval, or None: no save measured yet, or within :data:`REDECIDE_CHANGE`
    of ``current_s``."""
    if save_s is None or not math.isfinite(save_s) or save_s <= 0:
        return None
    young = young_interval(save_s, risk.mean_time_between_h * 3600.0)
    every = min(max(young, MIN_S), MAX_S)
    if current_s is not None and abs(every - current_s) <= REDECIDE_CHANGE * current_s:
        return None
    return IntervalDecision(every, young, save_s, risk.mean_time_between_h, current_s)


class SavePauses:
    """The save pauses measured from the run's events: a phase "save" to the checkpoint
    event that ends it (an interrupted save is no sample)."""

    def __init__(self) -> None:
        self.pauses: deque[float] = deque(maxlen=KEEP_PAUSES)
        self._since: float | None = None

    def on_event(self, ev: Event) -> bool:
        """True when ``ev`` added a pause."""
        if isinstance(ev, Phase):
            self._since = ev.ts if ev.phase == "save" else None if ev.phase != "train" else self._since
        elif isinstance(ev, Start):
            self._since = None
        elif isinstance(ev, Checkpoint) and self._since is not None:
            if ev.ok:
                self.pauses.append(max(0.0, ev.ts - self._since))
            self._since = None
            return ev.ok
        return False

    def median(self) -> float | None:
        return statistics.median(self.pauses) if self.pauses else None
