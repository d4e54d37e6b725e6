"""Report phases, progress and checkpoints from any training script to trainctl.

trainctl passes every trainer a side channel: a pipe whose write end's number is in
``TRAINCTL_EVENTS_FD``.  A plain PyTorch script can tell trainctl what it is doing by
writing event lines there — most usefully that it is writing a checkpoint, so that a
restart never kills it halfway through the write::

    from trainctl.inside.report import report_checkpoint, saving

    with saving():                       # phase "save", then back to "train"
        torch.save(state, "last.pt")
    report_checkpoint("last.pt", epoch)  # the next restart resumes from it

Save on request (lose minutes, not an epoch).  A script that can save mid-epoch says so
once, then checks for a request at each batch end; trainctl asks for a "planned" save
before a restart it was told to do (restart, preset switch, fallback), and for a "rescue"
save when it finds the run stalled but the main thread still able to run Python (a
DataLoader worker deadlock), then waits a bounded time before killing::

    from trainctl.inside import report

    report.supports_save_on_request(save=lambda kind: save(kind))  # once, in the main thread
    for batch in report.data_wait(loader):       # marks the waits for data (see below)
        step(batch)
        if report.save_requested():              # "planned" | "rescue" | None
            save(report.save_requested())

    def save(kind):
        with report.saving():
            torch.save(state, tmp); os.replace(tmp, path)
        report_checkpoint(path, epoch, batch=batches_done, kind=kind)   # clears the request

The request: trainctl writes ``$TRAINCTL_RUN_DIR/save-request.json`` = ``{"id", "kind",
"ts"}`` (atomically), then sends SIGUSR1 to the trainer's main process only (never its
group: forked DataLoader workers inherit the handler).  The handler only sets a flag — except
while the main thread waits for data inside :func:`data_wait`, the one place a stalled
loop still runs Python: there it calls ``save(kind)`` at once (the model is between two
steps).  Positions: ``epoch`` as in progress (1-based), ``batch`` the batches done in that
epoch (None: the whole epoch is done).

Several ranks (torchrun): every rank reports its progress, tagged with its ``RANK``
(torchrun's environment), to the same file; phases and checkpoints are reported by local
rank 0 only (one rank speaks for its node: a rank 1 saying "train" must not end rank 0's
"save"; with several nodes, each node's local rank 0 reports the checkpoint rank 0 wrote,
so that every node's agent restarts from it).
Save requests are not offered under torchrun: the agent's signal would reach the torchrun
launcher, not a rank, and ranks blocked in a collective could not answer; restarts go on
from the periodic saves.

Outside trainctl (no ``TRAINCTL_EVENTS_FD``) every call does nothing.  Writing the JSON
lines yourself works the same (``{"ts": ..., "type": "phase", "phase": "save"}``, one per
line; see docs/internals.md).  Progress reported here replaces progress parsed from the
console; phases reported here replace phases parsed from the console.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from trainctl.core import events as E
from trainctl.core.statefile import read_text, write_atomic

__all__ = [
    "report_phase",
    "report_progress",
    "report_checkpoint",
    "report_info",
    "report_warning",
    "saving",
    "enabled",
    "supports_save_on_request",
    "save_requested",
    "data_wait",
]

SAVE_ON_REQUEST_KEY = "runner.save_on_request"  # the info a trainer declares it with
SAVE_REQUEST_FILE = "save-request.json"  # in the run directory
SAVE_REQUEST_SIGNAL = signal.SIGUSR1
SAVE_KINDS = ("rescue", "planned")

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
            if path:  # a file in the run directory: it outlives the agent
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


def rank() -> int | None:
    """This process's global rank under torchrun (``RANK``), else None."""
    try:
        return int(os.environ["RANK"])
    except (KeyError, ValueError):
        return None


def _speaks_for_job() -> bool:
    """Phases, checkpoints and infos come from one rank per node, its local rank 0 (each
    node's agent hears its own), or from a single process."""
    try:
        return int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))) == 0
    except ValueError:
        return True


def _send(event: E.Event) -> None:
    global _fd
    if not isinstance(event, (E.Progress, E.Warning)) and not _speaks_for_job():
        return
    fd = _channel()
    if fd is None:
        return
    data = (E.encode(event) + "\n").encode()
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        _fd = None  # trainctl went away: training goes on without reports


def report_phase(phase: str) -> None:
    """``phase``: startup, train, val, save or finished."""
    _send(E.Phase(time.time(), phase))


def report_progress(
    epoch: int | None,
    epochs: int | None,
    batch: int | None,
    batches: int | None,
    losses: dict[str, float] | None = None,
    rate: float | None = None,
) -> None:
    """One batch done (1-based numbers).  Once a script reports progress here, trainctl
    ignores the progress it parses from the console.  Under torchrun it carries the rank."""
    _send(E.Progress(time.time(), epoch, epochs, batch, batches, dict(losses or {}), rate, rank()))


def report_info(text: str, key: str = "") -> None:
    """A fact worth keeping in the run's journal (``key``: a stable name for it)."""
    _send(E.Info(time.time(), text, key))


def report_warning(wid: str, text: str, advice: str = "", severity: str = "warning") -> None:
    """A warning the dashboard shows (``wid``: a stable id)."""
    _send(E.Warning(time.time(), wid, severity, text, advice, source="trainctl"))


def report_checkpoint(
    path: str | os.PathLike[str],
    epoch: int | None = None,
    ok: bool = True,
    detail: str = "",
    batch: int | None = None,
    kind: str = "epoch",
) -> None:
    """A checkpoint was written completely (``ok``): a restart may resume from ``path``.
    ``batch``: batches done in ``epoch`` (None: the epoch is done); ``kind``: epoch,
    periodic, rescue or planned.  A good one answers a pending save request."""
    global _pending
    if ok:
        _pending = None
    _send(E.Checkpoint(time.time(), str(path), epoch, ok, detail, batch, kind))


# ---------------------------------------------------------------------- save on request
_pending: str | None = None  # the kind of the request not answered yet
_save: Callable[[str], None] | None = None
_waiting = False  # the main thread waits for data inside data_wait()
_in_save = False


def write_save_request(
    run_dir: str | os.PathLike[str], rid: int, kind: str, ts: float, hold: bool = False
) -> Path:
    """The agent's side: the request file, atomically (temp + rename, 0600).  ``hold``:
    the agent stops the trainer once the save is reported (a planned restart): a trainer
    that can should take no further batch meanwhile (it would be redone)."""
    path = Path(run_dir) / SAVE_REQUEST_FILE
    write_atomic(
        path, json.dumps({"id": int(rid), "kind": kind, "ts": float(ts), "hold": bool(hold)}), durable=False
    )
    return path


def read_save_request(run_dir: str | os.PathLike[str] | None = None) -> dict | None:
    """The pending request file, or None (missing, unreadable or of another shape)."""
    run_dir = run_dir or os.environ.get("TRAINCTL_RUN_DIR", "")
    if not run_dir:
        return None
    try:
        data = json.loads(read_text(Path(run_dir) / SAVE_REQUEST_FILE, 1 << 16))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("kind") not in SAVE_KINDS:
        return None
    return data


def _on_request(signum, frame) -> None:
    global _pending, _in_save
    req = read_save_request()
    _pending = req["kind"] if req else "rescue"
    if _waiting and _save is not None and not _in_save:
        _in_save = True  # stuck waiting for data: save now, between two steps
        try:
            _save(_pending)
        finally:
            _in_save = False


def supports_save_on_request(save: Callable[[str], None] | None = None) -> bool:
    """Declare that this script honours save requests (once, from the main thread, before
    the DataLoader starts its workers).  ``save(kind)``: called at once when a request comes
    while the main thread waits for data in :func:`data_wait`; otherwise the request waits
    for :func:`save_requested`.  Whether trainctl is listening."""
    global _save
    _save = save
    if threading.current_thread() is threading.main_thread():
        signal.signal(SAVE_REQUEST_SIGNAL, _on_request)
    if not enabled() or rank() is not None:  # torchrun: see the module doc
        return False
    _send(E.Info(time.time(), "this trainer saves on request", SAVE_ON_REQUEST_KEY))
    return True


def save_requested() -> str | None:
    """The kind of the pending save request ("planned" or "rescue"), or None; a good
    :func:`report_checkpoint` clears it."""
    return _pending


def data_wait(batches: Iterable) -> Iterator:
    """``batches``' items; the time spent waiting for each one is a wait for data, where a
    save request is served at once (by ``save`` of :func:`supports_save_on_request`)."""
    global _waiting
    it = iter(batches)
    while True:
        _waiting = True
        try:
            item = next(it)
        except StopIteration:
            return
        finally:
            _waiting = False
        yield item


@contextlib.contextmanager
def saving(then: str = "train") -> Iterator[None]:
    """Phase ``save`` for the duration of the block, then ``then``."""
    report_phase("save")
    try:
        yield
    finally:
        report_phase(then)
