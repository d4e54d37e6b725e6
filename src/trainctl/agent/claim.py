"""The agent's claim on its run, at its start: ``agent.lock`` in the run directory (one agent
per directory: the journal has one writer) and the job lock (one run of a job per machine,
src/trainctl/store/joblock.py), agent.lock first.

An agent that goes on with a run an earlier agent of it began (a Slurm job started again
after its node failed under it) may find them still held by that agent's processes: a node
that stops answering is marked down and its job requeued while they live on, frozen or
still ending (a busy node's kill takes its time; a lock on shared storage outlives a dead
client until the file server's lease ends).  Its plug gives such an agent a wait
(``wait_s``): it waits for them, saying so on its output (once for each), and writes nothing to the
run until it holds both.  Any other agent is told at once (after a moment: a client's probe
holds agent.lock for an instant) that another agent supervises the run."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

from trainctl.store.joblock import JobBusy, JobLock

PROBE_S = 1.0  # a client's probe holds agent.lock an instant: tried again this long first
POLL_S = 0.2  # how often a held lock is tried again while waiting


class RunBusy(Exception):
    """Another agent (or an earlier agent's processes) holds the run; ``str()`` is one line."""


def agent_lock(run_dir: Path, wait_s: float = PROBE_S) -> int | None:
    """One agent per run directory: an flock on agent.lock for the agent's life (the kernel
    drops it when the agent dies, so an adopter can take it); its fd, or None when another
    holds it for ``wait_s``."""
    fd = os.open(run_dir / "agent.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


def claim_run(run_dir: Path, lock: JobLock, *, adopt: bool, wait_s: float, say: Callable[[str], None]) -> int:
    """Take agent.lock, then the job lock for ``run_dir``; agent.lock's fd.  ``adopt``: the
    job lock may stay with the holder of the trainer this agent adopts.  ``wait_s`` (> 0:
    an agent going on with a run an earlier agent began): how long the earlier agent's
    processes may hold either.  RunBusy (one line) when the run stays another's."""
    start = time.monotonic()
    waiting = _Waiting(run_dir, wait_s, say)
    while (fd := agent_lock(run_dir, PROBE_S if wait_s <= 0 else POLL_S)) is None:
        if time.monotonic() - start >= max(PROBE_S, wait_s):
            raise RunBusy(f"another agent supervises {run_dir}{waiting.after()}")
        waiting.say("its agent.lock", time.monotonic() - start)
    while True:
        try:
            lock.acquire(run_dir)
            return fd
        except JobBusy as e:
            ours = e.run_dir == str(run_dir)
            if adopt and ours:  # the holder of the trainer it adopts keeps it
                return fd
            if not ours or wait_s <= 0 or time.monotonic() - start >= wait_s:
                os.close(fd)
                raise RunBusy(f"{e}{waiting.after()}") from None
            waiting.say("its job lock", time.monotonic() - start)
            time.sleep(POLL_S)


class _Waiting:
    """Says once for each lock that it is still held (after :data:`PROBE_S`: not a probe)."""

    def __init__(self, run_dir: Path, wait_s: float, say: Callable[[str], None]) -> None:
        self.run_dir, self.wait_s, self.out = run_dir, wait_s, say
        self.said: set[str] = set()

    def say(self, what: str, waited_s: float) -> None:
        if what in self.said or waited_s < PROBE_S:
            return
        self.said.add(what)
        self.out(
            f"trainctl: {self.run_dir}: {what} is still held by an earlier agent of this run "
            "(its node failed under it, say, and its processes are still ending): waiting up "
            f"to {self.wait_s:.0f} s for them"
        )

    def after(self) -> str:
        return f" (still, after {self.wait_s:.0f} s)" if self.said else ""
