"""``checkpoint_every = "auto"`` inside the trainer: the agent writes the interval it decided
(src/trainctl/agent/checkpoint_auto.py) to ``checkpoint-every.json`` in the run directory;
the trainer's mid-epoch saves follow it (:class:`EveryFollower`, a stat at most every
:data:`POLL_S`), and a restarted attempt starts with the latest one."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from trainctl.core.statefile import bounded, read_text, set_aside

EVERY_FILE = "checkpoint-every.json"
MAX_FILE = 64 << 10  # {"every_s": ..., "preset": ...}
MAX_EVERY_S = 366 * 86400.0  # a year: beyond is damage
POLL_S = 2.0  # how often the trainer looks for a new interval


def every_file(run_dir: Path | str | None) -> Path | None:
    return Path(run_dir) / EVERY_FILE if run_dir is not None else None


def read_every(path: Path) -> float | None:
    """The interval in ``path``; None when it is absent.  A file that is not one to read
    (:func:`~trainctl.core.statefile.read_regular`: a FIFO or a device is refused, never
    waited on) or holds no valid interval (finite, 0 to :data:`MAX_EVERY_S`) is set aside
    (``checkpoint-every.json.corrupt``) with one line on stderr (the run's log): the job's
    interval goes on."""
    try:
        data = json.loads(read_text(path, MAX_FILE))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return bounded(data.get("every_s"), "every_s", MAX_EVERY_S)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        print(f"trainctl: {set_aside(path, e, 'checkpoint interval')}", file=sys.stderr, flush=True)
        return None


class EveryFollower:
    """The current interval: ``every_s`` (the job's) until the file says otherwise."""

    def __init__(
        self, path: Path | None, every_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path, self.every_s, self.clock = path, every_s, clock
        self._polled: float | None = None
        self._mtime: int | None = None

    def __call__(self) -> float:
        now = self.clock()
        if self.path is None or (self._polled is not None and now - self._polled < POLL_S):
            return self.every_s
        self._polled = now
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except OSError:
            return self.every_s
        if mtime != self._mtime:
            self._mtime = mtime
            value = read_every(self.path)
            if value is not None:
                self.every_s = value
        return self.every_s


def follower(run_dir: Path | str | None, every_s: float) -> EveryFollower:
    """The run's interval file followed, from the job's ``every_s``."""
    return EveryFollower(every_file(run_dir), every_s)
