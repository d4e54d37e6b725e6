"""Probes: the trainer's process tree (psutil + /proc).  The GPU's are in
:mod:`trainctl.system.gpu`.

Worker heuristic (:func:`classify_role`): the root pid is ``main``.  A descendant is a
``worker`` when it is a Python multiprocessing child — its command line carries
``multiprocessing.spawn``/``spawn_main``/``--multiprocessing-fork`` (the spawn and
forkserver start methods), or it has the same command line as its parent (the fork start
method copies the parent, so a forked DataLoader worker looks like the trainer).  The
multiprocessing helpers (``resource_tracker``, the ``forkserver`` itself) and anything
else (a shell, ``git``, a compiler) are ``child``.  Once a pid was seen as a worker it
stays one (a zombie has no command line left).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psutil

# ---------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class ProcSample:
    """One process of the trainer's tree at one moment."""

    pid: int
    ppid: int
    role: str  # main | worker | child
    name: str
    status: str  # psutil status: running, sleeping, disk-sleep, stopped, zombie, ...
    cpu_percent: float | None  # since the previous sample of this pid (None on the first)
    rss_bytes: int | None
    num_threads: int | None
    wchan: str | None  # kernel function it sleeps in, from /proc/<pid>/wchan
    cmdline: str = ""  # shortened, for stack dump headers
    io_chars: int | None = None  # /proc/<pid>/io rchar + wchar (files, pipes, sockets); None: unreadable

    def as_dict(self) -> dict[str, Any]:
        """For the tick event (JSON-friendly)."""
        return {
            "pid": self.pid,
            "ppid": self.ppid,
            "role": self.role,
            "name": self.name,
            "status": self.status,
            "cpu_percent": None if self.cpu_percent is None else round(self.cpu_percent, 1),
            "rss_bytes": self.rss_bytes,
            "num_threads": self.num_threads,
            "wchan": self.wchan,
        }


_MP_CHILD = ("multiprocessing.spawn", "spawn_main", "--multiprocessing-fork")
_MP_HELPER = ("multiprocessing.resource_tracker", "multiprocessing.forkserver import main")


def classify_role(pid: int, root: int, cmdline: Sequence[str], parent_cmdline: Sequence[str]) -> str:
    """``main``, ``worker`` or ``child`` (see the module doc for the heuristic)."""
    if pid == root:
        return "main"
    if cmdline and list(cmdline) == list(parent_cmdline):
        return "worker"  # fork (also a child of the forkserver)
    joined = " ".join(cmdline)
    if any(h in joined for h in _MP_HELPER):
        return "child"
    if any(m in joined for m in _MP_CHILD):
        return "worker"
    return "child"


def read_wchan(pid: int) -> str | None:
    """The kernel function a sleeping process waits in (``futex_wait_queue``,
    ``do_signal_stop``, ...); None when unreadable or running."""
    try:
        with open(f"/proc/{pid}/wchan", encoding="ascii", errors="replace") as f:
            value = f.read().strip()
    except OSError:
        return None
    return None if value in ("", "0") else value


class TreeSampler:
    """Samples a process tree; keeps ``psutil.Process`` objects between calls so that
    ``cpu_percent`` covers the time since the previous sample.  Thread-safe."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        self._roles: dict[int, str] = {}
        self._lock = threading.Lock()
        self.last: tuple[ProcSample, ...] = ()

    def sample(self, pid: int) -> tuple[ProcSample, ...]:
        """The tree under ``pid`` (main first); () when ``pid`` is gone."""
        with self._lock:
            samples = self._sample(pid)
            self.last = samples
            return samples

    def _process(self, pid: int) -> tuple[psutil.Process, bool]:
        cached = self._procs.get(pid)
        if cached is not None:
            try:
                if cached.is_running():
                    return cached, True
            except psutil.Error:
                pass
        proc = psutil.Process(pid)
        self._procs[pid] = proc
        return proc, False

    def _sample(self, pid: int) -> tuple[ProcSample, ...]:
        prior = dict(self._procs)
        try:
            root, _ = self._process(pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return ()
        cmdlines: dict[int, list[str]] = {}
        raw: list[tuple[psutil.Process, bool]] = []
        for p in tree:
            try:
                proc, _ = self._process(p.pid)
            except psutil.Error:
                continue
            raw.append((proc, prior.get(proc.pid) is proc))
            try:
                cmdlines[proc.pid] = proc.cmdline()
            except psutil.Error:
                cmdlines[proc.pid] = []
        out: list[ProcSample] = []
        for proc, known in raw:
            s = self._one(proc, known, pid, cmdlines)
            if s is not None:
                out.append(s)
        alive = {s.pid for s in out}
        for gone in [k for k in self._procs if k not in alive]:
            self._procs.pop(gone, None)
        return tuple(out)

    def _one(
        self, proc: psutil.Process, known: bool, root: int, cmdlines: dict[int, list[str]]
    ) -> ProcSample | None:
        try:
            with proc.oneshot():
                status = proc.status()
                ppid = proc.ppid()
                name = proc.name()
                cpu = proc.cpu_percent(None) if status != psutil.STATUS_ZOMBIE else 0.0
                rss = threads = io = None
                if status != psutil.STATUS_ZOMBIE:
                    try:
                        rss = proc.memory_info().rss
                        threads = proc.num_threads()
                    except psutil.Error:
                        pass
                    try:
                        counters = proc.io_counters()
                        io = counters.read_chars + counters.write_chars
                    except (psutil.Error, AttributeError, OSError):
                        pass
        except psutil.NoSuchProcess:
            return None
        except psutil.Error:
            return None
        cmd = cmdlines.get(proc.pid, [])
        role = classify_role(proc.pid, root, cmd, cmdlines.get(ppid, []))
        if self._roles.get(proc.pid) == "worker" and role == "child":
            role = "worker"
        self._roles[proc.pid] = role
        return ProcSample(
            proc.pid,
            ppid,
            role,
            name,
            status,
            cpu if known else None,
            rss,
            threads,
            read_wchan(proc.pid),
            " ".join(cmd)[:200],
            io,
        )

    def worker_pids(self) -> frozenset[int]:
        """Workers of the last sample (alive then)."""
        return frozenset(s.pid for s in self.last if s.role == "worker")


def tree_activity(samples: Sequence[ProcSample]) -> tuple[float | None, int | None]:
    """The tree's CPU (% of one core, summed; None while a process has no figure yet) and
    its bytes read and written (rchar + wchar summed; None when none could be read)."""
    cpu: float | None = 0.0
    io: int | None = None
    for s in samples:
        if s.cpu_percent is None:
            cpu = None
        elif cpu is not None:
            cpu += s.cpu_percent
        if s.io_chars is not None:
            io = (io or 0) + s.io_chars
    return cpu, io


def process_tree(pid: int, sampler: TreeSampler | None = None) -> tuple[ProcSample, ...]:
    """One sample of the tree under ``pid``; pass a sampler to get ``cpu_percent``."""
    return (sampler or TreeSampler()).sample(pid)


__all__ = ["ProcSample", "TreeSampler", "process_tree", "classify_role", "read_wchan"]


def environments(pids: Sequence[int]) -> dict[int, dict[str, str]]:
    """pid -> its environment (/proc/PID/environ), for the pids whose environment can be
    read (gone, another user's: left out)."""
    out: dict[int, dict[str, str]] = {}
    for pid in pids:
        try:
            out[pid] = psutil.Process(pid).environ()
        except (psutil.Error, OSError):
            continue
    return out
