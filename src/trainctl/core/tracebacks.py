"""The trainer's last exception, read from its last output lines (the traceback's tail that
ends with it), for the report of an attempt that failed.  Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_EXC_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)(?::\s.*)?$")
_PY_CANT_OPEN = re.compile(r"^\S+: can't open file .+: \[Errno \d+\] .+$")
_ARGPARSE_ERROR = re.compile(
    r"^[\w.\-]+: error: (?:unrecognized arguments|the following arguments are "
    r"required|argument |invalid choice|one of the arguments)"
)
TRACEBACK_TAIL = 6


def last_exception(lines: Iterable[str]) -> tuple[str | None, tuple[str, ...]]:
    """The trainer's last exception line in ``lines`` (its last output, oldest first) and
    the traceback's tail that ends with it (at most TRACEBACK_TAIL lines); also Python's
    "can't open file" and an argparse usage error, which have no traceback.  (None, ())
    when there is none."""
    lines = [_strip_rank(ln.rstrip()) for ln in lines]  # a rank's own output file's, too
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        if _EXC_LINE.match(line) or _PY_CANT_OPEN.match(line) or _ARGPARSE_ERROR.match(line):
            start = i
            for j in range(i, max(-1, i - 40), -1):
                if lines[j].startswith("Traceback (most recent call last)"):
                    start = j
                    break
            tail = [ln for ln in lines[start : i + 1] if ln.strip()][-TRACEBACK_TAIL:]
            return line, tuple(tail)
    return None, ()


def _strip_rank(line: str) -> str:
    """'[rank0]: ValueError: x' -> 'ValueError: x' (torchrun's and DDP's prefixes)."""
    m = re.match(r"^\[(?:rank|default)\d+\]:\s?", line)
    return line[m.end() :] if m else line
