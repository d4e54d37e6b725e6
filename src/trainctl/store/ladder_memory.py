"""Where a job's ladder settled on a machine, for its next run: ``<data dir>/ladder.json``,
``{"<job>@<machine>": {"rungs": [...], "rung": "A2", "ts": ...}}``, written whole and
atomically by the agent after each move.  Read by
:func:`~trainctl.core.statefile.read_regular` (a regular file of the user's, at most
:data:`MAX_FILE` bytes: a FIFO or a device is refused, never waited on).  A file that fails
(not one to read, or not the JSON object it should be) is moved aside to
``ladder.json.corrupt`` and named in :attr:`LadderMemory.problems` (the agent journals it):
the run starts where its job file says, and the next move writes the file again.  A data
directory others could write is not read nor written.  A ladder whose rungs changed starts
afresh."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainctl.core.statefile import UnsafePathError, bounded, check_state_dir, read_text, set_aside
from trainctl.store.paths import data_dir, write_private

FILE_NAME = "ladder.json"
MAX_FILE = 4 << 20  # a rung per job and machine: a few KB
MAX_TS = 1e11  # a time (s since 1970) beyond the year 5000 is damage


def _check_entry(key: str, entry: Any) -> None:
    """ValueError naming ``key`` unless ``entry`` is one this module writes."""
    if not (
        isinstance(entry, dict)
        and isinstance(entry.get("rungs"), list)
        and all(isinstance(r, str) for r in entry["rungs"])
        and isinstance(entry.get("rung"), str)
    ):
        raise ValueError(f"{key!r} is not a ladder entry")
    bounded(entry.get("ts"), f"{key!r} ts", MAX_TS)


class LadderMemory:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or data_dir() / FILE_NAME
        self.problems: list[str] = []  # one line each, said once by the caller

    def _read(self) -> dict[str, Any]:
        try:
            check_state_dir(self.path.parent)
        except UnsafePathError as e:
            self.problems.append(f"ladder memory not read: {e}")
            return {}
        try:
            data = json.loads(read_text(self.path, MAX_FILE))
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            for key, entry in data.items():
                _check_entry(key, entry)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            self.problems.append(set_aside(self.path, e, "ladder memory"))
            return {}
        return data

    def rung(self, job: str, machine: str, rungs: Sequence[str]) -> str | None:
        """The rung remembered for this job, machine and ladder, or None."""
        entry = self._read().get(f"{job}@{machine}")
        if not isinstance(entry, dict) or entry.get("rungs") != list(rungs):
            return None
        rung = entry.get("rung")
        return rung if isinstance(rung, str) and rung in rungs else None

    def remember(self, job: str, machine: str, rungs: Sequence[str], rung: str, ts: float) -> None:
        """OSError (UnsafePathError for a data directory others could write) when it cannot."""
        data = self._read()
        data[f"{job}@{machine}"] = {"rungs": list(rungs), "rung": rung, "ts": ts}
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        check_state_dir(self.path.parent)
        write_private(self.path, json.dumps(data, indent=1))
