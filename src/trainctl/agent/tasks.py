"""Supervised background tasks: nothing in the agent stops watching in silence.

An exception in a task is journaled (an ``error`` event, the traceback in
``<run_dir>/errors/``; the same error again within REPEAT_S is counted, not journaled
again) and the task starts again after a pause that grows (0.5 s doubling to 30 s); a task
that keeps failing (``MAX_FAILURES`` within ``WINDOW_S``: minutes, so that a passing
shortage of file descriptors or memory is ridden out) is given up, loudly: ``on_give_up``
is called and the agent ends the run in FAILED with a reason, never silently.
"""

from __future__ import annotations

import asyncio
import os
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path

from trainctl.core import events as E

MAX_FAILURES = 12
WINDOW_S = 600.0
RESTART_PAUSE_S = 0.5
PAUSE_MAX_S = 30.0
REPEAT_S = 60.0


class ErrorReporter:
    """Turns an exception into an ``error`` event with its traceback kept on disk."""

    def __init__(
        self, emit: Callable[[E.Event], E.Event], errors_dir: Path, clock: Callable[[], float]
    ) -> None:
        self.emit = emit
        self.dir = errors_dir
        self.clock = clock
        self.count = 0
        self._recent: dict[tuple[str, str], tuple[float, int]] = {}  # -> (last journaled, repeats since)

    def __call__(self, where: str, exc: BaseException) -> None:
        self.count += 1
        text = f"{type(exc).__name__}: {exc}"[:500]
        now = self.clock()
        last, repeats = self._recent.get((where, text), (None, 0))
        if last is not None and now - last < REPEAT_S:
            self._recent[(where, text)] = (last, repeats + 1)
            return
        self._recent[(where, text)] = (now, 0)
        if repeats:
            text += f" (and {repeats} times more since {REPEAT_S:.0f}s before)"
        path: str | None = None
        try:
            self.dir.mkdir(mode=0o700, exist_ok=True)
            name = self.dir / f"{where}-{int(self.clock())}-{self.count}.txt"
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
            path = str(name)
        except OSError:
            pass  # a full disk: the event still says what failed
        self.emit(E.Error(now, where, text, path))


def supervise(
    name: str,
    factory: Callable[[], Awaitable[None]],
    report: ErrorReporter,
    on_give_up: Callable[[str, BaseException], None] | None = None,
    *,
    max_failures: int = MAX_FAILURES,
    window_s: float = WINDOW_S,
    pause_s: float = RESTART_PAUSE_S,
) -> asyncio.Task:
    """Run ``factory()`` as a task; restart it after an exception, up to ``max_failures``
    within ``window_s`` (loop time: this bounds a crash loop, it is not a policy)."""

    async def run() -> None:
        failures: list[float] = []
        while True:
            try:
                await factory()
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - reported, the task restarts
                report(name, e)
                now = asyncio.get_running_loop().time()
                failures = [t for t in failures if now - t < window_s] + [now]
                if len(failures) >= max_failures:
                    if on_give_up is not None:
                        on_give_up(name, e)
                    return
                await asyncio.sleep(min(PAUSE_MAX_S, pause_s * 2 ** (len(failures) - 1)))

    return asyncio.create_task(run(), name=f"trainctl:{name}")
