"""The stall detector's output-silence watch: a trainer whose progress format is unknown is
watched by the silence since its last console line, with the healthy silences learned
from its own output (:mod:`trainctl.core.stall`'s module doc tells the rule).  Pure.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

SILENCE_FACTOR = 2.0  # × the high quantile of the intervals between output lines
SILENCE_QUANTILE = 0.99  # ... this one (NVRx learns from intervals the same way)
LONGEST_FACTOR = 1.5  # and never below 1.5 × the longest interval seen (a rare pause)
BURST_GAP_S = 0.5  # a gap this long between lines is a healthy silence (learned)
UNKNOWN_LINES = 20  # this many lines with no progress read: the format is unknown,
UNKNOWN_SPAN_S = 2.0  #   if they span this long at least (a config dump is not output)
UNKNOWN_AFTER_S = 30.0  # or output for this long (2 lines at least)
OUT_WINDOW = 1024  # the intervals kept per output source (rank)


class SourceOutput:
    """The console lines of one source (a rank, or the trainer) before the first batch."""

    __slots__ = ("first_t", "last_t", "lines", "gaps", "unknown")

    def __init__(self, now: float) -> None:
        self.first_t = self.last_t = now
        self.lines = 0
        self.gaps: deque[float] = deque(maxlen=OUT_WINDOW)
        self.unknown = False  # enough output with no progress: its silence is watched


def _quantile(values: Iterable[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``values`` (0.0 when empty)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class SilenceWatch:
    """The output-silence part of :class:`~trainctl.core.stall.StallDetector` (a mixin:
    the state is the detector's, set in its ``reset``)."""

    _phase: str
    _ref: float
    _armed: bool
    _active_t: float
    _idle_armed: bool
    _progressed: bool
    _structured: bool
    _silence: bool
    _outputs: dict[int | None, SourceOutput]
    _learned: dict[str, deque[float]]
    silence_floor: float

    if TYPE_CHECKING:  # the thresholds' (trainctl.core.stall_thresholds.Thresholds)

        def _learn(self, kind: str, seconds: float) -> None: ...

    def on_output(self, now: float, lines: int = 1, source: int | None = None) -> None:
        """``lines`` console lines from ``source`` (a torchrun rank; None: the trainer).
        Before the first batch they are activity, and they teach the intervals of a trainer
        whose progress format is unknown (see the module doc)."""
        if self._phase == "finished" or lines <= 0:
            return
        self._active_t = max(self._active_t, now)
        self._idle_armed = True
        if self._progressed or self._phase != "startup" or self._structured:
            return
        out = self._outputs.get(source)
        if out is None:
            out = self._outputs[source] = SourceOutput(now)
        else:
            gap = now - out.last_t
            if gap >= 0:
                out.gaps.append(gap)
                if gap >= BURST_GAP_S:
                    self._learn("silence", gap)
        out.lines += lines
        out.last_t = max(out.last_t, now)
        if not out.unknown:
            span = out.last_t - out.first_t
            out.unknown = (out.lines >= UNKNOWN_LINES and span >= UNKNOWN_SPAN_S) or (
                out.lines >= 2 and span >= UNKNOWN_AFTER_S
            )
            self._silence = self._silence or out.unknown
        if self._silence:
            self._armed = True

    def on_structured(self) -> None:
        """The trainer speaks on trainctl's side channel (a runner, an integration, a
        script calling report): its progress is not read from the console, so its console
        is no unknown format (until :meth:`reset`)."""
        self._structured = True
        self._silence = False

    @property
    def watching_silence(self) -> bool:
        """The progress format is unknown: output silence is watched (until a first batch)."""
        return self._silence and not self._progressed and self._phase == "startup"

    def _silence_limit(self, out: SourceOutput) -> tuple[float, str]:
        """The silence allowed after a source's last line: SILENCE_FACTOR × the high
        quantile of its intervals (and of the healthy silences learned), at least the floor."""
        gaps = [*out.gaps, *self._learned["silence"]]
        q = _quantile(gaps, SILENCE_QUANTILE)
        value = SILENCE_FACTOR * q
        basis = (
            f"unknown progress format: {SILENCE_FACTOR:g} × the {SILENCE_QUANTILE:g} quantile "
            f"of {len(gaps)} intervals between output lines ({q:.3g}s)"
        )
        longest = max(gaps, default=0.0)
        if LONGEST_FACTOR * longest > value:  # a rare long pause, below the quantile
            value = LONGEST_FACTOR * longest
            basis = (
                f"unknown progress format: {LONGEST_FACTOR:g} × the longest interval "
                f"between output lines ({longest:.3g}s)"
            )
        if value < self.silence_floor:
            value, basis = self.silence_floor, f"floor ({basis} is below it)"
        return value, basis

    def _silent_source(self) -> tuple[int | None, float, float, str]:
        """(source, its last line, its limit, basis) of the watched source whose silence
        ends last: the output is silent only when every watched source is (a torchrun rank
        still printing keeps the job alive; its peers may wait for it)."""
        best: tuple[int | None, float, float, str] | None = None
        for key, out in self._outputs.items():
            if not out.unknown:
                continue
            limit, basis = self._silence_limit(out)
            if best is None or out.last_t + limit > best[1] + best[2]:
                best = (key, out.last_t, limit, basis)
        return best if best is not None else (None, self._ref, self.silence_floor, "floor")

    def _silent(self) -> tuple[float, str]:
        key, _, limit, basis = self._silent_source()
        watched = sorted(k for k, o in self._outputs.items() if o.unknown and k is not None)
        if watched:
            basis = f"{basis}, rank {key}'s (ranks watched: {', '.join(map(str, watched))})"
        return limit, basis
