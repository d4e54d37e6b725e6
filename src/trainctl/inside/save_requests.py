"""Save requests inside an instrumented script (Transformers, Lightning): the trainer's half
of the protocol in src/trainctl/inside/report.py (``save-request.json`` + SIGUSR1 to the main pid).

:class:`SaveRequests` installs the SIGUSR1 handler.  On a healthy run the handler only
records the request; the integration's callback takes it (:meth:`SaveRequests.take`) at the
next step end and saves through the library's own mechanism.  A *rescue* request while the
main thread waits for its next batch (a DataLoader worker deadlock: the DataLoader waits
in 5 s slices, so Python runs the handler) cannot wait for a step end that never comes:
:meth:`SaveRequests.install`'s ``on_blocked`` decides what to do then (save, or answer at
once that it cannot), so the agent never waits out its rescue timeout for nothing.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from trainctl.inside import report

PLANNED_HOLD_S = 90.0  # after a planned save: wait this long for the agent's kill
_DATALOADER_FILE = os.path.join("torch", "utils", "data", "dataloader.py")


class SaveRequests:
    """The pending request (``{"id", "kind", "hold"}``) and the handler that records it."""

    def __init__(self) -> None:
        self.main_pid = os.getpid()
        self.pending: dict[str, Any] | None = None
        self.on_blocked: Callable[[dict[str, Any], FrameType | None], None] | None = None
        self.declared = False
        self.refused = False

    def ours(self) -> bool:
        return signal.getsignal(report.SAVE_REQUEST_SIGNAL) == self._handler

    def claim(self) -> bool:
        """Install the handler (from the main thread, when the library's Trainer is made:
        before the library saves and later restores the process's handlers, so that it
        restores ours).  Never over a handler that is not the default: SIGUSR1 is then
        someone else's (a SLURM requeue handler, the script's own)."""
        if self.ours():
            return True
        if threading.current_thread() is not threading.main_thread() or os.getpid() != self.main_pid:
            return False
        if signal.getsignal(report.SAVE_REQUEST_SIGNAL) not in (signal.SIG_DFL, signal.SIG_IGN, None):
            return False
        signal.signal(report.SAVE_REQUEST_SIGNAL, self._handler)
        return True

    def declare(self, on_blocked: Callable[[dict[str, Any], FrameType | None], None] | None = None) -> bool:
        """When training starts: the ``runner.save_on_request`` info (once), when SIGUSR1 is
        still ours; else say once why there are no saves on request.  ``on_blocked(request,
        frame)``: called from the handler for a rescue request while the main thread waits
        for data."""
        self.on_blocked = on_blocked
        if not self.ours() and not self.claim():
            if not self.refused:
                self.refused = True
                report.report_info(
                    f"no saves on request: {signal.Signals(report.SAVE_REQUEST_SIGNAL).name} "
                    f"is handled by {signal.getsignal(report.SAVE_REQUEST_SIGNAL)!r} "
                    "(a SLURM requeue or the script's own handler)",
                    "instrument.no_save_on_request",
                )
            return False
        if not self.declared and report.enabled():
            self.declared = True
            report.report_info("this trainer saves on request", report.SAVE_ON_REQUEST_KEY)
        return self.declared

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.main_pid:
            return  # a forked DataLoader worker inherited the handler
        request = read_request()
        self.pending = request
        if request["kind"] == "rescue" and self.on_blocked is not None and waiting_for_data(frame):
            self.pending = None
            try:
                self.on_blocked(request, frame)
            except Exception as e:  # noqa: BLE001 - never into the interrupted training loop
                report.report_checkpoint(
                    "",
                    None,
                    ok=False,
                    kind="rescue",
                    detail=f"{label(request)}rescue save failed: {type(e).__name__}: {e}",
                )

    def take(self) -> dict[str, Any] | None:
        request, self.pending = self.pending, None
        return request


def read_request() -> dict[str, Any]:
    """The request file; a missing or bad one reads as a rescue without an id."""
    data = report.read_save_request() or {}
    return {
        "id": data.get("id") if type(data.get("id")) is int else None,
        "kind": data.get("kind", "rescue"),
        "hold": data.get("hold") is True,
    }


def waiting_for_data(frame: FrameType | None) -> bool:
    """The interrupted main thread is inside a DataLoader's ``__next__`` (its wait for a
    batch): the model is between two steps."""
    while frame is not None:
        if frame.f_code.co_filename.endswith(_DATALOADER_FILE):
            return True
        frame = frame.f_back
    return False


def label(request: dict[str, Any] | None) -> str:
    """``"request 3: "`` for a checkpoint's detail ("" when it answers none)."""
    if request is None:
        return ""
    return f"request {request['id']}: " if request.get("id") is not None else "request: "


def hold(request: dict[str, Any] | None, clock: Callable[[], float] = time.monotonic) -> None:
    """After a planned save the agent kills and restarts from it: take no step that would be
    redone.  Bounded (:data:`PLANNED_HOLD_S`): without a kill, training goes on."""
    if request is None or request["kind"] != "planned" or not request["hold"]:
        return
    end = clock() + PLANNED_HOLD_S
    while clock() < end:
        time.sleep(0.1)
