"""The rate of a run: :class:`RateMeter` turns (time, global batch index) points into a
robust recent rate and its band; :class:`RateHistory` keeps measured rates per job and
preset across runs (the only I/O of the projection: its small JSON file).  Used by
:class:`trainctl.core.projection.Projector`.

Speed is the median of recent bucket rates (a pause lands in one bucket and is outvoted);
the ETA band comes from the 10th/90th percentile bucket rates.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainctl.core.statefile import read_text, set_aside, write_atomic


# ---------------------------------------------------------------------------- rate meter
@dataclass(frozen=True)
class RateEstimate:
    rate: float
    low: float | None  # 10th percentile bucket rate (None: too little data for a band)
    high: float | None  # 90th percentile bucket rate
    records: int


def _percentile(sorted_vals: list[float], q: float) -> float:
    """Linear-interpolated percentile of an ascending list (q in 0..1)."""
    pos = q * (len(sorted_vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


class RateMeter:
    """Turns (ts, global batch index) points into a robust recent rate (batches/s).

    Points closer than ``window_s / 1000`` are coalesced so memory stays bounded at any
    speed; a point that does not move forward, or a :meth:`cut` (phase change, stall,
    restart, new epoch), starts a new chain so no interval spans a pause or goes negative.
    """

    def __init__(self, window_s: float = 300.0):
        self.window_s = window_s
        self.min_dt = window_s / 1000.0
        self.records: deque[tuple[float, float, int]] = deque()  # (t_end, dt, batches)
        self._anchor: tuple[float, int] | None = None

    def cut(self) -> None:
        self._anchor = None

    def reset(self) -> None:
        self.records.clear()
        self._anchor = None

    def add(self, ts: float, g: int) -> None:
        if self._anchor is None or g < self._anchor[1] or ts < self._anchor[0]:
            self._anchor = (ts, g)
            return
        t0, g0 = self._anchor
        if g == g0 or ts - t0 < self.min_dt:
            return  # nothing new yet, or too close: the record will span more
        self.records.append((ts, ts - t0, g - g0))
        self._anchor = (ts, g)
        horizon = ts - self.window_s
        while len(self.records) > 16 and self.records[0][0] < horizon:
            self.records.popleft()

    def estimate(self) -> RateEstimate | None:
        if not self.records:
            return None
        horizon = self.records[-1][0] - self.window_s
        recent = [r for r in self.records if r[0] >= horizon]
        if len(recent) < 8:
            recent = list(self.records)[-8:]
        n = len(recent)
        n_buckets = max(1, min(30, n // 4))
        if n_buckets < 3:
            return self._few(recent)
        span = sum(r[1] for r in recent) / n_buckets
        rates: list[float] = []
        dt = db = 0.0
        for _, r_dt, r_db in recent:
            dt += r_dt
            db += r_db
            if dt >= span:
                rates.append(db / dt)
                dt = db = 0.0
        if dt > 0:
            rates.append(db / dt)
        rates.sort()
        return RateEstimate(statistics.median(rates), _percentile(rates, 0.1), _percentile(rates, 0.9), n)

    @staticmethod
    def _few(recent: list[tuple[float, float, int]]) -> RateEstimate:
        """Too few intervals for buckets: the plain ratio, without intervals 4x slower
        than the median (a pause)."""
        per_batch = sorted(dt / db for _, dt, db in recent)
        limit = 4 * statistics.median(per_batch)
        kept = [(dt, db) for _, dt, db in recent if dt / db <= limit]
        return RateEstimate(sum(db for _, db in kept) / sum(dt for dt, _ in kept), None, None, len(recent))


# ---------------------------------------------------------------------------- history
def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


class RateHistory:
    """Measured rates per job and preset across runs, in one small JSON file.

    ``{"version": 1, "jobs": {job: {preset: [{"rate": r, "ts": t}, ...]}}}``; the last
    20 values per preset are kept and :meth:`rate` is the median of the last 5.  Writes
    are atomic (:func:`~trainctl.core.statefile.write_atomic`); a file that is not one to
    read (:func:`~trainctl.core.statefile.read_regular`) or does not parse is set aside
    (``rates.json.corrupt``, named in :attr:`problems`) and counts as empty.
    """

    KEEP = 20
    RECENT = 5
    MAX_FILE = 4 << 20

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._data: dict[str, Any] | None = None
        self.problems: list[str] = []  # a damaged file set aside: one line each, for the caller

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(read_text(self.path, self.MAX_FILE))
            if not isinstance(data, dict) or not isinstance(data.get("jobs"), dict):
                raise ValueError("not a rate history")
        except FileNotFoundError:
            return {"version": 1, "jobs": {}}
        except (OSError, ValueError) as e:  # a FIFO, a device, another user's, torn: set aside
            self.problems.append(set_aside(self.path, e, "rate history"))
            return {"version": 1, "jobs": {}}
        return data

    @staticmethod
    def _entries(data: dict[str, Any], job: str, preset: str) -> list[dict[str, Any]]:
        """The valid entries of one job and preset (anything malformed is dropped)."""
        job_d = data["jobs"].get(job)
        entries = job_d.get(preset) if isinstance(job_d, dict) else None
        if not isinstance(entries, list):
            return []
        return [e for e in entries if isinstance(e, dict) and _positive(e.get("rate"))]

    def rate(self, job: str, preset: str) -> float | None:
        if self._data is None:
            self._data = self._load()
        values = [float(e["rate"]) for e in self._entries(self._data, job, preset)][-self.RECENT :]
        return statistics.median(values) if values else None

    def record(self, job: str, preset: str, rate: float, now: float) -> bool:
        """Append one measured rate; returns False (and keeps going) if it cannot write."""
        if not (math.isfinite(rate) and rate > 0):
            return False
        data = self._load()
        entries = self._entries(data, job, preset)
        entries = (entries + [{"rate": round(rate, 6), "ts": round(now, 3)}])[-self.KEEP :]
        jobs = data["jobs"]
        if not isinstance(jobs.get(job), dict):
            jobs[job] = {}
        jobs[job][preset] = entries
        data["version"] = 1
        self._data = data
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps(data, indent=1), durable=False)
        except OSError:
            return False
        return True
