"""Report phases, progress and checkpoints from any training script to trainctl.

trainctl passes every trainer a side channel: a pipe whose write end's number is in
``TRAINCTL_EVENTS_FD``.  A plain PyTorch script can tell trainctl what it is doing by
writing event lines there — most usefully that it is writing a checkpoint, so that a
restart never kills it halfway through the write::

    from trainctl.engine.report import report_checkpoint, saving

    with saving():                       # phase "save", then back to "train"
        torch.save(state, "last.pt")
    report_checkpoint("last.pt", epoch)  # the next restart resumes from it

Outside trainctl (no ``TRAINCTL_EVENTS_FD``) every call does nothing.  Writing the JSON
lines yourself works the same (``{"ts": ..., "type": "phase", "phase": "save"}``, one per
line; see docs/internals.md).  Progress reported here replaces progress parsed from the
console; phases reported here replace phases parsed from the console.
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

from . import events as E

__all__ = ["report_phase", "report_progress", "report_checkpoint", "saving", "enabled"]

EVENTS_FD_ENV = "TRAINCTL_EVENTS_FD"
EVENTS_PATH_ENV = "TRAINCTL_EVENTS_PATH"
_fd: int | None = None
_opened = False


def _channel() -> int | None:
    global _fd, _opened
    if not _opened:
        _opened = True
        path = os.environ.get(EVENTS_PATH_ENV, "")
        try:
            if path:   # a file in the run directory: it outlives the agent
                _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)
            else:
                fd = int(os.environ.get(EVENTS_FD_ENV, ""))
                os.fstat(fd)
                _fd = fd
        except (ValueError, OSError):
            _fd = None
    return _fd


def enabled() -> bool:
    """True when running under trainctl with a side channel."""
    return _channel() is not None


def _send(event: E.Event) -> None:
    global _fd
    fd = _channel()
    if fd is None:
        return
    data = (E.encode(event) + "\n").encode()
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        _fd = None   # trainctl went away: training goes on without reports


def report_phase(phase: str) -> None:
    """``phase``: startup, train, val, save or finished."""
    _send(E.Phase(time.time(), phase))


def report_progress(epoch: int | None, epochs: int | None, batch: int | None, batches: int | None,
                    losses: dict[str, float] | None = None, rate: float | None = None) -> None:
    """One batch done (1-based numbers).  Once a script reports progress here, trainctl
    ignores the progress it parses from the console."""
    _send(E.Progress(time.time(), epoch, epochs, batch, batches, dict(losses or {}), rate))


def report_checkpoint(path: str | os.PathLike[str], epoch: int | None = None, ok: bool = True,
                      detail: str = "") -> None:
    """A checkpoint was written completely (``ok``): a restart may resume from ``path``."""
    _send(E.Checkpoint(time.time(), str(path), epoch, ok, detail))


@contextlib.contextmanager
def saving(then: str = "train") -> Iterator[None]:
    """Phase ``save`` for the duration of the block, then ``then``."""
    report_phase("save")
    try:
        yield
    finally:
        report_phase(then)
