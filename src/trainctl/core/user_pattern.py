"""A job's own ``[progress]`` pattern: compiled by RE2 (linear time whatever the pattern),
read into a :class:`~trainctl.core.reading.Reading`.  Pure: no I/O, no clock.

Its own module (not :mod:`trainctl.core.formats`): the job's configuration compiles it
inside the user's interpreter too (Python 3.8 and newer), where the formats' possessive
regexes (3.11) cannot be compiled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from trainctl.core.reading import Reading


def _f(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


POSITION_GROUPS = ("epoch", "epochs", "batch", "batches")


class PatternError(ValueError):
    """A user pattern that cannot be used; the message says why and what is allowed.
    ``key``: what is wrong, ``pattern`` or ``losses``."""

    def __init__(self, message: str, key: str = "pattern") -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class UserPattern:
    """A job's ``[progress]`` pattern, compiled: named groups epoch/epochs/batch/batches and
    the loss groups (``losses`` named in the job, or any group named ``loss`` or ``loss_*``).
    Compiled by RE2 (:func:`linear_regex`): a match takes time linear in the line, whatever
    the pattern, so no pattern can freeze the agent's supervision."""

    regex: Any  # an re2 pattern: search() and groupdict() as re's
    losses: tuple[str, ...]

    def read(self, line: str) -> Reading | None:
        m = self.regex.search(line)
        if m is None:
            return None
        g = m.groupdict()
        try:
            pos: dict[str, Any] = {k: int(g[k]) if g.get(k) else None for k in POSITION_GROUPS}
        except ValueError:
            return None
        if pos["epoch"] is None and pos["batch"] is None:
            return None
        losses = {}
        for name in self.losses:
            v = _f(g.get(name) or "")
            if v is not None:
                losses[name] = v
        return Reading("user", losses=losses, **pos)


def linear_regex(pattern: str) -> Any:
    """Compile a user's pattern with RE2 (google-re2): matching in linear time (no
    backtracking: a pattern such as ``(a+)+$`` costs what any other does).  RE2 has no
    backreferences nor lookaround; such a pattern is a :class:`PatternError` that says so."""
    try:
        import re2
    except ImportError:  # a dependency of trainctl: only a broken installation lacks it
        raise PatternError(
            "[progress] patterns need the google-re2 package (pip install "
            "google-re2): it matches in linear time"
        ) from None
    options = re2.Options()
    options.log_errors = False  # the error is ours to say, in one line
    try:
        return re2.compile(pattern, options=options)
    except re2.error as exc:
        why = (
            exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        )
        raise PatternError(
            f"not a regular expression RE2 takes: {why} (trainctl matches "
            "[progress] patterns in linear time: no backreferences, no lookaround)"
        ) from None


def compile_user_pattern(pattern: str, losses: tuple[str, ...] | list[str] = ()) -> UserPattern:
    """Compile a ``[progress]`` pattern; :class:`PatternError` says what is wrong."""
    try:
        re.compile(pattern)  # Python's own message for a pattern that is wrong in any engine
    except re.error as exc:
        raise PatternError(f"not a valid regular expression: {exc}") from None
    except RecursionError:
        raise PatternError("not a valid regular expression: nested too deeply") from None
    rx = linear_regex(pattern)
    groups = tuple(rx.groupindex)
    named_losses = tuple(losses)
    unknown_losses = [n for n in named_losses if n not in groups]
    if unknown_losses:
        raise PatternError(
            f"{', '.join(unknown_losses)}: not a named group of the pattern "
            f"(its groups: {', '.join(groups) or 'none'})",
            key="losses",
        )
    loss_groups = tuple(
        dict.fromkeys([*named_losses, *(g for g in groups if g == "loss" or g.startswith("loss_"))])
    )
    unknown = [g for g in groups if g not in POSITION_GROUPS and g not in loss_groups]
    if unknown:
        raise PatternError(
            f"unknown group name(s) {', '.join(unknown)}: a group is one of "
            f"{', '.join(POSITION_GROUPS)}, 'loss', 'loss_<name>', or a name listed in losses"
        )
    if "epoch" not in groups and "batch" not in groups:
        raise PatternError(
            "needs a named group (?P<batch>...) or (?P<epoch>...): what the line says about progress"
        )
    return UserPattern(rx, loss_groups)
