"""A job's ladder: ``ladder = ["A4", "A2", "B"]`` (presets, fastest first), or a ``[ladder]``
section with ``presets = [...]`` or ``workers = [8, 4, 2, 0]`` (the job's preset with each
worker count, the other settings kept) and ``stable`` (the stable stretch before a step up).

A workers rung is named ``<preset>.w<count>`` (``A.w4``): :func:`rung_preset` makes it from
its base preset, so it needs no file of its own.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trainctl.config.preset import Preset
from trainctl.config.validation import Problems, show

LADDER_KEYS = ("presets", "workers", "stable")
_WORKER_RUNG = re.compile(r"(?P<base>.+)\.w(?P<workers>\d+)\Z")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class LadderCfg:
    """The rungs (preset names, fastest first) and the stable stretch (None: the default,
    the longer of one epoch and the rung above's mean time between hangs)."""

    rungs: tuple[str, ...]
    stable_s: float | None = None


def worker_rungs(preset: str, workers: tuple[int, ...]) -> tuple[str, ...]:
    """The rung names of ``[ladder] workers`` on ``preset``: ``A.w8``, ``A.w4``, ..."""
    return tuple(f"{preset}.w{n}" for n in workers)


def rung_preset(name: str, load: Callable[[str], Preset]) -> Preset:
    """The preset ``name``; a workers rung (``A.w4``) is ``A`` with 4 DataLoader workers."""
    m = _WORKER_RUNG.match(name)
    if m is None:
        return load(name)
    base = load(m["base"])
    loader = dataclasses.replace(base.dataloader, workers=int(m["workers"]))
    return dataclasses.replace(base, name=name, dataloader=loader)


def is_worker_rung(name: str) -> bool:
    return _WORKER_RUNG.match(name) is not None


def _stable(p: Problems, value: Any) -> float | None:
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smh]?)\s*", value) if isinstance(value, str) else None
    seconds = float(value) if type(value) in (int, float) else None
    if m:
        seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        p.add(
            "ladder",
            "stable",
            f'must be seconds > 0 or a string such as "10s", "20m", "2h" (got {show(value)})',
        )
        return None
    return seconds


def _workers(p: Problems, value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, list) or not value:
        p.add(
            "ladder",
            "workers",
            f"must be a non-empty list of worker counts, e.g. [8, 4, 2, 0] (got {show(value)})",
        )
        return None
    for i, n in enumerate(value):
        if type(n) is not int or n < 0:
            p.add("ladder", "workers", f"item {i + 1} must be a worker count >= 0 (got {show(n)})")
            return None
    if len(set(value)) != len(value):
        p.add("ladder", "workers", "a worker count is listed twice")
        return None
    return tuple(value)


def _presets(p: Problems, sec: str | None, key: str, value: Any) -> tuple[str, ...] | None:
    names = p.str_list(sec, key, value)
    if names is None:
        return None
    if not names or not all(n.strip() for n in names):
        p.add(
            sec,
            key,
            'must list presets from the fastest to the safest, e.g. ["A4", "A2", "B"] (got an empty one)',
        )
        return None
    if len(set(names)) != len(names):
        p.add(sec, key, "a preset is listed twice")
        return None
    return names


def job_ladder(
    p: Problems, value: Any, preset: str | None, check: Callable[[str, str], None]
) -> LadderCfg | None:
    """``ladder`` as a list or a ``[ladder]`` table; ``check(key, ref)`` reports a preset that
    cannot be loaded; ``preset``: the job's own (the base of a workers ladder)."""
    if isinstance(value, list):
        rungs = _presets(p, None, "ladder", value)
        for ref in rungs or ():
            check("ladder", ref)
        return None if rungs is None else LadderCfg(rungs)
    if not isinstance(value, Mapping):
        p.add(None, "ladder", f"must be a list of presets or a [ladder] section (got {show(value)})")
        return None
    p.unknown("ladder", value, LADDER_KEYS)
    stable = _stable(p, value["stable"]) if "stable" in value else None
    if ("presets" in value) == ("workers" in value):
        p.add("ladder", None, "give presets = [...] or workers = [...] (one of them, not both)")
        return None
    if "presets" in value:
        rungs = _presets(p, "ladder", "presets", value["presets"])
        for ref in rungs or ():
            check("ladder", ref)
        return None if rungs is None else LadderCfg(rungs, stable)
    workers = _workers(p, value["workers"])
    if preset is None:
        p.add(
            "ladder",
            "workers",
            'needs the job\'s preset (preset = "A"): the rungs are it with each worker count',
        )
        return None
    return None if workers is None else LadderCfg(worker_rungs(preset, workers), stable)
