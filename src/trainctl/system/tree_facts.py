"""What the certain-evidence rules (:mod:`trainctl.core.stall_certain`) read of the trainer's
tree, beside the agent's samples: each process's state letter, whether a tracer is attached
(/proc/PID/status ``TracerPid``), each thread's kernel wait (/proc/PID/task/TID/wchan, read
only when the tree is quiet enough for the deadlock rule to matter), and what the main
thread's stack waits for (one ``py-spy dump``, asked once per quiet spell)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import psutil

from trainctl.core.stall_certain import QUIET_CPU, ProcFacts
from trainctl.system.diagnose import main_wait
from trainctl.system.probes import ProcSample
from trainctl.system.pyspy import dump_all, find_pyspy

STACK_TIMEOUT_S = 5.0  # one plain py-spy dump of a sleeping process takes a fraction of it

_LETTERS = {
    psutil.STATUS_RUNNING: "R",
    psutil.STATUS_SLEEPING: "S",
    psutil.STATUS_DISK_SLEEP: "D",
    psutil.STATUS_STOPPED: "T",
    psutil.STATUS_TRACING_STOP: "t",
    psutil.STATUS_ZOMBIE: "Z",
    psutil.STATUS_DEAD: "X",
    psutil.STATUS_IDLE: "I",
}


def traced(pid: int) -> bool:
    """A tracer (a debugger, py-spy) is attached: ``TracerPid`` is not 0."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    return line.split()[1:2] != ["0"]
    except OSError:
        pass
    return False


def thread_waits(pid: int) -> tuple[str, ...] | None:
    """Each thread's kernel wait ("" for a running one), the process's own (main) thread
    first; None when unreadable or when that thread cannot be read."""
    out = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    if str(pid) not in tids:
        return None
    for tid in [str(pid), *sorted((t for t in tids if t != str(pid)), key=int)]:
        try:
            with open(f"/proc/{pid}/task/{tid}/wchan", encoding="ascii", errors="replace") as f:
                value = f.read().strip()
        except OSError:
            if tid == str(pid):
                return None
            continue  # the thread ended between the listing and the read
        out.append("" if value == "0" else value)
    return tuple(out)


def tree_facts(samples: Sequence[ProcSample]) -> tuple[ProcFacts, ...]:
    """The samples as the rules read them.  The threads' waits are read only when every
    process sleeps at no CPU together (elsewhere the deadlock rule cannot hold)."""
    letters = [_LETTERS.get(s.status, "?") for s in samples]
    live = [(s, c) for s, c in zip(samples, letters, strict=True) if c not in ("Z", "X")]
    quiet = all(c == "S" and s.cpu_percent is not None for s, c in live) and (
        sum(s.cpu_percent or 0.0 for s, _ in live) < QUIET_CPU
    )
    return tuple(
        ProcFacts(
            s.pid,
            s.role,
            c,
            c not in ("Z", "X") and traced(s.pid),
            s.cpu_percent,
            s.io_chars,
            thread_waits(s.pid) if quiet and c not in ("Z", "X") and s.role in ("main", "worker") else None,
        )
        for s, c in zip(samples, letters, strict=True)
    )


def read_main_wait(sample: ProcSample, timeout: float = STACK_TIMEOUT_S) -> str | None:
    """What the main thread of ``sample``'s process waits for (:func:`main_wait`), from one
    plain ``py-spy dump``; None when py-spy is missing or cannot read it."""
    exe = find_pyspy()
    if exe is None:
        return None
    dumps = dump_all(exe, (sample,), False, timeout, "")
    if not dumps or not dumps[0].ok:
        return None
    return main_wait(dumps[0].text)
