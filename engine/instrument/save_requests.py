"""Save requests inside an instrumented script (Transformers, Lightning): the trainer's half
of the protocol in engine/report.py (``save-request.json`` + SIGUSR1 to the main pid).

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

from .. import report

PLANNED_HOLD_S = 90.0      # after a planned save: wait this long for the agent's kill
_DATALOADER_FILE = os.path.join("torch", "utils", "data", "dataloader.py")


class SaveRequests:
    """The pending request (``{"id", "kind", "hold"}``) and the handler that records it."""

    def __init__(self) -> None:
        self.main_pid = os.getpid()
        self.pending: dict[str, Any] | None = None
        self.on_blocked: Callable[[dict[str, Any], FrameType | None], None] | None = None
        self.installed = False

    def install(self, on_blocked: Callable[[dict[str, Any], FrameType | None], None] | None = None) -> bool:
        """The handler (main thread only; once) and the ``runner.save_on_request`` info.
        ``on_blocked(request, frame)``: called from the handler for a rescue request while
        the main thread waits for data.  Whether the agent is listening."""
        self.on_blocked = on_blocked
        if self.installed:
            return report.enabled()
        if threading.current_thread() is not threading.main_thread():
            return False
        signal.signal(report.SAVE_REQUEST_SIGNAL, self._handler)
        self.installed = True
        if not report.enabled():
            return False
        report.report_info("this trainer saves on request", report.SAVE_ON_REQUEST_KEY)
        return True

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.main_pid:
            return   # a forked DataLoader worker inherited the handler
        request = read_request()
        self.pending = request
        if request["kind"] == "rescue" and self.on_blocked is not None and waiting_for_data(frame):
            self.pending = None
            self.on_blocked(request, frame)

    def take(self) -> dict[str, Any] | None:
        request, self.pending = self.pending, None
        return request


def read_request() -> dict[str, Any]:
    """The request file; a missing or bad one reads as a rescue without an id."""
    data = report.read_save_request() or {}
    return {"id": data.get("id") if type(data.get("id")) is int else None,
            "kind": data.get("kind", "rescue"), "hold": data.get("hold") is True}


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


def version_tuple(version: str) -> tuple[int, ...]:
    """``"5.24.0.dev0"`` -> (5, 24, 0): the leading numbers."""
    out: list[int] = []
    for part in version.split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
        if len(digits) != len(part):
            break
    return tuple(out)


def in_range(version: str, low: tuple[int, ...], high: tuple[int, ...]) -> bool:
    """``low <= version < high``."""
    v = version_tuple(version)
    return bool(v) and low <= v < high


def preset_dataloader(environ: dict[str, str] | os._Environ = os.environ) -> dict[str, Any]:
    """The preset's ``[dataloader]`` values this attempt runs with (only those set), from the
    ``TRAINCTL_*`` exports of ``Preset.child_env``."""
    out: dict[str, Any] = {}
    for key, env, conv in (("workers", "TRAINCTL_WORKERS", int),
                           ("persistent_workers", "TRAINCTL_PERSISTENT_WORKERS", lambda v: v not in ("0", "false", "")),
                           ("prefetch_factor", "TRAINCTL_PREFETCH_FACTOR", int),
                           ("multiprocessing_context", "TRAINCTL_MP_CONTEXT", str),
                           ("sharing_strategy", "TRAINCTL_SHARING_STRATEGY", str)):
        raw = environ.get(env)
        if raw is None or raw == "":
            continue
        try:
            out[key] = conv(raw)
        except ValueError:
            continue
    return out


def apply_sharing_strategy(settings: dict[str, Any]) -> str | None:
    """``sharing_strategy`` is process-wide: set it now.  What was set, or None."""
    strategy = settings.get("sharing_strategy")
    if not strategy:
        return None
    import torch.multiprocessing
    torch.multiprocessing.set_sharing_strategy(strategy)
    return strategy


def resume_target(environ: dict[str, str] | os._Environ = os.environ) -> str | None:
    """The checkpoint the agent says this attempt resumes from (``TRAINCTL_RESUME_FROM``)."""
    return environ.get("TRAINCTL_RESUME_FROM") or None


class Throttle:
    """At most one progress report per ``every_s`` (the last one always goes out on flush)."""

    def __init__(self, every_s: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self.last = float("-inf")

    def due(self, force: bool = False) -> bool:
        now = self.clock()
        if force or now - self.last >= self.every_s:
            self.last = now
            return True
        return False
