"""The agent's snapshot keeper: the run's view, current with every journaled event, and
written to snapshot.json every so often (:data:`EVERY_EVENTS` events, :data:`EVERY_S`
seconds, each state change, the agent's end) from a thread of its own, so the event loop
never waits on a disk.

At the agent's start (an adopting agent, or one going on with an older run's journal) the
view is loaded from the snapshot and the journal after it, or folded from the whole
journal once: :meth:`SnapshotKeeper.prime`, run in an executor.  Events journaled
meanwhile wait and are folded after; a client that asks for a snapshot before then gets
the journal replayed (:meth:`SnapshotKeeper.current` is None).
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainctl.core import events as E
from trainctl.core.runview import RunView
from trainctl.store.journal import Journal
from trainctl.store.snapshot import Covered, load_view, snapshot_doc, tail_hash, write_snapshot

EVERY_EVENTS = 3000  # journaled events between two snapshots (TRAINCTL_SNAPSHOT_EVERY: tests)
EVERY_S = 120.0  # seconds between two snapshots (when events came)


class SnapshotKeeper:
    def __init__(
        self,
        run_dir: Path,
        journal: Journal,
        clock: Callable[[], float],
        *,
        every_events: int | None = None,
        every_s: float = EVERY_S,
    ) -> None:
        if every_events is None:
            try:
                every_events = max(1, int(os.environ.get("TRAINCTL_SNAPSHOT_EVERY", EVERY_EVENTS)))
            except ValueError:
                every_events = EVERY_EVENTS
        self.run_dir = Path(run_dir)
        self.journal = journal
        self.clock = clock
        self.every_events, self.every_s = every_events, every_s
        self.view = RunView()
        self.next_seq = 0
        self.offset = 0
        self.ready = False
        self._waiting: list[E.Event] = []
        self._since_write = 0
        self._last_write = clock()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="snapshot")
        self._writing: concurrent.futures.Future | None = None
        self.written = 0  # snapshots written (tests, benches)

    # ------------------------------------------------------------------ start
    def prime_at(self) -> tuple[int, int]:
        """Where the journal is now (call on the loop, then :meth:`prime` in an executor)."""
        return self.journal.next_seq, self.journal.offset

    def prime(self, upto: tuple[int, int]) -> Covered:
        """The view of the journal up to ``upto`` (snapshot + tail, or the whole journal)."""
        return load_view(self.run_dir, write=False, upto_offset=upto[1])

    def primed(self, covered: Covered) -> None:
        """On the loop: take the loaded view, then fold what was journaled meanwhile."""
        self.view, self.next_seq, self.offset = covered.view, covered.next_seq, covered.offset
        waiting, self._waiting = self._waiting, []
        self.ready = True
        for ev in waiting:
            if ev.seq is not None and ev.seq >= self.next_seq:
                self(ev)
        if not covered.from_snapshot and self.next_seq:
            self.write()  # an older journal: indexed now, once

    # ------------------------------------------------------------------ the bus hook
    def __call__(self, ev: E.Event) -> None:
        if ev.seq is None:
            return  # not journaled (the disk was full): not in a rebuilt view either
        if not self.ready:
            self._waiting.append(ev)
            return
        self.view.apply(ev)
        self.next_seq, self.offset = ev.seq + 1, self.journal.offset
        self._since_write += 1
        if (
            ev.type == "state"
            or self._since_write >= self.every_events
            or self.clock() - self._last_write >= self.every_s
        ):
            self.write()

    def goodput(self, now: float) -> dict[str, Any] | None:
        """The run's goodput up to ``now`` (core/goodput.py totals); None before the view is
        primed."""
        return self.view.goodput.totals(now) if self.ready else None

    def current(self) -> dict[str, Any] | None:
        """The view now and the seq it covers up to, for a client's hello (None before
        the view is primed)."""
        if not self.ready:
            return None
        return {"op": "snapshot", "next_seq": self.next_seq, "view": self.view.to_dict()}

    # ------------------------------------------------------------------ writing
    def write(self) -> None:
        """Write a snapshot of now from the keeper's thread (skipped while one is being
        written: the next event's check writes it)."""
        if not self.ready or (self._writing is not None and not self._writing.done()):
            return
        self._since_write, self._last_write = 0, self.clock()
        view, seq, offset = self.view.to_dict(), self.next_seq, self.offset
        self._writing = self._pool.submit(self._write, view, seq, offset)

    def _write(self, view: dict[str, Any], seq: int, offset: int) -> None:
        tail = tail_hash(self.journal.path, offset)
        if tail is None:
            return  # the journal is not what the view covers (a line cut short)
        try:
            write_snapshot(self.run_dir, snapshot_doc(view, seq, offset, tail))
            self.written += 1
        except OSError as e:  # a full disk: the journal is what counts
            print(
                f"trainctl: cannot write {self.run_dir / 'snapshot.json'}: {e}", file=sys.stderr, flush=True
            )

    def close(self) -> None:
        """The last snapshot (the run's end), written before this returns."""
        if self._writing is not None:
            self._writing.result()
        if self.ready and self._since_write:
            self.write()
        self._pool.shutdown(wait=True)
