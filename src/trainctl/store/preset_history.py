"""The history of presets, kept across runs: per job, machine and preset content, the hours
run, batches, and incidents by kind with their measured cost.

One small JSON file per run (``<data dir>/preset-history/<run>.json``), written whole and
atomically by that run's agent only (:meth:`PresetHistory.write_run`); :meth:`read` merges
every run's file.  Two runs of the same job on one machine therefore never lose each
other's hours (no file has two writers), and a run killed with -9 keeps what its last write
held.  A file that does not parse (torn by a crashed disk, edited by hand) is moved aside to
``<run>.json.corrupt`` with a message saying so; every other run's figures are kept and the
next write of that run starts a fresh record.  Each file is read by
:func:`~trainctl.core.statefile.read_regular` (a regular file of the user's, not shared-writable,
at most :data:`MAX_FILE` bytes: a FIFO or a device is refused, never waited on) and every
figure is range-checked (:data:`LIMITS`: finite, non-negative, bounded, so no sum of them
overflows); a history directory another user could write is not read at all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainctl.config.preset import Preset
from trainctl.core.preset_risk import Risk, estimate
from trainctl.core.preset_usage import Tally
from trainctl.core.statefile import UnsafePathError, bounded, check_state_dir, read_text, set_aside
from trainctl.store.paths import data_dir, write_private

VERSION = 1
MAX_FILE = 4 << 20  # one run's records: a few KB
LIMITS = {"hours": 1e6, "batches": 1e15, "costed": 1e12, "incidents": 1e12, "cost_s": 1e12}
"""The largest figure each field may hold (a century of hours, ...): beyond is damage."""
DIR_NAME = "preset-history"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def history_dir() -> Path:
    return data_dir() / DIR_NAME


def content_hash(settings: dict[str, Any]) -> str:
    """A short hash of what a preset sets (canonical JSON): an edited preset is a new record."""
    text = json.dumps(settings, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


_NOT_SETTINGS = ("name", "path", "description", "expected_rate")


def preset_content(preset: Preset | None) -> str:
    """The content hash of what ``preset`` sets (not its name, file, description or declared
    rate); "" without a preset."""
    if preset is None:
        return ""
    return content_hash({k: v for k, v in dataclasses.asdict(preset).items() if k not in _NOT_SETTINGS})


@dataclass(frozen=True)
class RecordKey:
    job: str
    machine: str
    preset: str
    content: str


@dataclass(frozen=True)
class Record:
    """A preset's figures for one job on one machine (one run's, or merged over runs)."""

    key: RecordKey
    hours: float = 0.0
    batches: int = 0
    incidents: dict[str, int] = field(default_factory=dict)
    cost_s: dict[str, float] = field(default_factory=dict)  # summed per part (detection, ...)
    costed: int = 0  # incidents whose cost was measured whole
    runs: int = 1

    @property
    def incident_count(self) -> int:
        return sum(self.incidents.values())

    def risk(self, this_run: bool = False) -> Risk:
        """The estimate (:func:`~trainctl.core.preset_risk.estimate`); the mean cost from the
        costed incidents only.  ``this_run``: the run asking is one of :attr:`runs`."""
        total = sum(self.cost_s.values())
        per = total / self.costed if self.costed else 0.0
        return estimate(self.hours, self.incident_count, per * self.incident_count, self.runs, this_run)

    def merged(self, other: Record) -> Record:
        return Record(
            self.key,
            self.hours + other.hours,
            self.batches + other.batches,
            _add(self.incidents, other.incidents),
            _add(self.cost_s, other.cost_s),
            self.costed + other.costed,
            self.runs + other.runs,
        )

    @classmethod
    def of_tally(cls, key: RecordKey, tally: Tally) -> Record:
        return cls(
            key,
            tally.seconds / 3600.0,
            tally.batches,
            dict(tally.incidents),
            dict(tally.cost_s),
            tally.costed,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": self.key.job,
            "machine": self.key.machine,
            "preset": self.key.preset,
            "content": self.key.content,
            "hours": round(self.hours, 6),
            "batches": self.batches,
            "incidents": self.incidents,
            "cost_s": {k: round(v, 3) for k, v in self.cost_s.items()},
            "costed": self.costed,
        }

    @classmethod
    def from_dict(cls, d: Any) -> Record:
        """Raises ValueError on anything malformed."""
        if not isinstance(d, dict):
            raise ValueError("a record is not an object")
        key = RecordKey(*(_text(d, k) for k in ("job", "machine", "preset", "content")))
        hours, batches, costed = (
            _number(d.get("hours"), "hours"),
            _number(d.get("batches"), "batches"),
            _number(d.get("costed", 0), "costed"),
        )
        incidents = {str(k): int(_number(v, "incidents")) for k, v in _mapping(d.get("incidents")).items()}
        cost_s = {str(k): _number(v, "cost_s") for k, v in _mapping(d.get("cost_s")).items()}
        return cls(key, hours, int(batches), incidents, cost_s, int(costed))


def _add(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def _text(d: dict[str, Any], key: str) -> str:
    v = d.get(key)
    if not isinstance(v, str):
        raise ValueError(f"{key} is not text")
    return v


def _number(v: Any, name: str) -> float:
    return bounded(v, name, LIMITS[name])


def _mapping(v: Any) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValueError("not an object")
    return v


class PresetHistory:
    """The history directory: each run writes its own file, reads merge them all."""

    def __init__(self, path: Path | None = None) -> None:
        self.dir = path if path is not None else history_dir()

    def run_file(self, run_id: str) -> Path:
        return self.dir / f"{_SAFE.sub('_', run_id) or 'run'}.json"

    def write_run(self, run_id: str, records: list[Record], now: float) -> None:
        """This run's records, whole and atomically (raises OSError; the caller says so)."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = {
            "version": VERSION,
            "run": run_id,
            "updated": round(now, 3),
            "records": [r.as_dict() for r in records],
        }
        write_private(self.run_file(run_id), json.dumps(data, indent=1))

    def read_run(self, path: Path) -> list[Record]:
        """One run's records; raises ValueError (or OSError) when the file does not parse."""
        data = json.loads(read_text(path, MAX_FILE))
        if (
            not isinstance(data, dict)
            or data.get("version") != VERSION
            or not isinstance(data.get("records"), list)
        ):
            raise ValueError("not a preset history file of this version")
        return [Record.from_dict(d) for d in data["records"]]

    def read(self, job: str | None = None, exclude_run: str | None = None) -> tuple[list[Record], list[str]]:
        """Every run's records merged per (job, machine, preset, content), sorted, and the
        problems met: a corrupt file is moved aside (its message says where), the rest kept."""
        merged: dict[RecordKey, Record] = {}
        problems: list[str] = []
        skip = self.run_file(exclude_run) if exclude_run is not None else None
        try:
            for folder in (self.dir.parent, self.dir):  # the data directory, then its history
                check_state_dir(folder)
        except UnsafePathError as e:  # not ours to move: said, and nothing in it counted
            return [], [f"preset history not read: {e}; its figures are not counted"]
        for path in sorted(self.dir.glob("*.json")) if self.dir.is_dir() else []:
            if path == skip:
                continue
            try:
                records = self.read_run(path)
            except (OSError, ValueError, UnicodeDecodeError, TypeError) as e:
                problems.append(self._set_aside(path, e))
                continue
            for r in records:
                if job is None or r.key.job == job:
                    merged[r.key] = merged[r.key].merged(r) if r.key in merged else r
        return sorted(
            merged.values(), key=lambda r: (r.key.job, r.key.machine, r.key.preset, -r.hours)
        ), problems

    @staticmethod
    def _set_aside(path: Path, e: BaseException) -> str:
        return set_aside(path, e, "preset history")
