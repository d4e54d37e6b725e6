"""Process handling: become a subreaper, kill a whole trainer tree, leave no orphans."""
from __future__ import annotations

import ctypes
import os
import signal
import time
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
    pids: tuple[int, ...]          # every process of the tree we saw
    forced: tuple[int, ...]        # those that needed SIGKILL
    survivors: tuple[int, ...]     # still there afterwards (should be empty)
    seconds: float


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _reap(pids) -> None:
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        except OSError:
            pass


def kill_tree(pid: int, pgid: int | None = None, *, grace: float = 10.0,
              extra_roots: tuple[int, ...] = ()) -> KillReport:
    """SIGTERM the process group (and SIGCONT it so stopped members can act on it), wait up
    to `grace`, then SIGKILL the group and every descendant seen — including those that
    left the group or were orphaned to us (`extra_roots`: e.g. our own children other than
    the agent's helpers). Blocking; run it in an executor from async code."""
    t0 = time.monotonic()
    procs: dict[int, psutil.Process] = {}

    def collect() -> None:
        for root in (pid, *extra_roots):
            try:
                p = psutil.Process(root)
                procs.setdefault(p.pid, p)
            except psutil.Error:
                continue
            for c in descendants(root):
                procs.setdefault(c.pid, c)
        if pgid is not None:
            for p in psutil.process_iter():
                try:
                    if os.getpgid(p.pid) == pgid:
                        procs.setdefault(p.pid, p)
                except (OSError, psutil.Error):
                    continue

    def send(sig: int, only: list[psutil.Process] | None = None) -> None:
        if pgid is not None:
            try:
                os.killpg(pgid, sig)
            except OSError:
                pass
        for p in only if only is not None else list(procs.values()):
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass

    collect()
    send(signal.SIGTERM)
    send(signal.SIGCONT)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(procs)
        collect()
        if not any(_alive(p) for p in procs.values()):
            break
        time.sleep(0.05)
    forced = [p for p in procs.values() if _alive(p)]
    if forced:
        send(signal.SIGKILL, forced)
    end = time.monotonic() + 5.0
    while time.monotonic() < end:
        _reap(procs)
        collect()
        left = [p for p in procs.values() if _alive(p)]
        if not left:
            break
        send(signal.SIGKILL, left)
        time.sleep(0.05)
    _reap(procs)
    survivors = tuple(p.pid for p in procs.values() if _alive(p))
    return KillReport(tuple(sorted(procs)), tuple(p.pid for p in forced), survivors,
                      time.monotonic() - t0)
