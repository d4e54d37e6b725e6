"""Where a job's ladder settled on a machine, for its next run: ``<data dir>/ladder.json``,
``{"<job>@<machine>": {"rungs": [...], "rung": "A2", "ts": ...}}``, written whole and
atomically by the agent after each move.  A file that does not parse is read as empty (the
run starts where its job file says, and the next move writes the file again); a ladder whose
rungs changed starts afresh."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainctl.store.paths import data_dir, read_private, write_private

FILE_NAME = "ladder.json"


class LadderMemory:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or data_dir() / FILE_NAME

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(read_private(self.path))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def rung(self, job: str, machine: str, rungs: Sequence[str]) -> str | None:
        """The rung remembered for this job, machine and ladder, or None."""
        entry = self._read().get(f"{job}@{machine}")
        if not isinstance(entry, dict) or entry.get("rungs") != list(rungs):
            return None
        rung = entry.get("rung")
        return rung if isinstance(rung, str) and rung in rungs else None

    def remember(self, job: str, machine: str, rungs: Sequence[str], rung: str, ts: float) -> None:
        data = self._read()
        data[f"{job}@{machine}"] = {"rungs": list(rungs), "rung": rung, "ts": ts}
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private(self.path, json.dumps(data, indent=1))
