"""The append-only event journal of a run, its line format, and the progress throttle that
keeps it small.

Lines are the events' JSON (:func:`~trainctl.core.events.encode`, with ``seq``), except
progress, the bulk of a long run (one a second: 864,000 in ten days), which is written
compact (:class:`JournalCodec`)::

    {"ts":1760000123.457,"type":"progress","e":24,"b":12345,"l":[1.2345,2.3456,1.1234],"r":2.41}

``e``/``b`` epoch and batch, ``l`` the losses' values, ``r`` the rate, ``n`` the rank (when
there is one); ``k`` the losses' names, ``E`` epochs and ``B`` batches are written when they
change, at an epoch's first line, and every :data:`RESTATE_EVERY` progress lines, and hold
until restated (their seq is the line number).  Readers (:class:`JournalReader`) read both
this and the full form of older journals; what clients get over the socket is always the
full form (:func:`journal_lines`).

Every reader goes through :func:`raw_lines` and :class:`JournalReader`: a line is read in
bounded memory (at most :data:`MAX_LINE` bytes held; a longer one, or a torn last line of
any size, is passed over in chunks, never held whole), and a line that is not one whole,
well-typed event (a string where a number stands, a torn line ended by a later write) is
skipped and counted (:attr:`JournalReader.unreadable`), never raised: a seq is still the line
number.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

from trainctl.core.events import (
    EPHEMERAL,
    Event,
    Progress,
    check,
    decode_at,
    encode,
    float_or_special,
    from_dict,
    with_seq,
)
from trainctl.store.paths import open_private

RESTATE_EVERY = 1000  # progress lines between two that restate k/E/B (a lost line costs no more)
MAX_LINE = 16 << 20
"""The longest journal line read (an event is ~100 bytes; a traceback a few KB): a longer one
is unreadable, passed over without being held."""
_SKIP_CHUNK = 4 << 20


def raw_lines(f: io.BufferedIOBase) -> Iterator[tuple[bytes | None, int]]:
    """The complete lines of ``f`` (binary) from where it stands, each with its newline, and
    the offset after it; None for a line longer than :data:`MAX_LINE` (passed over in
    chunks, never held whole).  A last line without its newline (being written, or torn)
    ends it, passed over in bounded memory whatever its size."""
    end = f.tell()
    buf: bytearray | None = None
    while True:
        raw = f.readline(MAX_LINE + 1)
        if raw.endswith(b"\n"):
            end += len(raw)
            yield raw, end
            continue
        if len(raw) <= MAX_LINE:  # the end: nothing more, or a line not yet ended
            return
        n = len(raw)
        del raw
        buf = buf or bytearray(_SKIP_CHUNK)  # one buffer, read into: no allocation per chunk
        while True:
            got = f.readinto(buf)
            if not got:  # a torn last line: not a line yet
                return
            i = buf.find(b"\n", 0, got)
            if i >= 0:
                n += i + 1
                break
            n += got
        end += n
        f.seek(end)
        yield None, end


_NUMS = (int, float)
_COUNTS = (int, type(None))  # a count, or none said
_RATES = (int, float, type(None))


class JournalCodec:
    """Writes journal lines: progress compact, against what the lines before restated."""

    def __init__(self) -> None:
        self._said: tuple | None = None  # (names, epochs, batches) last restated
        self._epoch: int | None = None
        self._lines = 0

    def encode(self, event: Event) -> str:
        if type(event) is not Progress:
            return encode(event)
        names = tuple(event.losses)
        said = (names, event.epochs, event.batches)
        d: dict = {"ts": event.ts, "type": "progress", "e": event.epoch, "b": event.batch}
        self._lines += 1
        if said != self._said or event.epoch != self._epoch or self._lines >= RESTATE_EVERY:
            d.update(k=list(names), E=event.epochs, B=event.batches)
            self._said, self._lines = said, 0
        self._epoch = event.epoch
        d["l"] = [
            v if isinstance(v, (int, float)) and v == v and abs(v) != float("inf") else repr(v)
            for v in event.losses.values()
        ]
        if event.rate is not None:
            d["r"] = event.rate
        if event.rank is not None:
            d["n"] = event.rank
        return json.dumps(d, separators=(",", ":"), ensure_ascii=False)


class JournalReader:
    """Reads journal lines of either form, in order (``context``: the last progress before
    the first line read, e.g. a snapshot's; its names, epochs and batches hold until a line
    restates them)."""

    def __init__(self, context: Progress | None = None) -> None:
        self.names: tuple = tuple(context.losses) if context is not None else ()
        self.epochs = context.epochs if context is not None else None
        self.batches = context.batches if context is not None else None
        self.unreadable = 0  # lines skipped by :meth:`event`: not one whole, well-typed event

    def event(self, line: str | bytes | None, seq: int) -> Event | None:
        """The event of line ``seq``, or None (counted in :attr:`unreadable`) when it is not
        one: undecodable, ill-typed, or too long to read (None, from :func:`raw_lines`)."""
        if line is not None:
            try:
                return self.decode_at(line, seq)
            except (ValueError, TypeError, KeyError, RecursionError):
                pass
        self.unreadable += 1
        return None

    def decode_at(self, line: str | bytes, seq: int) -> Event:
        """ValueError (or TypeError, KeyError) for a line that is not one whole event whose
        fields have their types (:func:`~trainctl.core.events.check`)."""
        d = json.loads(line)
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        if d.get("type") == "progress":
            if "l" in d or "e" in d:
                return self._compact(d, seq)
            ev = check(decode_at(line, seq))
            assert isinstance(ev, Progress)  # a "progress" line decodes to one or raises
            self.names, self.epochs, self.batches = tuple(ev.losses), ev.epochs, ev.batches
            return ev
        d["seq"] = seq
        return check(from_dict(d))

    def _compact(self, d: dict, seq: int) -> Progress:
        get = d.get
        ts, epoch, batch, rank, rate = d["ts"], get("e"), get("b"), get("n"), get("r")
        if not (
            type(ts) in _NUMS
            and type(epoch) in _COUNTS
            and type(batch) in _COUNTS
            and type(rank) in _COUNTS
            and type(rate) in _RATES
        ):
            raise ValueError("a progress line with a field of the wrong type")
        if "k" in d:
            names, epochs, batches = d["k"], get("E"), get("B")
            if not (isinstance(names, list) and all(type(k) is str for k in names)):
                raise ValueError("a progress line whose loss names are not strings")
            if not (type(epochs) in _COUNTS and type(batches) in _COUNTS):
                raise ValueError("a progress line whose epochs or batches are not counts")
            self.names, self.epochs, self.batches = tuple(names), epochs, batches
        values = get("l") or []
        if type(values) is not list:
            raise ValueError("a progress line whose losses are not a list")
        for i, v in enumerate(values):
            if type(v) not in _NUMS:
                values[i] = v = float_or_special(v)  # "nan", "inf", "-inf" as the codec writes them
                if type(v) is not float:
                    raise ValueError("a progress line whose losses are not numbers")
        losses = (
            dict(zip(self.names, values)) if len(values) == len(self.names) else {}
        )  # names lost with a torn line: none
        return Progress(ts, epoch, self.epochs, batch, self.batches, losses, rate=rate, rank=rank, seq=seq)

    def skip(self, line: str | bytes | None) -> None:
        """A line not wanted, read for what it restates (a compact line's names, epochs and
        batches come from a compact line before it: the writer restates them first)."""
        if line is not None and ('"k":' in line if isinstance(line, str) else b'"k":' in line):
            try:
                self.decode_at(line, 0)
            except (ValueError, TypeError, KeyError, RecursionError):
                pass

    def wire(self, line: str, seq: int) -> str:
        """The line as clients get it: the full form, with its seq."""
        if '"type":"progress"' in line and '"l":' in line:
            return encode(self.decode_at(line, seq)) + "\n"
        self.skip(line)
        return line

    def wire_or_unreadable(self, raw: bytes | None, seq: int) -> str:
        """:meth:`wire` of a line from :func:`raw_lines`; one that is not an event is sent as
        it is (the client skips and counts it), one too long to read as an empty object."""
        if raw is None:
            return "{}\n"
        line = raw.decode("utf-8", errors="replace")
        try:
            return self.wire(line, seq)
        except (ValueError, TypeError, KeyError, RecursionError):
            return line


def count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            n += chunk.count(b"\n")
    return n


def journal_lines(path: Path, since: int, upto: int | None = None) -> list[str]:
    """The journal's complete lines with seq in [since, upto) as clients get them (progress
    in the full form, with seq; a line being written is left out)."""
    return list(iter_journal_lines(path, since, upto))


def iter_journal_lines(path: Path, since: int, upto: int | None = None) -> Iterator[str]:
    """:func:`journal_lines`, one at a time (a replay of a long journal in bounded memory)."""
    reader = JournalReader()
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except FileNotFoundError:
        return
    with f:
        for seq, (raw, _end) in enumerate(raw_lines(f)):
            if upto is not None and seq >= upto:
                break
            if seq < since:
                reader.skip(raw)
            else:
                yield reader.wire_or_unreadable(raw, seq)


def _count_fd_lines(fd: int) -> int:
    n, offset = 0, 0
    while chunk := os.pread(fd, 1 << 20, offset):
        n += chunk.count(b"\n")
        offset += len(chunk)
    return n


class Journal:
    """`events.jsonl`: one event per line; an event's seq is its 0-based line number.

    Written with plain ``os.write`` so a full disk (ENOSPC) or an I/O error raises OSError
    and loses that event only: a line cut short is ended with a newline at the next write
    that succeeds (it then reads as one undecodable line, skipped on replay), so every
    later seq is still the line number.

    ``offset`` is the journal's size in bytes (where the next line begins once a line cut
    short is ended): what a snapshot covering ``next_seq`` lines records.

    Created with O_EXCL|O_NOFOLLOW, 0600; an existing journal (an adopting agent goes on
    with its run's) is reopened only when it is a regular file of this user that others
    cannot write (:func:`~trainctl.store.paths.open_private`), and its lines are counted
    through the same descriptor (never through a path someone could swap)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        fd = open_private(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        try:
            self.next_seq = _count_fd_lines(fd)
            size = self.offset = os.fstat(fd).st_size
            self._torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        self._codec = JournalCodec()  # its first progress restates names, epochs, batches

    def _write(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(fd, view)
            except OSError:
                if len(view) != len(data):
                    self._torn = True
                self.offset = os.fstat(fd).st_size
                raise
            view = view[n:]
            self.offset += n

    def append(self, event: Event) -> Event:
        if event.type in EPHEMERAL:
            raise ValueError(f"{event.type} events are not journaled")
        fd = self._fd
        if fd is None:
            raise ValueError("the journal is closed")
        if self._torn:  # end the line a full disk cut short: it counts as one line
            self._write(fd, b"\n")
            self._torn = False
            self.next_seq += 1
        if type(event) is Progress:  # as the journal keeps it (ms): live clients see the same
            event = dataclasses.replace(event, ts=round(event.ts, 3), seq=self.next_seq)
        else:
            event = with_seq(event, self.next_seq)
        self._write(fd, (self._codec.encode(event) + "\n").encode())
        self.next_seq += 1
        return event

    def lost(self) -> bool:
        """The journal file is no longer at its path: it, or its run directory, was deleted
        or moved away."""
        from trainctl.holder.main import lost

        return lost(self._fd, self.path)

    def remake(self) -> bool:
        """The journal deleted under us (its run directory removed by mistake): made again
        at its path from what the descriptor still holds, written on from there.  True when
        it was gone (and now is back); OSError when it cannot be made again."""
        from trainctl.holder.main import copy_out, lost

        if self._fd is None or not lost(self._fd, self.path):
            return False
        new = copy_out(self._fd, str(self.path))
        os.close(self._fd)
        self._fd = new
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_events(path: Path, since: int = 0) -> Iterator[Event]:
    """Replay a journal from line `since`; a torn last line (agent killed mid-write) is skipped."""
    reader = JournalReader()
    with open(path, "rb") as f:
        for seq, (raw, _end) in enumerate(raw_lines(f)):
            if seq < since:
                reader.skip(raw)
                continue
            ev = reader.event(raw, seq)
            if ev is not None:
                yield ev


def wire_lines_from(path: Path, offset: int, seq: int, context: Progress | None) -> list[str]:
    """The lines from byte ``offset`` (line ``seq``; ``context``: the last progress before
    it) as clients get them (:func:`journal_lines`)."""
    reader = JournalReader(context)
    return [reader.wire_or_unreadable(raw, n) for n, raw, _end in raw_lines_from(path, offset, seq)]


def raw_lines_from(
    path: Path, offset: int, seq: int, upto: int | None = None
) -> Iterator[tuple[int, bytes | None, int]]:
    """(seq, line, offset after it) for the journal's complete lines from byte ``offset``
    (where line ``seq`` begins) up to seq ``upto`` (exclusive): a snapshot's tail, without
    reading what the snapshot covers.  A line being written (no newline yet) ends it; a line
    too long to read is None (:func:`raw_lines`)."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except FileNotFoundError:
        return
    with f:
        f.seek(offset)
        for raw, end in raw_lines(f):
            if upto is not None and seq >= upto:
                return
            yield seq, raw, end
            seq += 1


class ProgressThrottle:
    """Let progress into the journal at most once per `interval` seconds, plus each epoch's
    last batch and the first batch of an epoch; a held-back event is flushed once it is
    `interval` old, so the journal never lags the trainer by more than that."""

    def __init__(self, interval: float = 1.0):
        self.interval = interval
        self._last_ts: float | None = None
        self._last_epoch: int | None = None
        self._pending: Progress | None = None

    def offer(self, ev: Progress) -> Progress | None:
        last_of_epoch = ev.batch is not None and ev.batch == ev.batches
        new_epoch = ev.epoch != self._last_epoch
        if self._last_ts is None or new_epoch or last_of_epoch or ev.ts - self._last_ts >= self.interval:
            self._admit(ev)
            return ev
        self._pending = ev
        return None

    def flush(self, now: float, force: bool = False) -> Progress | None:
        ev = self._pending
        if ev is not None and (force or self._last_ts is None or now - self._last_ts >= self.interval):
            self._admit(ev)
            return ev
        return None

    def _admit(self, ev: Progress) -> None:
        self._last_ts = ev.ts
        self._last_epoch = ev.epoch
        self._pending = None
