"""When a risk warning fires: once per crossing into risk, re-armed only after the projection
has been clearly safe for :data:`REARM_S` (no flapping on a projection that hovers at the
line).  Pure: time is an argument.  Used by :meth:`trainctl.core.projection.Projector.at_risk`,
one latch per kind of risk (deadline, budget).
"""

from __future__ import annotations

from dataclasses import dataclass

REARM_S = 900.0  # a risk warning re-arms after this long clearly safe


@dataclass
class RiskLatch:
    """One kind of risk's warning state: armed (may fire) and since when it has been safe."""

    armed: bool = True
    safe_since: float | None = None

    def update(self, now: float, risky: bool, safe: bool, may_fire: bool) -> bool:
        """Whether a warning fires now: risky, armed and ``may_fire``.  Between risky and
        clearly ``safe`` (the hysteresis band) the safe time restarts."""
        if risky:
            self.safe_since = None
            if self.armed and may_fire:
                self.armed = False
                return True
        elif safe:
            if self.safe_since is None:
                self.safe_since = now
            if not self.armed and now - self.safe_since >= REARM_S:
                self.armed = True
        else:
            self.safe_since = None
        return False
