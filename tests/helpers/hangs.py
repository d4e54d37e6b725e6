"""Small real workloads that hang on purpose, and helpers to run them safely in tests.

Scripts (each documents its argv at the top; all print flushed progress lines
``epoch=E/EE batch=B/BB loss=X`` that trainctl's console parser reads):

* :data:`TRAIN_LOOP` — PyTorch loop with a DataLoader (2 forked workers by default): a
  worker that blocks forever at (epoch, batch), a main thread that blocks or spins,
  SIGSTOP, a worker that dies, a crash; ``--hang-attempt N`` (env ``TRAINCTL_ATTEMPT``),
  ``--checkpoint PATH`` and ``--resume PATH`` for recovery tests.
* :data:`STEADY` — the same shape without torch (starts in ~50 ms): for SIGSTOP, kill and
  restart tests; ``--mp-workers N`` feeds it from plain multiprocessing workers.
* :data:`MIOPEN_SPIN` — prints the MIOpen missing-kdb warning, then spins before any batch.

Use :func:`start_script` (own session, so :func:`kill_group` takes the whole tree) and
always kill in a ``finally`` — or use :func:`running` as a context manager.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import psutil

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TRAIN_LOOP = SCRIPTS / "train_loop.py"
STEADY = SCRIPTS / "steady.py"
MIOPEN_SPIN = SCRIPTS / "miopen_spin.py"

_readers: weakref.WeakKeyDictionary[subprocess.Popen, _Reader] = weakref.WeakKeyDictionary()


class _Reader:
    """Reads a process's stdout in a thread so tests never block on readline."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, args=(proc.stdout,), daemon=True)
        self.thread.start()

    def _run(self, stream) -> None:
        try:
            for line in stream:
                line = line.rstrip("\n")
                self.lines.append(line)
                self.queue.put(line)
        except (OSError, ValueError):
            pass
        self.queue.put(None)


def start_script(
    path: str | os.PathLike,
    *args: str,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
) -> subprocess.Popen:
    """Start ``python -u path *args`` in a new session (its own process group), stdout and
    stderr merged into a text pipe read by a background thread (see :func:`wait_for_line`)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    proc = subprocess.Popen(
        [sys.executable, "-u", str(path), *map(str, args)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=full_env,
        cwd=cwd,
        start_new_session=True,
    )
    _readers[proc] = _Reader(proc)
    return proc


def output(proc: subprocess.Popen) -> list[str]:
    """Every line read so far."""
    reader = _readers.get(proc)
    return list(reader.lines) if reader else []


def wait_for_line(proc: subprocess.Popen, pattern: str, timeout: float = 30.0) -> re.Match:
    """Wait for an output line matching ``pattern`` (regex search); earlier lines count
    too.  Raises TimeoutError (with the output tail) when it does not come."""
    reader = _readers[proc]
    rx = re.compile(pattern)
    for line in list(reader.lines):
        if m := rx.search(line):
            return m
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            line = reader.queue.get(timeout=min(left, 0.5))
        except queue.Empty:
            continue
        if line is None:
            break
        if m := rx.search(line):
            return m
    tail = "\n".join(reader.lines[-15:])
    raise TimeoutError(
        f"no line matching {pattern!r} within {timeout}s (exit code {proc.poll()}); output tail:\n{tail}"
    )


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"):
    """Poll ``predicate()`` until it returns something truthy; TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{what} not reached within {timeout}s")


def kill_group(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """SIGKILL the script's process group and every descendant (also those that left the
    group), then reap it.  Safe to call twice or on a dead process."""
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        family = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for p in family:
        with contextlib.suppress(psutil.Error):
            p.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout)
    psutil.wait_procs(family, timeout=timeout)
    reader = _readers.get(proc)
    if reader is not None:
        reader.thread.join(timeout=timeout)
    if proc.stdout is not None:
        with contextlib.suppress(OSError):
            proc.stdout.close()


@contextlib.contextmanager
def running(path: str | os.PathLike, *args: str, **kw) -> Iterator[subprocess.Popen]:
    """``with running(TRAIN_LOOP, "--hang-at", "1:5") as proc:`` — killed on exit."""
    proc = start_script(path, *args, **kw)
    try:
        yield proc
    finally:
        kill_group(proc)
