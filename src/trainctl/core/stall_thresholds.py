"""The stall detector's thresholds: how long a silence may last in each mode (startup,
train, warm-up, the gap between epochs, validation, save, an unknown format), from the
statistics it learned, and those statistics kept across restarts of trainctl
(:meth:`Thresholds.state_dict`).  :mod:`trainctl.core.stall`'s module doc tells the rules.
Pure.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeGuard

FIRST_PHASE_MAX_S = 1800.0


MIN_SAMPLES = 3


STATE_VERSION = 1


class Thresholds:
    """The threshold and learning part of :class:`~trainctl.core.stall.StallDetector` (a
    mixin: the state is the detector's)."""

    train_timeout: float | None
    startup_timeout: float | None
    val_timeout: float | None
    save_timeout: float | None
    floor: float
    factor: float
    phase_factor: float
    startup_grace: float
    startup_max: float
    evidence_window: float
    initial: float
    _train: deque[float]
    _train_peak: float
    _learned: dict[str, deque[float]]
    _phase_start: float
    _evidence_t: float | None
    _evidence: dict[str, int]
    _busy_t: float | None

    if TYPE_CHECKING:  # the output-silence watch's (trainctl.core.stall_silence.SilenceWatch)

        def _silent(self) -> tuple[float, str]: ...

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """The learned statistics (JSON-friendly), to survive a restart of trainctl."""
        out: dict[str, Any] = {
            "version": STATE_VERSION,
            "train": [round(x, 6) for x in self._train],
            "train_peak": round(self._train_peak, 6),
        }
        for k, values in self._learned.items():
            out[k] = [round(x, 6) for x in values]
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; bad or unknown entries are skipped."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            return
        self._train.clear()
        self._train.extend(_good(state.get("train")))
        peak = state.get("train_peak")
        self._train_peak = float(peak) if _is_good(peak) else max(self._train, default=0.0)
        for k, values in self._learned.items():
            values.clear()
            values.extend(_good(state.get(k)))

    def _learn(self, kind: str, seconds: float) -> None:
        if seconds >= 0 and math.isfinite(seconds):
            self._learned[kind].append(seconds)

    def _steady(self) -> tuple[float, str]:
        if self.train_timeout is not None:
            return self.train_timeout, "fixed train timeout"
        samples, what = list(self._train), "batch intervals"
        if len(samples) < MIN_SAMPLES:
            samples += list(self._learned["warmup"])
            what = "batch intervals (warm-up included)"
        if len(samples) < MIN_SAMPLES:
            return max(self.floor, self.initial), "nothing learned yet (default)"
        slowest = max(samples)
        value = self.factor * slowest
        basis = f"{self.factor:g} × slowest of the last {len(samples)} {what} ({slowest:.3g}s)"
        if 2 * self._train_peak > value:
            value, basis = 2 * self._train_peak, f"2 × slowest interval ever ({self._train_peak:.3g}s)"
        if value < self.floor:
            value, basis = self.floor, f"floor ({basis} is below it)"
        return value, basis

    def _first_phase_default(self) -> float:
        return max(self.initial, min(10 * self._steady()[0], FIRST_PHASE_MAX_S))

    def _threshold(self, mode: str, now: float) -> tuple[float, str]:
        if mode == "startup":
            return self._startup()
        if mode == "silence":
            limit, basis = self._silent()
            if self._busy_t is not None and now - self._busy_t < limit:
                # Output silence alone is no hang while the tree works (a long kernel search
                # or compile prints nothing): the start-up's limit then; the silence limit
                # again once the tree has been still as long.
                grace, grace_basis = self._startup()
                if grace > limit:
                    return grace, f"{grace_basis}: the tree is busy, output silence alone is no hang"
            return limit, basis
        if mode == "train":
            return self._steady()
        if mode == "warmup":
            steady, basis = self._steady()
            if self.train_timeout is not None:
                return steady, basis
            warm = self._learned["warmup"]
            if not warm:
                return max(steady, self.initial), "first batches of the run (default)"
            value = self.factor * max(warm)
            if value > steady:
                return value, f"{self.factor:g} × slowest warm-up interval ({max(warm):.3g}s)"
            return steady, basis
        if mode == "pause":  # a silent evaluation every N steps (core/stall.py _pause_due)
            if self.train_timeout is not None:
                return self.train_timeout, "fixed train timeout"
            return self._learned_phase("pause", "pause in training")
        if mode == "boundary":
            if self.train_timeout is not None:
                return max(
                    self.train_timeout, self.val_timeout or 0.0
                ), "fixed train timeout (between epochs)"
            return self._learned_phase("boundary", "gap between epochs")
        fixed = self.val_timeout if mode == "val" else self.save_timeout
        if fixed is not None:
            return fixed, f"fixed {mode} timeout"
        return self._learned_phase(mode, "validation" if mode == "val" else "checkpoint save")

    def _learned_phase(self, kind: str, label: str) -> tuple[float, str]:
        seen = self._learned[kind]
        if not seen:
            return self._first_phase_default(), f"first {label}: nothing learned yet"
        longest = max(seen)
        value = max(self.floor, self.phase_factor * longest)
        if kind in ("boundary", "pause"):
            value = max(value, self._steady()[0])
        return value, f"{self.phase_factor:g} × longest {label} seen ({longest:.3g}s)"

    def _startup(self) -> tuple[float, str]:
        if self.startup_timeout is not None:
            return self.startup_timeout, "fixed startup timeout"
        value, basis = self.startup_grace, "startup grace"
        if self._evidence_t is not None:
            extended = self._evidence_t - self._phase_start + self.evidence_window
            if extended > value:
                value = min(extended, self.startup_max)
                kinds = ", ".join(sorted(self._evidence))
                basis = (
                    f"startup grace extended by evidence of work ({kinds}), at most {self.startup_max:.0f}s"
                )
        seen = self._learned["startup"]
        if seen and 2 * max(seen) > value:
            value, basis = 2 * max(seen), f"2 × longest startup seen ({max(seen):.0f}s)"
        return value, basis


def _is_good(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _good(values: Any) -> Iterable[float]:
    if not isinstance(values, list):
        return ()
    return (float(x) for x in values if _is_good(x))
