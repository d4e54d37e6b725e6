"""Make text that came from the trainer safe to show on a terminal.  Pure, linear time.

Whatever a training script prints reaches the user's terminal (``--headless``, ``attach
--headless``, ``scan``, the dashboard).  :func:`sanitize` keeps printable text (any
Unicode, and tab) and removes everything a terminal would act on:

* every C0 control but tab (BEL, BS, SO/SI, CR, LF, ...) and DEL;
* every C1 control, U+0080-U+009F (8-bit CSI, OSC, ST, ...);
* every escape sequence, well formed or not, the way a VT500-style parser reads it: C0
  controls inside a sequence are executed by a terminal and the sequence goes on, so
  ``ESC BS ] 52;c;... ESC BS \\`` is an OSC 52 (clipboard write) and is removed whole;
  ``ESC c``, ``ESC ( 0``, ``ESC 7``, CSI with any parameters or none, ...;
* whole OSC, DCS, SOS, PM and APC strings (ESC ] / P / X / ^ / _, or their C1 forms), up to
  BEL, ST (U+009C or ESC \\), CAN or SUB, or when unterminated up to the end of the line.

It is one regular expression whose every repetition is possessive, applied with ``sub``:
each match attempt reads only the characters it removes (plus a bounded look at the next
one), so the time is linear in the length of the text.  The output never contains ESC, a
C0 control other than tab, DEL or a C1 control, whatever the input.

:func:`sanitize` is for one line (a line break is a control, removed); :func:`sanitize_text`
keeps line breaks (``\\n``) for multi-line text such as a log excerpt; :func:`strip_ansi`
keeps every run of line breaks (``\\r`` or ``\\n``) as one ``\\n``, for the warning matcher,
which reads each segment as a line.
"""

from __future__ import annotations

import re

# C0 controls a terminal executes inside an escape sequence without ending it: all of C0
# but ESC (restarts the sequence), CAN and SUB (cancel it), and CR/LF (lines are cut there,
# so a sequence never runs over a line end here), plus DEL (ignored).
_X = r"\x00-\x09\x0b\x0c\x0e-\x17\x19\x1c-\x1f\x7f"
_CSI = r"[" + _X + r"\x20-\x3f]*+[\x40-\x7e]?"
_STRING = r"[^\x07\x18\x1a\x1b\x9c\n\r]*+(?:[\x07\x18\x1a\x9c]|\x1b\\)?"
# An escape sequence: ESC, then any of those controls or further ESCs (ESC ESC restarts
# the sequence), then:
_ESC = (
    r"\x1b[" + _X + r"\x1b]*+(?:"
    # CSI: parameters and intermediates (any order, any number), then a final byte; a
    # malformed one (a non-ASCII character, C1, end of line) ends where it stops being one.
    r"\["
    + _CSI
    # OSC, DCS, SOS, PM, APC: the whole string, to its terminator or the end of the line.
    # An ESC inside ends the string (ESC \ is ST; any other ESC starts a new sequence).
    + r"|[\]PX^_]"
    + _STRING
    # Any other escape: intermediates (ESC ( 0, ESC # 8) and a final (ESC c, ESC 7, ESC =),
    # or nothing (a lone ESC: a sequence cut short).
    + r"|["
    + _X
    + r"\x20-\x2f]*+[\x30-\x7e\x18\x1a]?)"
)
_ESC_SEQ = re.compile(_ESC)
_SEQ = re.compile(
    _ESC
    # The 8-bit forms: CSI, and OSC, DCS, SOS, PM, APC.
    + r"|\x9b"
    + _CSI
    + r"|[\x90\x98\x9d\x9e\x9f]"
    + _STRING
    # Any other control: C0 but tab, DEL, C1 (a run of them, up to an ESC or a C1 that
    # opens a sequence).
    + r"|[\x00-\x08\x0a-\x1a\x1c-\x1f\x7f-\x8f\x91-\x97\x99\x9a\x9c]++"
)
_BREAKS_RE = re.compile(r"[\r\n]+")
_NEEDS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
"""A character :func:`sanitize` removes or starts removing at."""


def sanitize(text: str) -> str:
    """``text`` without controls and escape sequences (one line: line breaks removed)."""
    # Fast paths, for speed only (the result is _SEQ.sub's): plain text, and text whose only
    # controls are inside ESC sequences (colours): _ESC_SEQ starts with a literal, which
    # the regex engine finds far faster than the first character of any branch of _SEQ.
    if text.isprintable():
        return text
    if "\x1b" in text:
        rest = _ESC_SEQ.sub("", text)
        if rest.isprintable() or _NEEDS.search(rest) is None:
            return rest
    elif _NEEDS.search(text) is None:
        return text
    return _SEQ.sub("", text)


def strip_escapes(text: str) -> str:
    """:func:`sanitize` for a text known to hold no control but ESC, tab and what ESC
    sequences hold (its result then; faster: no scan for other controls)."""
    return _ESC_SEQ.sub("", text)


def sanitize_text(text: str) -> str:
    """Like :func:`sanitize` for several lines: ``\\n`` (and ``\\r\\n``) line breaks stay,
    as ``\\n``; a lone ``\\r`` is removed (it would overwrite the line on a terminal)."""
    if text.isprintable() or _NEEDS.search(text) is None:
        return text
    return "\n".join(sanitize(line) for line in text.split("\n"))


def strip_ansi(line: str) -> str:
    """``line`` without controls and escape sequences, line breaks kept as segment
    separators (:func:`sanitize` on each segment, joined by ``\\n``).  On a text without
    ``\\r`` or ``\\n`` it is :func:`sanitize`."""
    if line.isprintable():
        return line
    if "\r" in line or "\n" in line:
        return "\n".join(sanitize(seg) for seg in _BREAKS_RE.split(line))
    return sanitize(line)


def needs_sanitize(text: str) -> bool:
    """True when :func:`sanitize` would change ``text`` (it holds a control character)."""
    return not text.isprintable() and _NEEDS.search(text) is not None


MAX_LINE = 4096
"""The longest line (in characters) the parsers and the warning matcher read; a longer line
is cut (:func:`cut_line`) before any pattern sees it.  The raw log keeps it whole."""
CUT_MARK = "…"


def cut_line(line: str, limit: int = MAX_LINE) -> str:
    """``line`` itself when at most ``limit`` characters, else its first ``limit - 1`` and
    ``…`` (so the result is exactly ``limit`` long)."""
    if len(line) <= limit:
        return line
    return line[: limit - 1] + CUT_MARK
