"""Look before killing: classify a stalled trainer and dump its stacks.  Never kills.

:func:`diagnose` samples the process tree twice, ``sample_s`` apart (CPU per process over
that window, states, wchan), then runs ``py-spy dump`` on every process of the tree in
parallel (each with a timeout) and writes one combined file
``<stacks_dir>/stall-<tag>-<pid>.txt``.  Then it classifies, first match wins:

1. ``stopped``     a process is in T/t state (SIGSTOP, Ctrl-Z, a debugger) in both samples;
2. ``io_wait``     a process is in D state (uninterruptible: NFS, a wedged driver) in both;
3. ``dead_worker`` a worker is a zombie, a worker seen before (``known_workers`` or the
                   sampler's last sample) is gone and fewer workers are left, or fewer
                   than ``expected_workers`` are alive;
4. ``spin``        the main process, or the whole tree, burns > 50 % of a core without
                   progress; or the GPU reports busy while the CPU is quiet (a kernel or a
                   collective spinning — NCCL/RCCL hangs keep the GPU at 100 %);
5. ``deadlock``    the main process sleeps at < 10 % CPU and nothing else is busy (a
                   DataLoader stall, a lock); a py-spy stack waiting in
                   ``_get_data``/``queue.get``/``Event.wait``/``acquire`` confirms it and
                   also tips a 10–50 % CPU case to deadlock;
6. ``unknown``     anything else.

py-spy is looked for next to ``sys.executable`` (the venv's bin), then on PATH.  A stopped
or D-state process is dumped with ``--nonblocking`` (ptrace cannot stop it); native frames
(``--native``) are tried first and dropped when they fail.  When py-spy cannot attach
(missing, ptrace denied, timed out), the file and ``detail`` say why.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from trainctl.core.gpu_text import GPU_IDLE
from trainctl.system.gpu import GpuSample
from trainctl.system.probes import ProcSample, TreeSampler
from trainctl.system.pyspy import DEAD, PYSPY_TIMEOUT_S, STOPPED, Dump, dump_all, find_pyspy, write_dump

BUSY_CPU = 50.0  # % of one core: above this without progress = spinning
IDLE_CPU = 10.0  # % of one core: below this and sleeping = waiting
BUSY_RUNNABLE = 0.6  # share of the window in state R: busy even when a crowded box gives it little CPU
POLL_S = 0.05
GPU_BUSY = 50.0  # % utilisation

_WAIT_FRAMES = (
    "_try_get_data",
    "_get_data",
    "Queue.get",
    "Event.wait",
    "Condition.wait",
    "acquire",
    "Connection._poll",
    "wait (multiprocessing/connection",
    "select",
    "Thread.join",
    "Popen.wait",
    "barrier",
    "all_reduce",
    "synchronize",
)
_DATALOADER_FRAMES = ("_try_get_data", "_get_data", "_next_data")
# a multiprocessing queue's get (py-spy names the function alone or with its class)
_QUEUE_FRAMES = ("get (multiprocessing/queues", "Queue.get (multiprocessing/queues")


@dataclass(frozen=True)
class Diagnosis:
    """What a stalled trainer is doing (``diagnosis`` is one of events.DIAGNOSES)."""

    diagnosis: str
    cpu_percent: float | None  # main process, over the sampling window
    stacks: str | None  # the combined dump file, or None
    detail: str  # one human sentence or two
    processes: tuple[ProcSample, ...] = ()
    elapsed_s: float = 0.0
    culprits: tuple[int, ...] = ()  # torchrun: the culprit ranks (see blame_ranks)
    rank_pids: dict[int, int] | None = None  # torchrun: pid -> global rank of each rank process
    # torchrun: the collectives that did not complete, from the ranks' Flight Recorder
    # (core/flight_record.py Unfinished.as_dict; the agent adds them: agent/flight.py)
    collectives: tuple[dict, ...] = ()
    # the run's devices read for the verdict: {"index", "name", "util", "power_w"} (the agent adds them)
    devices: tuple[dict, ...] = ()


def diagnose(
    pid: int,
    stacks_dir: Path,
    *,
    sampler: TreeSampler | None = None,
    gpu: GpuSample | None = None,
    pyspy: bool = True,
    sample_s: float = 1.0,
    tag: str = "",
    expected_workers: int | None = None,
    known_workers: set[int] | frozenset[int] | None = None,
    native: bool = True,
    pyspy_timeout: float = PYSPY_TIMEOUT_S,
    snapshot: bool = False,
    on_sampled: Callable[[], object] | None = None,
) -> Diagnosis:
    """Classify the stall of the trainer ``pid`` (see the module doc) and dump its stacks.

    ``sampler``: the agent's :class:`TreeSampler` (its last sample tells which workers
    existed before); ``known_workers``: worker pids seen recently (the last tick's, not
    every pid ever seen: DataLoader workers are replaced every epoch).  ``snapshot``: asked
    for on a run that is not stalled: the dump is a snapshot, named and headed so, and its
    classification is not a verdict.  ``on_sampled``: called (in this thread) once the CPU
    sampling is over, before the stacks are read (a rescue save asked then does not read as
    a spin); its failure is ignored.  A dump that cannot be written (stacks/ unwritable,
    disk full) leaves ``stacks`` None and says why in ``detail``: never an exception."""
    t0 = time.monotonic()
    sampler = sampler or TreeSampler()
    before = set(sampler.worker_pids()) | set(known_workers or ())
    first = sampler.sample(pid)
    if not first:
        return Diagnosis("unknown", None, None, f"the trainer (pid {pid}) is gone", (), time.monotonic() - t0)
    runnable = _runnable_fraction([x.pid for x in first if x.status not in DEAD], t0 + sample_s)
    second = sampler.sample(pid) or first
    if on_sampled is not None:
        try:
            on_sampled()
        except Exception:  # noqa: BLE001 - the caller's hook never costs the diagnosis
            pass
    rank_pids = find_ranks(second)
    if rank_pids:  # the ranks' own stacks first: they name the culprit
        second = tuple(sorted(second, key=lambda s: (s.role != "main", s.pid not in rank_pids)))
    dumps: list[Dump] = []
    stacks: str | None = None
    why_no_stacks = ""
    if pyspy:
        exe = find_pyspy()
        if exe is None:
            why_no_stacks = "py-spy not found (next to python or on PATH)"
        dumps = dump_all(exe, second, native, pyspy_timeout, why_no_stacks)
    diagnosis, detail = classify(
        first, second, dumps, gpu=gpu, before=before, expected_workers=expected_workers, runnable=runnable
    )
    problem = ""  # why the stacks are missing or incomplete
    if pyspy:
        failed = [d for d in dumps if not d.ok]
        if why_no_stacks:
            problem = f"No stacks: {why_no_stacks}."
        elif failed and len(failed) == len(dumps):
            problem = f"py-spy could not read the stacks ({failed[0].why})."
        try:
            stacks = str(
                write_dump(
                    stacks_dir, tag, pid, dumps, diagnosis, f"{detail} {problem}".strip(), snapshot, rank_pids
                )
            )
        except OSError as e:
            problem += f" The stacks could not be written to {stacks_dir}: {e.strerror or e}."
    culprits: tuple[int, ...] = ()
    if rank_pids and dumps:
        culprits, rank_note = blame_ranks(rank_pids, {d.sample.pid: d.text for d in dumps if d.ok})
        detail = f"{rank_note} {detail}"
    if snapshot:
        detail = f"a snapshot of {len(second)} running processes, not a stall verdict."
    detail = f"{detail} {problem.strip()}".strip()
    main = _main(second)
    return Diagnosis(
        diagnosis,
        main.cpu_percent if main else None,
        stacks,
        detail,
        second,
        time.monotonic() - t0,
        culprits,
        rank_pids or None,
    )


# ---------------------------------------------------------------------------- ranks

_COLLECTIVE = (
    "c10d::",
    "ProcessGroup",
    "gloo::",
    "nccl",
    "NCCL",
    "all_reduce",
    "allreduce",
    "barrier",
    "broadcast",
    "all_gather",
    "allgather",
    "reduce_scatter",
    "finalize_backward",
    "Work.wait",
    "wait (torch/distributed",
    "_wait (torch/distributed",
)


def find_ranks(samples: tuple[ProcSample, ...]) -> dict[int, int]:
    """pid -> global rank of each torchrun rank in the tree: a process whose environment has
    ``RANK`` while its parent's has none (a rank's DataLoader workers inherit its RANK)."""
    envs: dict[int, str | None] = {}
    for s in samples:
        try:
            envs[s.pid] = psutil.Process(s.pid).environ().get("RANK")
        except (psutil.Error, OSError):
            envs[s.pid] = None
    out = {}
    for s in samples:
        value = envs.get(s.pid)
        if value is not None and envs.get(s.ppid) is None and value.isdigit() and s.status not in DEAD:
            out[s.pid] = int(value)
    return out


def rank_wait(dump: str) -> str:
    """What a rank's main thread waits for, from its ``py-spy dump --native``: ``data``
    (a DataLoader batch), ``collective`` (an allreduce, a barrier, DDP's backward waiting
    for the other ranks' gradients) or ``own`` (its own code, a plain queue, or nothing
    known).  The innermost frame that says decides (:func:`main_wait`)."""
    wait = main_wait(dump)
    return "data" if wait == "dataloader" else "own" if wait == "queue" else wait


def main_wait(dump: str) -> str:
    """What the main thread of a ``py-spy dump`` waits for: ``dataloader`` (a DataLoader
    batch), ``queue`` (a multiprocessing queue's get outside a DataLoader: its producer's
    data), ``collective`` or ``own``.  The innermost DataLoader or collective frame
    decides (a DataLoader waits in a queue's get too), then a queue's."""
    frames: list[str] = []
    for header, body in _threads(dump):
        if '"MainThread"' in header or not frames:
            frames = body
        if '"MainThread"' in header:
            break
    for f in frames:
        if any(d in f for d in _DATALOADER_FRAMES):
            return "dataloader"
        if any(c in f for c in _COLLECTIVE):
            return "collective"
    return "queue" if any(q in f for f in frames for q in _QUEUE_FRAMES) else "own"


def _threads(text: str) -> list[tuple[str, list[str]]]:
    threads: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("Thread "):
            threads.append((line, []))
        elif threads and line.startswith("    "):
            threads[-1][1].append(line.strip())
    return threads


def blame_ranks(rank_pids: dict[int, int], dumps: dict[int, str]) -> tuple[tuple[int, ...], str]:
    """The culprit ranks of a stalled torchrun job and a sentence.  DDP ranks move in
    lockstep, so the rank that stopped first does not exist: a rank waiting for a batch, or
    in its own code, is a culprit; ranks waiting in a collective are its victims.  Pure."""
    waits = {rank: rank_wait(dumps[pid]) for pid, rank in rank_pids.items() if pid in dumps}
    if not waits:
        return (), "No rank's stack could be read."
    culprits = tuple(sorted(r for r, w in waits.items() if w != "collective"))
    victims = sorted(r for r, w in waits.items() if w == "collective")
    said = {"data": "waits for a DataLoader batch", "own": "is in its own code"}
    parts = [f"rank {r} {said[waits[r]]}" for r in culprits]
    if victims:
        parts.append(
            f"rank{'s' if len(victims) > 1 else ''} {', '.join(map(str, victims))} "
            f"wait{'' if len(victims) > 1 else 's'} in a collective (victim{'s' if len(victims) > 1 else ''})"
        )
    if not culprits:
        return (), "Every rank waits in a collective: a rank is missing or the network hangs."
    return culprits, f"Culprit: {'; '.join(parts)}."


# ---------------------------------------------------------------------------- classify


def classify(
    first: tuple[ProcSample, ...],
    second: tuple[ProcSample, ...],
    dumps=(),
    *,
    gpu: GpuSample | None = None,
    before: set[int] | None = None,
    expected_workers: int | None = None,
    runnable: dict[int, float] | None = None,
) -> tuple[str, str]:
    """(diagnosis, detail) from two samples of the tree, the share of the window each
    process spent runnable (state R: on a CPU or waiting for one — a spinning process
    on a crowded machine gets little CPU but is always runnable) and the stack dumps.  Pure."""
    runnable = runnable or {}
    main = _main(second)
    if main is None:
        return "unknown", "the main process was not in the sample"
    states1 = {s.pid: s.status for s in first}
    workers = [s for s in second if s.role == "worker"]
    live = [w for w in workers if w.status not in DEAD]
    zombies = [w for w in workers if w.status in DEAD]
    tree = _tree_sentence(main, live)
    main_stack = _main_thread_frames(dumps, main.pid)
    stack_note = _stack_sentence(main_stack)

    found = _frozen(states1, second, tree) or _dead_workers(
        second, main, live, zombies, before, expected_workers, f"{tree}{stack_note}"
    )
    if found:
        return found

    main_cpu = main.cpu_percent or 0.0
    total_cpu = sum(s.cpu_percent or 0.0 for s in second if s.status not in DEAD)

    def busy(s: ProcSample) -> bool:
        return (s.cpu_percent or 0.0) > BUSY_CPU or runnable.get(s.pid, 0.0) >= BUSY_RUNNABLE

    if busy(main):
        return "spin", (
            f"main process busy ({main_cpu:.0f}% CPU, runnable "
            f"{100 * runnable.get(main.pid, 0.0):.0f}% of the time) with no progress: "
            f"a loop that never ends, or a long compile. {tree}{stack_note}"
        )
    others = [s for s in second if s is not main and s.status not in DEAD and busy(s)]
    if others or total_cpu > BUSY_CPU:
        busiest = max(others or second, key=lambda s: s.cpu_percent or 0.0)
        return "spin", (
            f"{busiest.role} {busiest.pid} busy at {busiest.cpu_percent or 0:.0f}% CPU "
            f"while the main process waits ({main_cpu:.0f}%). {tree}{stack_note}"
        )
    gpu_note = _gpu_sentence(gpu)
    if gpu is not None and gpu.util_percent is not None and gpu.util_percent >= GPU_BUSY:
        return "spin", (
            f"CPU quiet but the GPU reports {gpu.util_percent:.0f}% busy{gpu_note}: a "
            f"kernel or collective (NCCL/RCCL) spinning. {tree}{stack_note}"
        )
    waiting = _is_waiting(main_stack)
    sleeping = main.status in (psutil.STATUS_SLEEPING, psutil.STATUS_IDLE)
    if sleeping and (main_cpu < IDLE_CPU or waiting):
        what = (
            "a data stall"
            if (gpu is not None and gpu.util_percent is not None and gpu.util_percent <= GPU_IDLE)
            else "waiting forever"
        )
        where = f" blocked in {main.wchan}" if main.wchan else ""
        return "deadlock", (
            f"main process at {main_cpu:.0f}% CPU{where}, {what}. "
            f"{tree}{stack_note}{gpu_note and ' GPU' + gpu_note + '.'}"
        )
    return "unknown", f"main process {main.status} at {main_cpu:.0f}% CPU. {tree}{stack_note}"


def _frozen(states1: dict[int, str], second: tuple[ProcSample, ...], tree: str) -> tuple[str, str] | None:
    """("stopped" | "io_wait", detail): a process in state T, or D, in both samples."""
    stopped = [s for s in second if s.status in STOPPED and states1.get(s.pid) in STOPPED]
    if stopped:
        who = ", ".join(f"{s.role} {s.pid}" for s in stopped)
        return "stopped", (
            f"{who} stopped (state T: SIGSTOP, Ctrl-Z or a debugger); "
            f"`kill -CONT {' '.join(str(s.pid) for s in stopped)}` resumes "
            f"{'it' if len(stopped) == 1 else 'them'}. {tree}"
        )
    dstate = [
        s
        for s in second
        if s.status == psutil.STATUS_DISK_SLEEP and states1.get(s.pid) == psutil.STATUS_DISK_SLEEP
    ]
    if dstate:
        where = ", ".join(f"{s.role} {s.pid}" + (f" in {s.wchan}" if s.wchan else "") for s in dstate)
        return "io_wait", (
            f"{where} in uninterruptible I/O wait (state D): a stuck file system "
            f"or driver; it cannot be killed until the I/O returns. {tree}"
        )
    return None


def _dead_workers(
    second: tuple[ProcSample, ...],
    main: ProcSample,
    live: list[ProcSample],
    zombies: list[ProcSample],
    before: set[int] | None,
    expected_workers: int | None,
    note: str,
) -> tuple[str, str] | None:
    """("dead_worker", detail ending in ``note``): a zombie worker, a worker seen before and
    gone (fewer left), or fewer alive than expected."""
    alive_pids = {s.pid for s in second if s.status not in DEAD}
    zombie_pids = {z.pid for z in zombies}
    gone = sorted(
        p for p in (before or set()) if p not in alive_pids and p not in zombie_pids and p != main.pid
    )
    if not (
        zombies
        or (gone and len(live) < len(before or ()))
        or (expected_workers is not None and len(live) < expected_workers)
    ):
        return None
    parts = []
    if zombies:
        parts.append(f"worker {', '.join(str(z.pid) for z in zombies)} died (zombie, not reaped)")
    if gone:
        parts.append(f"worker {', '.join(map(str, gone))} gone")
    if expected_workers is not None and len(live) < expected_workers:
        parts.append(f"{len(live)} of {expected_workers} workers alive")
    return "dead_worker", f"{'; '.join(parts)}; the main process waits for its data. {note}"


def _main(samples: tuple[ProcSample, ...]) -> ProcSample | None:
    return next((s for s in samples if s.role == "main"), None)


def _tree_sentence(main: ProcSample, live: list[ProcSample]) -> str:
    if not live:
        return "No live worker processes."
    states: dict[str, int] = {}
    for w in live:
        states[w.status] = states.get(w.status, 0) + 1
    desc = ", ".join(f"{n} {st}" for st, n in sorted(states.items()))
    cpu = max((w.cpu_percent or 0.0) for w in live)
    return f"{len(live)} worker{'s' if len(live) != 1 else ''} ({desc}, busiest {cpu:.0f}% CPU)."


def _gpu_sentence(gpu: GpuSample | None) -> str:
    if gpu is None:
        return ""
    bits = []
    if gpu.util_percent is not None:
        bits.append(f"{gpu.util_percent:.0f}% util")
    if gpu.power_w is not None:
        bits.append(f"{gpu.power_w:.0f} W")
    return f" ({', '.join(bits)})" if bits else ""


def _main_thread_frames(dumps, pid: int) -> list[str]:
    for d in dumps:
        if d.sample.pid == pid and d.ok:
            return main_thread_frames(d.text)
    return []


def main_thread_frames(text: str) -> list[str]:
    """The main thread's frames (innermost first) from a ``py-spy dump``; native frames
    (``(libc.so.6)``, ``(*.c:N)``) are left out.  The main thread is the one named
    "MainThread", else the one whose id is the process id (py-spy leaves the name out in
    some modes), else the first one."""
    threads: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("Thread "):
            threads.append((line, []))
        elif threads and line.startswith("    "):
            frame = line.strip()
            if not (_NATIVE.search(frame) or frame.startswith("0x")):
                threads[-1][1].append(frame)
    if not threads:
        return []
    m = re.search(r"^Process (\d+):", text, re.M)
    pid = m.group(1) if m else None
    for header, frames in threads:
        if '"MainThread"' in header:
            return frames
    for header, frames in threads:
        if pid and header.split()[1] == pid:
            return frames
    return threads[0][1]


_NATIVE = re.compile(r"\((?:[^():]*\.so[^()]*|[^():]+\.c(?:\.h)?:\d+)\)$")


def _is_waiting(frames: list[str]) -> bool:
    return any(any(w in f for w in _WAIT_FRAMES) for f in frames[:12])


def _stack_sentence(frames: list[str]) -> str:
    if not frames:
        return ""
    names = [f.split(" (", 1)[0] for f in frames]
    if any(any(n.endswith(d) for d in _DATALOADER_FRAMES) for n in names):
        dl = [n for n in names if any(n.endswith(d) for d in _DATALOADER_FRAMES)]
        return f" Stack: main thread waits for a DataLoader batch ({' ← '.join(dl[:3])})."
    return f" Stack: main thread in {' ← '.join(names[:3])}."


def _runnable_fraction(pids: list[int], until: float) -> dict[int, float]:
    """Poll /proc/<pid>/stat until ``until`` (monotonic): the share of polls in state R."""
    seen = dict.fromkeys(pids, 0)
    polls = 0
    while True:
        polls += 1
        for pid in pids:
            if _proc_state(pid) == "R":
                seen[pid] += 1
        left = until - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(POLL_S, left))
    return {pid: n / polls for pid, n in seen.items()}


def _proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    end = data.rfind(b")")
    return data[end + 2 : end + 3].decode() if end > 0 else None
