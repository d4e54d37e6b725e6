"""The caller's environment handed to an agent started in tmux, through a FIFO.

A tmux session gets the tmux server's environment, not the shell's that ran `trainctl
run`: a server started earlier from another shell would give the trainer its
CUDA_VISIBLE_DEVICES, its keys and its state directories.  So the CLI hands its own
environment over a FIFO in the run directory (``env.fifo``, 0600 in a 0700 directory): the
values pass through the kernel's pipe, never written to disk nor shown in ``ps`` (the
agent's argv names only the FIFO).  The agent reads it before anything else
(:func:`receive`), takes it as its own ``os.environ`` (keeping its own tmux variables), and
removes the FIFO.
"""

from __future__ import annotations

import contextlib
import os
import select
import stat
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

FIFO_NAME = "env.fifo"
HANDOVER_S = 30.0
LIMIT = 16 << 20  # bytes: far past any environment (Linux caps argv + env at ~2 MiB)
AGENT_OWN = ("TMUX", "TMUX_PANE", "TRAINCTL_TMUX_SESSION")
"""What the agent keeps of its own environment: where it runs (the trainer gets them too)."""


class HandoverError(Exception):
    """The environment could not be handed over; the message says why, in one line."""


def make_fifo(run_dir: Path) -> Path:
    """A fresh FIFO for the handover (one left by a dead start is replaced)."""
    path = run_dir / FIFO_NAME
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    os.mkfifo(path, 0o600)
    return path


MAGIC = b"trainctl-env 1\0"


def encode(environ: Mapping[bytes, bytes]) -> bytes:
    """A header, then ``KEY=VALUE`` pairs each ended by NUL (as /proc/PID/environ): any
    bytes survive."""
    pairs = (k + b"=" + v + b"\0" for k, v in environ.items() if b"=" not in k and b"\0" not in k + v)
    return MAGIC + b"".join(pairs)


def decode(data: bytes) -> dict[bytes, bytes]:
    """The environment :func:`encode` wrote; HandoverError for anything else."""
    if not data.startswith(MAGIC):
        raise HandoverError("what came through the environment FIFO is not an environment")
    out = {}
    for pair in data[len(MAGIC) :].split(b"\0"):
        key, eq, value = pair.partition(b"=")
        if key and eq:
            out[key] = value
    return out


GONE_CHECK_S = 0.5
"""How often a waiting :func:`send` asks whether the agent ended (a tmux query: a process)."""


def send(
    fifo: Path,
    environ: Mapping[bytes, bytes],
    gone: Callable[[], bool],
    timeout: float = HANDOVER_S,
) -> None:
    """Write ``environ`` into the FIFO once the agent has opened it; HandoverError when the
    agent ends (``gone``, asked every :data:`GONE_CHECK_S`) or does not open it within
    ``timeout`` seconds.  The wait is the kernel's (a blocking open returns as the agent
    opens its end), in a thread, so the agent's start is never polled for."""
    opened: dict[str, int | OSError] = {}

    def open_writer() -> None:
        try:
            opened["fd"] = os.open(fifo, os.O_WRONLY)  # returns once a reader has opened it
        except OSError as e:
            opened["error"] = e

    waiter = threading.Thread(target=open_writer, name="env-handover", daemon=True)
    waiter.start()
    deadline = time.monotonic() + timeout
    why = None
    while True:
        waiter.join(max(0.0, min(GONE_CHECK_S, deadline - time.monotonic())))
        if not waiter.is_alive():
            break
        if gone():
            why = "the agent ended before it took the environment"
        elif time.monotonic() >= deadline:
            why = f"the agent did not take the environment within {timeout:.0f} s"
        if why is not None:
            _unblock(fifo, waiter)
            fd = opened.get("fd")
            if isinstance(fd, int):
                os.close(fd)
            raise HandoverError(why)
    if isinstance(err := opened.get("error"), OSError):
        raise HandoverError(f"cannot hand the environment to the agent: {err}") from None
    fd = opened["fd"]
    assert isinstance(fd, int)
    try:
        data = memoryview(encode(environ))
        while data:
            data = data[os.write(fd, data) :]
    except OSError as e:
        raise HandoverError(f"cannot hand the environment to the agent: {e}") from None
    finally:
        os.close(fd)


def _unblock(fifo: Path, waiter: threading.Thread) -> None:
    """End the blocking open of a :func:`send` that gives up: open the FIFO's other end."""
    with contextlib.suppress(OSError):
        rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        waiter.join(5)
        os.close(rfd)


def receive(fifo: Path, timeout: float = HANDOVER_S) -> dict[bytes, bytes]:
    """The environment the CLI writes into ``fifo`` (the FIFO is removed after);
    HandoverError when nothing complete comes within ``timeout`` seconds."""
    st = os.lstat(fifo)
    if not stat.S_ISFIFO(st.st_mode) or st.st_uid != os.getuid():
        raise HandoverError(f"{fifo}: not a FIFO of this user's")
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    # A writer of its own until the CLI's data comes: a FIFO no writer holds reads as EOF,
    # so without it the wait for the CLI would be a poll; with it, select waits for the data.
    hold = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise HandoverError(f"no environment came through {fifo} within {timeout:.0f} s")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:  # the CLI's writer closed (its data came first: ``hold`` is gone)
                return decode(b"".join(chunks))
            if hold >= 0:
                os.close(hold)
                hold = -1
            chunks.append(chunk)
            if sum(map(len, chunks)) > LIMIT:
                raise HandoverError(f"more than {LIMIT >> 20} MiB came through {fifo}: not an environment")
    finally:
        if hold >= 0:
            os.close(hold)
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            fifo.unlink()


def take(received: Mapping[bytes, bytes]) -> None:
    """Make ``received`` this process's environment, keeping its own :data:`AGENT_OWN`."""
    own = {}
    for name in AGENT_OWN:
        if (value := os.environb.get(name.encode())) is not None:
            own[name.encode()] = value
    os.environb.clear()
    os.environb.update(received)
    os.environb.update(own)
