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
import errno
import os
import select
import stat
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


def send(
    fifo: Path,
    environ: Mapping[bytes, bytes],
    gone: Callable[[], bool],
    timeout: float = HANDOVER_S,
) -> None:
    """Write ``environ`` into the FIFO once the agent has opened it; HandoverError when the
    agent ends (``gone``) or does not open it within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as e:
            if e.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise HandoverError(f"cannot hand the environment to the agent: {e}") from None
        if gone():
            raise HandoverError("the agent ended before it took the environment")
        if time.monotonic() > deadline:
            raise HandoverError(f"the agent did not take the environment within {timeout:.0f} s")
        time.sleep(0.02)
    try:
        os.set_blocking(fd, True)
        data = memoryview(encode(environ))
        while data:
            data = data[os.write(fd, data) :]
    except OSError as e:
        raise HandoverError(f"cannot hand the environment to the agent: {e}") from None
    finally:
        os.close(fd)


def receive(fifo: Path, timeout: float = HANDOVER_S) -> dict[bytes, bytes]:
    """The environment the CLI writes into ``fifo`` (the FIFO is removed after);
    HandoverError when nothing complete comes within ``timeout`` seconds."""
    st = os.lstat(fifo)
    if not stat.S_ISFIFO(st.st_mode) or st.st_uid != os.getuid():
        raise HandoverError(f"{fifo}: not a FIFO of this user's")
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    wrote = False  # Linux: a FIFO no writer has opened yet reads as EOF
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise HandoverError(f"no environment came through {fifo} within {timeout:.0f} s")
            ready, _, _ = select.select([fd], [], [], min(left, 0.2))
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if chunk:
                chunks.append(chunk)
                wrote = True
                if sum(map(len, chunks)) > LIMIT:
                    raise HandoverError(
                        f"more than {LIMIT >> 20} MiB came through {fifo}: not an environment"
                    )
            elif wrote:
                return decode(b"".join(chunks))
            else:
                time.sleep(0.02)
    finally:
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
