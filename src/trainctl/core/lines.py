"""Trainer console output → text lines.  Pure: no I/O, no clock.

:class:`LineSplitter` turns the raw byte stream of a trainer's stdout/stderr into text
lines for :class:`trainctl.core.parse.ConsoleParser`.  It splits on both ``\\r`` and ``\\n``
(tqdm and Ultralytics redraw their bars with ``\\r`` and no newline), removes every control
and escape sequence (:func:`trainctl.core.sanitize.sanitize`), decodes UTF-8 incrementally,
never waits for a newline longer than :data:`MAX_PARTIAL` characters and cuts a line longer
than :data:`~trainctl.core.sanitize.MAX_LINE` (the raw log, written elsewhere, keeps it whole).
"""

from __future__ import annotations

import codecs
import re

from trainctl.core.sanitize import MAX_LINE, cut_line, sanitize, strip_escapes

MAX_PARTIAL = 64 * 1024
"""A line without terminator is cut into pieces of this many characters."""

_SPLIT_RE = re.compile(r"[\r\n]+")
# The bytes of the C0 controls but tab, LF, CR and ESC, and DEL: a chunk without any (and
# without a C1 control, UTF-8 \xc2\x80-\xc2\x9f) needs only its escape sequences removed.
_C0_BYTES = bytes([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x1B), *range(0x1C, 0x20), 0x7F])
_C1_UTF8 = re.compile(rb"\xc2[\x80-\x9f]")


class LineSplitter:
    """Split a byte stream into clean text lines, whatever the chunking.

    ``feed(data)`` returns the lines completed by ``data``; the unterminated tail is kept
    until the next ``\\r``/``\\n`` or :meth:`flush`.  Empty and blank lines are dropped and
    trailing whitespace is removed.  The output does not depend on how the stream was cut:
    an escape sequence split across reads is whole once its line is (a line is only
    sanitised when complete, or when cut at ``max_partial``, where a sequence cut in two
    loses its controls on both sides).  A line is at most ``max_line`` characters.
    """

    def __init__(self, max_partial: int = MAX_PARTIAL, max_line: int = MAX_LINE) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pieces: list[str] = []  # the unterminated tail, in pieces (no quadratic joins)
        self._size = 0
        self._max = max_partial
        self._max_line = max_line
        # Whether the held tail may hold a control other than ESC (then lines get the whole
        # sanitiser, else only escape sequences are removed: the common case, faster), and
        # whether the last chunk ended in \xc2 (a C1 control may be split across reads).
        self._dirty = False
        self._c2 = False

    def feed(self, data: bytes) -> list[str]:
        new = self._decoder.decode(data)
        dirty = (
            (self._c2 and b"\x80" <= data[:1] <= b"\x9f")
            or _C1_UTF8.search(data) is not None
            or len(data.translate(None, _C0_BYTES)) != len(data)
        )
        if data:
            self._c2 = data[-1:] == b"\xc2"
        if "\n" not in new and "\r" not in new:
            self._pieces.append(new)
            self._size += len(new)
            self._dirty |= dirty
            return self._clean(self._cut()) if self._size > self._max else []
        self._pieces.append(new)
        parts = _SPLIT_RE.split("".join(self._pieces))
        tail = parts.pop()
        self._pieces, self._size = [tail], len(tail)
        self._dirty |= dirty
        out = self._clean(parts)
        self._dirty = dirty  # the tail is from this chunk (it follows its last line end)
        if self._size > self._max:
            out.extend(self._clean(self._cut()))
        return out

    def flush(self) -> list[str]:
        """End of stream: return the unterminated tail (and any undecodable bytes) as lines."""
        self._pieces.append(self._decoder.decode(b"", final=True))
        text = "".join(self._pieces)
        self._pieces, self._size = [], 0
        self._dirty = True  # the decoder's last word (U+FFFD) or anything: the whole sanitiser
        out = self._clean(_SPLIT_RE.split(text))
        self._dirty = self._c2 = False
        return out

    @property
    def pending(self) -> int:
        """Characters held back waiting for a line end (never more than ``max_partial``)."""
        return self._size

    def _cut(self) -> list[str]:
        """Cut the tail into ``max_partial`` pieces, keeping the (non-empty) rest."""
        text = "".join(self._pieces)
        n = (len(text) - 1) // self._max * self._max
        pieces = [text[k : k + self._max] for k in range(0, n, self._max)]
        self._pieces, self._size = [text[n:]], len(text) - n
        return pieces

    def _clean(self, parts: list[str]) -> list[str]:
        out = []
        cap = self._max_line
        dirty = self._dirty
        for p in parts:
            if dirty:
                p = sanitize(p)
            elif "\x1b" in p:
                p = strip_escapes(p)
            p = p.rstrip()
            if p:
                out.append(p if len(p) <= cap else cut_line(p, cap))
        return out
