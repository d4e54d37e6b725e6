"""Job and run names: what may name a directory, a tmux session and a path on a box.
Pure (the config's job loader and the CLI both check names; `paths` re-exports these)."""

from __future__ import annotations

MAX_NAME = 64
"""The longest job or run name (characters)."""


class BadNameError(ValueError):
    """A job or run name that cannot be used; the message says why."""


def check_name(name: str, what: str = "name") -> str:
    """``name`` when it can name a job or a run (a directory, a tmux session, a path on a
    remote box), else :class:`ValueError` (:class:`BadNameError`) saying why."""
    if not isinstance(name, str) or not name:
        raise BadNameError(f"{what} is empty")
    bad = next((c for c in name if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F), None)
    if bad is not None:
        raise BadNameError(f"{what} {name!r}: control character {bad!r} is not allowed")
    if "/" in name or "\\" in name:
        raise BadNameError(f"{what} {name!r}: '/' and '\\' are not allowed (a name, not a path)")
    if ".." in name:
        raise BadNameError(f"{what} {name!r}: '..' is not allowed")
    if name[0] in "-.":
        raise BadNameError(f"{what} {name!r}: may not start with '{name[0]}'")
    if len(name) > MAX_NAME:
        raise BadNameError(f"{what} {name[:20]!r}...: {len(name)} characters; at most {MAX_NAME}")
    return name
