"""Stalls the process tree proves: a verdict in seconds, beside the silence thresholds.  Pure;
time is an argument.

The thresholds of :mod:`trainctl.core.stall` wait for a silence longer than any the run has
had, because a silence alone proves nothing.  Some states of the trainer's tree do prove a
hang, and :class:`CertainWatch` calls them as soon as they have lasted long enough to be no
passing moment:

* **stopped** (``STOPPED_S``, 3 s): the trainer is stopped (state ``T``: SIGSTOP, Ctrl-Z),
  or every worker of its tree is while the trainer blocks (asleep at no CPU, no batch for
  ``BLOCKED_S``).  A process under a tracer (``TracerPid`` set, or state ``t``) is a
  debugger's: no hang, and no certain verdict at all while one is attached anywhere in the
  tree (py-spy's own short attach included).
* **worker gone** (``GONE_S``, 2 s): a worker is a zombie, or left the tree with fewer
  workers left and none new (``persistent_workers=False`` replaces them: new pids, no
  loss), while the trainer blocks with its main thread waiting for data (a DataLoader or a
  multiprocessing queue, from its stack) and a batch is awaited in the middle of an epoch.
  A worker that left is forgotten at the next batch (its loader ended; the trainer went
  on) and when new workers come; a zombie is seen in every sample.
* **deadlock** (``DEADLOCK_S``, 10 s): the whole tree at no CPU (below ``QUIET_CPU``
  together), no bytes read or written, no process running, in I/O or stopped, the main
  thread of the trainer and of each worker asleep in a futex or poll wait and their other
  threads too (or in accept(): multiprocessing's resource sharer listens in every forked
  DataLoader worker), no busy GPU, and the main thread's stack
  in a DataLoader wait.  A spell begins at the sample before its first quiet one (no CPU
  and no byte between the two), never before the last batch.  The stack is asked for once
  per quiet spell (:meth:`CertainWatch.stack_wanted`, ``STACK_AFTER_S`` into it).

A main thread waiting in a collective (an allreduce, a barrier: a rank waiting for rank 0's
evaluation or save looks the same) is never certain: the phase thresholds decide there.
Nothing is certain once the run finished, before the tree was sampled twice, or after a
verdict until the next batch or phase.

Feed it each sample of the tree (:meth:`CertainWatch.on_tree`, a tuple of
:class:`ProcFacts`), the main thread's stack when asked (:meth:`CertainWatch.on_stack`), and
ask :meth:`CertainWatch.check` with what the stall detector knows (phase, mode, idle).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainctl.core.stall import StallVerdict

STOPPED_S = 3.0  # stopped this long: a hang
GONE_S = 2.0  # a worker gone while the trainer blocks this long
DEADLOCK_S = 10.0  # the whole tree asleep in futex/poll waits this long
STACK_AFTER_S = 3.0  # into a quiet spell, the main thread's stack is read (once)
BLOCKED_S = 1.0  # no batch this long (and no CPU): the trainer blocks
IDLE_CPU = 5.0  # % of one core: the trainer below this is asleep
QUIET_CPU = 2.0  # % of one core, the whole tree together: no CPU

#: where a batch is awaited in the middle of an epoch (StallDetector modes)
MID_EPOCH = ("train", "warmup", "pause")
#: the stack's waits (:meth:`CertainWatch.on_stack`)
STACK_WAITS = ("dataloader", "queue", "collective", "own")

_DEAD = ("Z", "X")
_FUTEX = re.compile(r"futex")
# a helper thread waiting for a connection on a unix socket (multiprocessing's resource
# sharer in every forked DataLoader worker: accept() waits here)
_ACCEPT = re.compile(r"^(__skb_wait_for_more_packets|unix_accept|inet_csk_accept)")
_POLL = re.compile(r"^(do_sys_poll|poll_schedule_timeout|do_select|core_sys_select|ep_poll|do_epoll_wait)")


@dataclass(frozen=True)
class ProcFacts:
    """One process of the trainer's tree, as the rules read it.

    ``state``: the letter of /proc/PID/stat (R S D T t Z X I); ``traced``: a tracer is
    attached (TracerPid != 0); ``cpu_percent``: since the previous sample (None: the first);
    ``waits``: each thread's kernel wait (/proc/PID/task/TID/wchan, "" for a running
    thread), the process's main thread first; None when not read."""

    pid: int
    role: str  # main | worker | child
    state: str
    traced: bool = False
    cpu_percent: float | None = None
    io_chars: int | None = None
    waits: tuple[str, ...] | None = None


def parked(wait: str) -> bool:
    """A thread asleep in a futex or a poll/select/epoll wait (the kernel's wchan name)."""
    return bool(_FUTEX.search(wait) or _POLL.match(wait))


def helper_parked(wait: str) -> bool:
    """Another thread than a process's main one: parked, or waiting in accept()."""
    return parked(wait) or bool(_ACCEPT.match(wait))


class CertainWatch:
    """The certain-evidence rules (see the module doc)."""

    def __init__(
        self,
        stopped_s: float = STOPPED_S,
        gone_s: float = GONE_S,
        deadlock_s: float = DEADLOCK_S,
        stack_after_s: float = STACK_AFTER_S,
    ) -> None:
        self.stopped_s = stopped_s
        self.gone_s = gone_s
        self.deadlock_s = deadlock_s
        self.stack_after_s = stack_after_s
        self._episode: float | None = None  # the last batch (or phase start) the state is about
        self._armed = True
        self._procs: tuple[ProcFacts, ...] = ()
        self._sampled = 0
        self._sampled_t: float | None = None  # the previous sample's time
        self._workers: frozenset[int] = frozenset()  # the live workers of the last sample
        self._lost: set[int] = set()  # workers gone (not zombies), fewer left, none new
        self._gone_since: float | None = None  # a worker zombie or lost since
        self._main_stopped: float | None = None  # since when (first sample that saw it)
        self._workers_stopped: float | None = None
        self._blocked: float | None = None  # the trainer asleep at no CPU since
        self._quiet: float | None = None  # the whole tree parked since
        self._stack: str | None = None  # the main thread's wait, read in this spell
        self._stack_asked = False
        self._spell = 0  # bumped where a stack read stops being about now (a batch, a spell's end)
        self._asked_in = -1  # the spell the stack was asked in

    # ------------------------------------------------------------------ feeding
    def on_tree(self, now: float, procs: tuple[ProcFacts, ...], gpu_busy: bool = False) -> None:
        """One sample of the tree (main first); ``gpu_busy``: the GPU works (no deadlock)."""
        before, prior, prior_t = self._workers, self._procs, self._sampled_t
        self._procs, self._sampled_t = procs, now
        self._sampled += 1
        main = next((p for p in procs if p.role == "main"), None)
        live = frozenset(p.pid for p in procs if p.role == "worker" and p.state not in _DEAD)
        if live - before:  # new workers: a loader (re)started, nothing is lost
            self._lost.clear()
        elif before - live and len(live) < len(before):
            self._lost |= before - live - {p.pid for p in procs}
        self._workers = live
        self._gone_since = _since(self._gone_since, now, self._gone())
        traced = any(p.traced or p.state == "t" for p in procs)
        self._main_stopped = _since(
            self._main_stopped, now, main is not None and main.state == "T" and not traced
        )
        workers = [p for p in procs if p.role == "worker" and p.state not in _DEAD]
        self._workers_stopped = _since(
            self._workers_stopped, now, bool(workers) and all(p.state == "T" for p in workers) and not traced
        )
        asleep = main is not None and main.state in ("S", "I") and _below(main.cpu_percent, IDLE_CPU)
        self._blocked = _since(self._blocked, now, asleep and not traced)
        quiet = (
            main is not None
            and not traced
            and not gpu_busy
            and bool(prior)
            and _tree_parked(procs)
            and _io_still(prior, procs)
        )
        if not quiet and self._quiet is not None:  # a quiet spell ended: its stack with it
            self._forget_stack()
        if quiet and self._quiet is None and prior_t is not None:
            # no CPU and no byte since the previous sample: quiet since then (not before
            # the last batch)
            self._quiet = max(prior_t, self._episode if self._episode is not None else prior_t)
        elif not quiet:
            self._quiet = None

    def stack_wanted(self, now: float) -> bool:
        """Whether the main thread's stack should be read now: once per quiet spell
        (``stack_after_s`` into it), or once the trainer blocks next to a lost worker; read
        again only after a batch or the spell's end."""
        if self._stack_asked or not self._armed:
            return False
        quiet = self._quiet is not None and now - self._quiet >= self.stack_after_s
        if quiet or (self._blocked is not None and self._gone_since is not None):
            self._stack_asked, self._asked_in = True, self._spell
            return True
        return False

    def on_stack(self, wait: str | None) -> None:
        """What the main thread waits for (one of STACK_WAITS; None: unreadable), read
        since :meth:`stack_wanted` asked; an answer that comes after a batch or after the
        spell it was asked in ended is dropped."""
        if wait is not None and wait not in STACK_WAITS:
            raise ValueError(
                f"certain watch: unknown stack wait {wait!r} (allowed: {', '.join(STACK_WAITS)})"
            )
        if self._asked_in == self._spell:
            self._stack = wait

    def _forget_stack(self) -> None:
        self._stack, self._stack_asked = None, False
        self._spell += 1

    # ------------------------------------------------------------------ asking
    def check(self, now: float, phase: str, mode: str, idle_s: float) -> StallVerdict | None:
        """A verdict once the tree proves a hang; then None until the next batch or phase.
        ``phase``, ``mode`` and ``idle_s`` are the stall detector's
        (:attr:`~trainctl.core.stall.StallDetector.phase`, ``mode()``, ``idle(now)``)."""
        episode = now - idle_s  # the last batch, or the phase's start
        if self._episode is None or abs(episode - self._episode) > 1e-6:
            # a batch (or a phase): what a spell proved is about the silence after it
            self._episode, self._armed = episode, True
            self._lost.clear()
            self._gone_since = self._quiet = None
            self._forget_stack()
        if phase == "finished" or not self._armed or self._sampled < 2:
            return None
        verdict = self._verdict(now, phase, mode, idle_s)
        if verdict is not None:
            self._armed = False
        return verdict

    def _verdict(self, now: float, phase: str, mode: str, idle_s: float) -> StallVerdict | None:
        def made(rule: str, window: float, reason: str) -> StallVerdict:
            return StallVerdict(phase, idle_s, window, f"{reason} (certain: {rule})", certain=rule)

        if self._main_stopped is not None and now - self._main_stopped >= self.stopped_s:
            held = now - self._main_stopped
            main = next(p.pid for p in self._procs if p.role == "main")
            return made("stopped", self.stopped_s, f"the trainer (pid {main}) stopped for {held:.0f}s")
        blocked = self._blocked is not None and idle_s >= BLOCKED_S
        if self._workers_stopped is not None and now - self._workers_stopped >= self.stopped_s and blocked:
            held = now - self._workers_stopped
            pids = ", ".join(str(p.pid) for p in self._procs if p.role == "worker" and p.state == "T")
            return made(
                "stopped",
                self.stopped_s,
                f"every worker stopped for {held:.0f}s (pid {pids}) while the trainer waits",
            )
        if (
            self._gone_since is not None
            and self._blocked is not None
            and now - max(self._blocked, self._gone_since) >= self.gone_s
            and mode in MID_EPOCH
            and idle_s >= self.gone_s
            and self._stack in ("dataloader", "queue")
        ):
            zombies = [p.pid for p in self._procs if p.role == "worker" and p.state in _DEAD]
            what = "; ".join(
                part
                for part in (
                    f"worker {', '.join(map(str, zombies))} died (zombie)" if zombies else "",
                    f"worker {', '.join(map(str, sorted(self._lost)))} gone" if self._lost else "",
                )
                if part
            )
            return made(
                "worker_gone",
                self.gone_s,
                f"{what} while the trainer waits for its data for {now - self._gone_since:.0f}s",
            )
        if self._quiet is not None and now - self._quiet >= self.deadlock_s and self._stack == "dataloader":
            return made(
                "deadlock",
                self.deadlock_s,
                f"deadlock: the whole tree asleep in futex/poll waits at no CPU and no I/O for "
                f"{now - self._quiet:.0f}s, the main thread in a DataLoader wait",
            )
        return None

    def _gone(self) -> bool:
        return bool(self._lost) or any(p.role == "worker" and p.state in _DEAD for p in self._procs)


def _since(since: float | None, now: float, holds: bool) -> float | None:
    if not holds:
        return None
    return now if since is None else since


def _below(cpu: float | None, limit: float) -> bool:
    return cpu is not None and cpu < limit


def _tree_parked(procs: tuple[ProcFacts, ...]) -> bool:
    """Every live process asleep (S) and at no CPU together; each thread of the trainer and
    its workers parked (a helper such as multiprocessing's resource tracker sleeps in a
    read: it is no part of the data path, its CPU counts)."""
    live = [p for p in procs if p.state not in _DEAD]
    if not live or any(p.state != "S" or p.cpu_percent is None for p in live):
        return False
    if sum(p.cpu_percent or 0.0 for p in live) >= QUIET_CPU:
        return False
    path = [p for p in live if p.role in ("main", "worker")]
    return bool(path) and all(
        p.waits and parked(p.waits[0]) and all(helper_parked(w) for w in p.waits[1:]) for p in path
    )


def _io_still(prior: tuple[ProcFacts, ...], procs: tuple[ProcFacts, ...]) -> bool:
    """No process read or wrote a byte since the previous sample (every figure readable)."""
    was = {p.pid: p.io_chars for p in prior}
    for p in procs:
        if p.state in _DEAD:
            continue
        if p.io_chars is None or was.get(p.pid) is None or was[p.pid] != p.io_chars:
            return False
    return True
