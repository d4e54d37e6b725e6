"""Blocking calls (journals, squeue, ssh to every host) off the UI thread, in daemon threads:
quitting the dashboard never waits for them (an ssh host that hangs may take its whole
timeout; a Textual thread worker would hold the process's exit that long)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any


def in_background(
    app: Any, call: Callable[[], Any], done: Callable[[Any, BaseException | None], None], name: str
) -> None:
    """``call()`` in a daemon thread, then ``done(result, error)`` on the app's event loop
    (not at all once the app has ended)."""

    def run() -> None:
        try:
            result, error = call(), None
        except Exception as e:  # noqa: BLE001 - handed to done()
            result, error = None, e
        with contextlib.suppress(Exception):  # the app ended meanwhile
            app.call_from_thread(done, result, error)

    threading.Thread(target=run, name=f"trainctl-{name}", daemon=True).start()
