"""Quoting for the POSIX shell that runs a command on the far side (ssh, a tmux pane).

Shared by :mod:`.ssh` (ssh commands) and :mod:`.tmux` (pane commands), which
otherwise do not need each other's code.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

__all__ = ["quote_argv"]


def quote_argv(argv: Sequence[str]) -> str:
    """One string the remote POSIX shell splits back into exactly `argv`."""
    items = [str(a) for a in argv]
    if not items:
        raise ValueError("empty remote command")
    for a in items:
        if "\0" in a:
            raise ValueError(f"remote argument contains a NUL byte: {a!r}")
    return shlex.join(items)
