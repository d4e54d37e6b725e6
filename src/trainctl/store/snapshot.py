"""`snapshot.json`: the run's :class:`~trainctl.core.runview.RunView` written down, with
the journal position it covers, so a client starts from it and reads only the events after.

The snapshot is derived: the journal stays complete and append-only, and a snapshot that
is torn, corrupt, too big, of another format, or stale (the journal it covers is not the
one there now: shorter, or other bytes before its offset) is ignored and rebuilt from the
journal.  A journal without a snapshot (an older run) is folded once, and the snapshot
written then, when the run directory can be written (:func:`load_view`).

File: ``{"format": 1, "next_seq": N, "offset": B, "tail": H, "written": ts, "view": {...}}``
where the view folds lines 0..N-1, which end at byte B, and H is the SHA-256 of the (at
most) 4 KiB before B.  Written atomically: a temporary file, fsync, rename, fsync of the
directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainctl.core.runview import RunView
from trainctl.core.statefile import write_atomic
from trainctl.store.journal import JournalReader, raw_lines_from
from trainctl.store.paths import open_private

SNAPSHOT_FORMAT = 1
SNAPSHOT_NAME = "snapshot.json"
SNAPSHOT_MAX = 64 << 20  # bytes: a bigger file is not a snapshot this writes
TAIL_CHECK = 4096  # bytes before the offset whose hash says it is the same journal


@dataclass
class Covered:
    """A view and the journal position it covers."""

    view: RunView
    next_seq: int = 0
    offset: int = 0
    from_snapshot: bool = False  # it came from snapshot.json (else folded from line 0)


def snapshot_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / SNAPSHOT_NAME


def tail_hash(journal: Path, offset: int) -> str | None:
    """The hash of the bytes before ``offset``; None when the journal is shorter."""
    try:
        with open(journal, "rb") as f:
            start = max(0, offset - TAIL_CHECK)
            f.seek(start)
            data = f.read(offset - start)
    except OSError:
        return None
    if len(data) != offset - start or (data and not data.endswith(b"\n")):
        return None
    return hashlib.sha256(data).hexdigest()


def snapshot_doc(view: dict[str, Any], next_seq: int, offset: int, tail: str) -> dict[str, Any]:
    return {
        "format": SNAPSHOT_FORMAT,
        "next_seq": next_seq,
        "offset": offset,
        "tail": tail,
        "written": time.time(),
        "view": view,
    }


def write_snapshot(run_dir: Path | str, doc: dict[str, Any]) -> None:
    """Write ``doc`` as the run's snapshot, atomically (OSError when it cannot)."""
    path = snapshot_path(run_dir)
    data = json.dumps(doc, separators=(",", ":")).encode()
    write_atomic(path, data)  # a random temporary name, fsync, rename, fsync of the folder


def read_snapshot(run_dir: Path | str) -> Covered | None:
    """The run's snapshot when it is whole and covers the journal there now, else None."""
    run_dir = Path(run_dir)
    try:
        fd = open_private(snapshot_path(run_dir), os.O_RDONLY)  # the user's, not a link
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(SNAPSHOT_MAX + 1)
        if len(data) > SNAPSHOT_MAX:
            return None
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("format") != SNAPSHOT_FORMAT:
            return None
        next_seq, offset, tail = doc["next_seq"], doc["offset"], doc["tail"]
        if not (
            isinstance(next_seq, int)
            and isinstance(offset, int)
            and next_seq >= 0
            and offset >= 0
            and isinstance(tail, str)
            and isinstance(doc["view"], dict)
        ):
            return None
        if tail_hash(run_dir / "events.jsonl", offset) != tail:
            return None  # stale: another journal, or this one cut shorter
        view = RunView()
        view.load_dict(doc["view"])
        if view.last_seq >= next_seq:
            return None
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return Covered(view, next_seq, offset, from_snapshot=True)


def fold_tail(covered: Covered, journal: Path, upto_offset: int | None = None) -> Covered:
    """Fold the journal's lines after what ``covered`` covers (up to ``upto_offset``); an
    undecodable line is skipped but counted (a seq is a line number)."""
    view, seq, offset = covered.view, covered.next_seq, covered.offset
    reader = JournalReader(view.progress)
    batch = []
    for n, raw, end in raw_lines_from(journal, offset, seq):
        if upto_offset is not None and end > upto_offset:
            break
        seq, offset = n + 1, end
        ev = reader.event(raw, n)
        if ev is None:
            continue
        batch.append(ev)
        if len(batch) >= 4096:
            view.apply_all(batch)
            batch = []
    view.apply_all(batch)
    view.unreadable += reader.unreadable
    covered.next_seq, covered.offset = seq, offset
    return covered


def load_view(run_dir: Path | str, *, write: bool | None = None, upto_offset: int | None = None) -> Covered:
    """The run's view: its snapshot and the journal after it; with no usable snapshot, the
    whole journal folded, and the snapshot written (indexed once) when ``write``, or by
    default when the run directory is this user's and writable (never someone else's)."""
    run_dir = Path(run_dir)
    journal = run_dir / "events.jsonl"
    covered = read_snapshot(run_dir)
    if covered is not None and upto_offset is not None and covered.offset > upto_offset:
        covered = None
    indexing = covered is None
    if covered is None:
        covered = Covered(RunView())
    fold_tail(covered, journal, upto_offset)
    if write is None:
        write = _own_writable(run_dir)
    if write and indexing and covered.next_seq:
        save(run_dir, covered)
    return covered


def _own_writable(run_dir: Path) -> bool:
    try:
        return run_dir.stat().st_uid == os.getuid() and os.access(run_dir, os.W_OK)
    except OSError:
        return False


def save(run_dir: Path | str, covered: Covered) -> bool:
    """Write ``covered`` as the snapshot; False when it cannot (read-only, full disk)."""
    journal = Path(run_dir) / "events.jsonl"
    tail = tail_hash(journal, covered.offset)
    if tail is None:
        return False
    try:
        write_snapshot(run_dir, snapshot_doc(covered.view.to_dict(), covered.next_seq, covered.offset, tail))
    except OSError:
        return False
    return True
