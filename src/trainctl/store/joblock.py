"""One run of a job at a time on a machine: the agent holds an flock on
``<runs dir>/.locks/<job>.lock`` for its whole life and writes its run directory into it.

A node of a torchrun job of several nodes runs as ``JOB-node<N>`` (src/trainctl/agent/prepare.py), so the
lock is one per (job, node rank).

A lock (not a pid file) so that a crashed or killed agent never leaves a stale claim: the
kernel drops the lock with the process.  The fd is not inherited by the trainer (Python
opens files non-inheritable), so orphaned workers never hold it.  The holder of each trainer
keeps the lock while its trainer lives; where the holder was killed too (kill -9 of both),
the lock is free but the run directory it names still has a live trainer (its pid and start
time in trainer-<N>.json): the job counts as running until that trainer ends.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from trainctl.store.paths import make_private_dir, runs_dir

ACQUIRE_WAIT_S = 1.0


class JobBusy(Exception):
    """The job already runs; ``run_dir`` is the holder's run directory (may be '')."""

    def __init__(self, job: str, run_dir: str, unsupervised: int | None = None) -> None:
        self.job, self.run_dir = job, run_dir
        where = f" in {run_dir} (`trainctl attach {run_dir}`)" if run_dir else ""
        if unsupervised is not None:
            where = (
                f" in {run_dir}: its trainer (pid {unsupervised}) runs on unsupervised, its "
                f"agent and holder gone (`trainctl attach {run_dir}` adopts it)"
            )
        super().__init__(
            f"job {job!r} is already running on this machine{where}; stop it "
            f"first (`trainctl ctl {run_dir or 'RUN_DIR'} stop`), or give this "
            "run another name (--name)"
        )

    @classmethod
    def of(cls, job: str, run_dir: str) -> JobBusy:
        """What :func:`holder` found, said: an unsupervised trainer named as such."""
        from trainctl.holder.handle import live_trainer

        st = live_trainer(run_dir) if run_dir else None
        return cls(job, run_dir, st["pid"] if st is not None and not st["holder_alive"] else None)


def lock_path(job: str) -> Path:
    return runs_dir() / ".locks" / f"{job}.lock"


class JobLock:
    def __init__(self, job: str) -> None:
        self.job = job
        self.path = lock_path(job)
        self._fd: int | None = None

    def acquire(self, run_dir: Path | str) -> None:
        """Take the lock for ``run_dir`` or raise :class:`JobBusy` naming the holder."""
        make_private_dir(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + ACQUIRE_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                # `holder()` takes the lock for an instant to look: try again a little
                # while before calling the job busy.
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                holder = _read(fd)
                os.close(fd)
                raise JobBusy(self.job, holder) from None
        before = _read(fd)
        if before and before != str(run_dir) and (orphan := _unsupervised(before)) is not None:
            os.close(fd)
            raise JobBusy(self.job, before, orphan)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(run_dir).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def holder(job: str) -> str | None:
    """The run directory of the live agent running ``job``, '' if it is unknown, or None
    when no agent runs it (nor a trainer left unsupervised: see above).  Only looks (takes
    and drops the lock at once)."""
    path = lock_path(job)
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read(fd)
    else:
        before = _read(fd)
        return before if before and _unsupervised(before) is not None else None
    finally:
        os.close(fd)


def _unsupervised(run_dir: str) -> int | None:
    """The pid of ``run_dir``'s trainer when it lives on while no agent holds the run."""
    from trainctl.holder.handle import live_trainer

    st = live_trainer(run_dir)
    return st["pid"] if st is not None else None


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 4096, 0).decode(errors="replace").strip()
    except OSError:
        return ""
