"""What one console line says about training: the :class:`Reading` every format reader
returns (:mod:`trainctl.core.formats`, :mod:`trainctl.core.user_pattern`).  Pure."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Reading:
    """What one line says.  ``phase`` is set (``val``) when the line is an evaluation
    line rather than training progress; then the positions are ignored."""

    fmt: str
    epoch: int | None = None
    epochs: int | None = None
    batch: int | None = None
    batches: int | None = None
    losses: dict[str, float] = field(default_factory=dict)
    phase: str | None = None
