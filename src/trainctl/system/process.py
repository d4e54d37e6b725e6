"""Process handling: become a subreaper, kill a whole trainer tree, leave no orphans."""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphaned grandchildren (a DataLoader worker whose trainer died) are re-parented to us
    instead of PID 1, so we can still find and kill them. Linux only; False elsewhere."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM, parent: int | None = None) -> None:
    """For a child, between fork and exec (``preexec_fn``): the kernel sends it ``sig`` when
    the parent dies, even by SIGKILL, so a helper never outlives the process that serves it.
    ``parent``: the pid it was forked from; gone already (the child has another parent
    now), ``sig`` at once.  Linux only; elsewhere nothing."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)


def ends_with_us() -> Callable[[], None]:
    """The ``preexec_fn`` of a helper this process starts for itself (the kernel-log reader,
    py-spy, a GPU or Slurm query, the alert sender): SIGKILL when this process dies, so
    none is left behind by an agent killed with -9.  The kernel sends it when the *thread*
    that started the helper ends: start it from a thread that waits for it."""
    return functools.partial(die_with_parent, signal.SIGKILL, os.getpid())


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def signal_name(returncode: int | None) -> str | None:
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"SIG{-returncode}"


@dataclass(frozen=True)
class KillReport:
    pids: tuple[int, ...]  # every process of the tree we saw
    forced: tuple[int, ...]  # those that needed SIGKILL
    survivors: tuple[int, ...]  # still there afterwards (should be empty)
    seconds: float


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _ours(p: psutil.Process) -> bool:
    """``p`` descends from this process: a pid we were handed as a bare number is ours to
    kill only then (the trainer is our child; its orphans are re-parented to us, the
    subreaper).  A pid reused by someone else's process is not."""
    me = os.getpid()
    try:
        return p.pid != me and any(a.pid == me for a in p.parents())
    except psutil.Error:
        return False


PIDFD_SIGNAL_PROCESS_GROUP = 4  # linux/pidfd.h (Linux 6.9+): signal the target's group


class Signaller:
    """Signals processes captured as ``psutil.Process`` objects (pid + create time), never a
    bare pid that may have been reused: through a pidfd opened while the process is known
    to be the captured one (Linux 5.3+), else psutil's create-time check right before
    ``kill``.  Close it (or use it as a context manager) to close the pidfds."""

    def __init__(self, use_pidfd: bool | None = None):
        self.use_pidfd = (
            hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")
            if use_pidfd is None
            else use_pidfd
        )
        self._fds: dict[psutil.Process, int] = {}

    def _pidfd(self, p: psutil.Process) -> int | None:
        fd = self._fds.get(p)
        if fd is not None or not self.use_pidfd:
            return fd
        try:
            fd = os.pidfd_open(p.pid)
        except OSError:
            return None
        if not p.is_running():  # the pid is someone else's now: this fd is theirs
            os.close(fd)
            return None
        self._fds[p] = fd
        return fd

    def send(self, p: psutil.Process, sig: int) -> bool:
        """Signal ``p`` if it is still the captured process; whether a signal went."""
        fd = self._pidfd(p)
        if fd is not None:
            try:
                signal.pidfd_send_signal(fd, sig)
                return True
            except OSError:
                return False  # exited (the fd still names it: nobody else is touched)
        if self.use_pidfd:
            return False  # no fd: gone, or no longer the process we captured
        try:
            if not p.is_running():
                return False
            p.send_signal(sig)  # psutil checks the create time again
            return True
        except psutil.Error:
            return False

    def send_group(self, leader: psutil.Process, pgid: int, sig: int) -> bool:
        """Signal the process group ``pgid`` while its leader is known to be ``leader``
        (the trainer: pgid == its pid).  A bare ``killpg`` only after that check: once the
        leader is gone, the group id may name someone else's group; the caller then
        signals the members it captured, one by one."""
        if leader.pid != pgid:
            return False
        fd = self._pidfd(leader)
        if fd is not None:
            try:
                signal.pidfd_send_signal(fd, sig, None, PIDFD_SIGNAL_PROCESS_GROUP)
                return True
            except OSError as e:
                if e.errno != errno.EINVAL:  # EINVAL: a kernel without the flag
                    return False
        try:
            if not leader.is_running() or os.getpgid(leader.pid) != pgid:
                return False
            os.killpg(pgid, sig)
            return True
        except (OSError, psutil.Error):
            return False

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> Signaller:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _reap(procs, skip: set[int]) -> None:
    """Reap our own zombie children among ``procs`` (orphans re-parented to us), never a
    pid in ``skip``: the trainer has its own reaper (asyncio's child watcher), and a second
    ``waitpid`` would steal its exit status ("Unknown child process", exit 255)."""
    me = os.getpid()
    for p in procs:
        if p.pid in skip:
            continue
        try:
            if p.ppid() != me or p.status() != psutil.STATUS_ZOMBIE or not p.is_running():
                continue
            os.waitpid(p.pid, os.WNOHANG)
        except (psutil.Error, OSError):
            continue


Root = int | psutil.Process


def _capture(root: Root) -> psutil.Process | None:
    """A root handed over as a psutil.Process is taken as is (captured early, it carries
    its create time); a bare pid only when it is a process of ours (see ``_ours``)."""
    if isinstance(root, psutil.Process):
        return root if root.is_running() else None
    try:
        p = psutil.Process(root)
    except psutil.Error:
        return None
    return p if _ours(p) else None


def _collect(
    procs: dict[psutil.Process, None],
    roots: list[psutil.Process],
    pgid: int | None,
    leader: psutil.Process | None,
) -> None:
    """Add to ``procs`` every live root and its descendants, and the members of ``pgid``."""
    for r in roots:
        if not r.is_running():
            continue
        procs.setdefault(r)
        try:
            for c in r.children(recursive=True):
                procs.setdefault(c)
        except psutil.Error:
            continue
    if pgid is None:
        return
    leader_known = leader is not None and leader.is_running()
    for p in psutil.process_iter():
        try:
            # Members of a group whose leader is gone: only our own (re-parented to us).
            if os.getpgid(p.pid) == pgid and (leader_known or _ours(p)):
                procs.setdefault(p)
        except (OSError, psutil.Error):
            continue


def kill_tree(
    pid: Root,
    pgid: int | None = None,
    *,
    grace: float = 10.0,
    extra_roots: tuple[Root, ...] = (),
    reaped_elsewhere: tuple[int, ...] = (),
    at_once: tuple[Root, ...] = (),
) -> KillReport:
    """SIGTERM the process group (and SIGCONT it so stopped members can act on it), wait up
    to `grace`, then SIGKILL the group and every descendant seen — including those that
    left the group or were orphaned to us (`extra_roots`: e.g. our own children other than
    the agent's helpers). Blocking; run it in an executor from async code.

    PID safety: every process is captured as a ``psutil.Process`` (pass the roots as such
    when they were captured earlier; a bare pid counts only while it is our descendant) and
    signalled through a :class:`Signaller`; the group only while its leader (``pgid``'s
    process) is the captured one.  Reaping: ``pid`` itself and ``reaped_elsewhere`` are
    never ``waitpid``-ed (asyncio reaps the trainer); our other zombie children are.

    ``at_once``: processes that hold nothing to save (a deadlocked trainer's DataLoader
    workers), SIGKILLed first: the grace is for the others."""
    t0 = time.monotonic()
    root = _capture(pid)
    root_pid = pid.pid if isinstance(pid, psutil.Process) else pid
    skip = {root_pid, *reaped_elsewhere}
    leader = None
    if pgid is not None:
        leader = root if root is not None and root.pid == pgid else _capture(pgid)
    roots = [p for p in (root, *map(_capture, extra_roots)) if p is not None]
    procs: dict[psutil.Process, None] = {}

    def collect() -> None:
        _collect(procs, roots, pgid, leader)

    with Signaller() as sig:

        def send(signum: int, only: list[psutil.Process] | None = None) -> None:
            if leader is not None and pgid is not None:
                sig.send_group(leader, pgid, signum)
            for p in only if only is not None else list(procs):
                sig.send(p, signum)

        collect()
        first = [p for p in map(_capture, at_once) if p is not None]
        if first:
            for p in first:
                procs.setdefault(p)
            send(signal.SIGKILL, first)
        send(signal.SIGTERM)
        send(signal.SIGCONT)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            _reap(procs, skip)
            collect()
            if not any(_alive(p) for p in procs):
                break
            time.sleep(0.05)
        late = [p for p in procs if _alive(p) and p not in first]
        if late:
            send(signal.SIGKILL, late)
        forced = first + late
        end = time.monotonic() + 5.0
        while time.monotonic() < end:
            _reap(procs, skip)
            collect()
            left = [p for p in procs if _alive(p)]
            if not left:
                break
            send(signal.SIGKILL, left)
            time.sleep(0.05)
        _reap(procs, skip)
    survivors = tuple(p.pid for p in procs if _alive(p))
    return KillReport(
        tuple(sorted(p.pid for p in procs)), tuple(p.pid for p in forced), survivors, time.monotonic() - t0
    )
