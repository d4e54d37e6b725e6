"""One `emit`, many sinks: the journal first (it gives the event its seq), then whoever
listens (the projector, the clients, the printer; alerts will be one more sink).

A sink that fails never stops the others or the agent.  A journal that cannot be written
(disk full, I/O error) loses those events only: the live sinks still get them, and one
warning says how many were not kept.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from trainctl.core import events as E
from trainctl.store.journal import Journal

Sink = Callable[[E.Event], None]


class EventBus:
    def __init__(self, journal: Journal, clock: Callable[[], float]) -> None:
        self.journal = journal
        self.clock = clock
        self.on_journaled: list[Sink] = []  # journaled events only (the projector)
        self.sinks: list[Sink] = []  # every event, ephemeral ones too (clients)
        self.printers: list[Sink] = []  # journaled events, after the others
        self.dropped = 0  # events the journal could not keep
        self._dropping: str | None = None  # the error, while the journal fails

    def emit(self, ev: E.Event) -> E.Event:
        if ev.type not in E.EPHEMERAL:
            if self._dropping is not None:
                self._close_gap(ev.ts)
            ev = self._journal(ev)
        self._deliver(ev)
        return ev

    def _deliver(self, ev: E.Event) -> None:
        if ev.type not in E.EPHEMERAL:
            for hook in self.on_journaled:
                self._call(hook, ev)
        for sink in self.sinks:
            self._call(sink, ev)
        if ev.type not in E.EPHEMERAL:
            for printer in self.printers:
                self._call(printer, ev)

    def _journal(self, ev: E.Event) -> E.Event:
        try:
            return self.journal.append(ev)
        except (OSError, ValueError) as e:
            self.dropped += 1
            if self._dropping is None:
                self._dropping = str(e)
                self._live(
                    E.Warning(
                        self.clock(),
                        "trainctl.journal_failed",
                        "error",
                        f"cannot write the journal {self.journal.path}: {e}",
                        "Free disk space; supervision goes on, events are not kept until then.",
                        source="trainctl",
                    )
                )
            return ev

    def _close_gap(self, ts: float) -> None:
        """The journal failed before: first say, in it, how many events it lost."""
        gap: E.Event = E.Warning(
            ts,
            "trainctl.journal_gap",
            "warning",
            f"{self.dropped} events were not journaled while the disk was full",
            "The journal has a gap here; train.log and the run went on.",
            source="trainctl",
        )
        try:
            gap = self.journal.append(gap)
        except (OSError, ValueError):
            return  # still failing: the event that follows is counted too
        self._dropping, self.dropped = None, 0
        self._deliver(gap)

    def _live(self, ev: E.Event) -> None:
        """To the live sinks only (the journal is what failed)."""
        for sink in (*self.sinks, *self.printers):
            self._call(sink, ev)

    @staticmethod
    def _call(sink: Sink, ev: E.Event) -> None:
        try:
            sink(ev)
        except Exception as e:  # noqa: BLE001 - a sink's bug must not stop supervision
            try:
                print(
                    f"trainctl: event sink {getattr(sink, '__qualname__', sink)!s} failed: {e!r}",
                    file=sys.stderr,
                    flush=True,
                )
            except (OSError, ValueError):
                pass


class PrinterSink:
    """Print events; a terminal that went away (tmux session killed, ssh gone: EIO or
    EPIPE) stops the printing, never the supervision."""

    def __init__(self, printer: Callable[[E.Event], None]) -> None:
        self.printer: Callable[[E.Event], None] | None = printer

    def __call__(self, ev: E.Event) -> None:
        if self.printer is None:
            return
        try:
            self.printer(ev)
        except (OSError, ValueError):
            self.printer = None
            try:
                fd = os.open(os.devnull, os.O_WRONLY)  # later stray prints must not fail either
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.close(fd)
            except OSError:
                pass
