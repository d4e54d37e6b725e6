"""The append-only event journal of a run and the progress throttle that keeps it small."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from .events import EPHEMERAL, Event, Progress, decode_at, encode, with_seq
from .paths import open_private


def count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            n += chunk.count(b"\n")
    return n


def journal_lines(path: Path, since: int, upto: int | None = None) -> list[str]:
    """The journal's complete lines with seq in [since, upto) (a line being written is left out)."""
    out = []
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return out
    with f:
        for seq, line in enumerate(f):
            if upto is not None and seq >= upto:
                break
            if seq >= since and line.endswith("\n"):
                out.append(line)
    return out


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
    cannot write (:func:`~trainctl.engine.paths.open_private`), and its lines are counted
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

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._fd, view)
            except OSError:
                if len(view) != len(data):
                    self._torn = True
                self.offset = os.fstat(self._fd).st_size
                raise
            view = view[n:]
            self.offset += n

    def append(self, event: Event) -> Event:
        if event.type in EPHEMERAL:
            raise ValueError(f"{event.type} events are not journaled")
        if self._fd is None:
            raise ValueError("the journal is closed")
        if self._torn:   # end the line a full disk cut short: it counts as one line
            self._write(b"\n")
            self._torn = False
            self.next_seq += 1
        event = with_seq(event, self.next_seq)
        self._write((encode(event) + "\n").encode())
        self.next_seq += 1
        return event

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_events(path: Path, since: int = 0) -> Iterator[Event]:
    """Replay a journal from line `since`; a torn last line (agent killed mid-write) is skipped."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for seq, line in enumerate(f):
            if seq < since:
                continue
            if not line.endswith("\n"):
                break
            try:
                yield decode_at(line, seq)
            except (ValueError, TypeError, KeyError):
                continue


def lines_from(path: Path, offset: int, seq: int, upto: int | None = None
               ) -> Iterator[tuple[int, str, int]]:
    """(seq, line, offset after it) for the journal's complete lines from byte ``offset``
    (where line ``seq`` begins) up to seq ``upto`` (exclusive): a snapshot's tail, without
    reading what the snapshot covers.  A line being written (no newline yet) ends it."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return
    with f:
        f.seek(offset)
        for raw in f:
            if (upto is not None and seq >= upto) or not raw.endswith(b"\n"):
                return
            offset += len(raw)
            yield seq, raw.decode("utf-8", errors="replace"), offset
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
        if (self._last_ts is None or new_epoch or last_of_epoch
                or ev.ts - self._last_ts >= self.interval):
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
