"""The certain-evidence rules (core/stall_certain.py): each against its hang and its
look-alikes.  The hand-built trees copy what real ones show (the kernel waits as Linux 6.18
names them: ``futex_do_wait``, ``poll_schedule_timeout.constprop.0``, ``anon_pipe_read``,
``hrtimer_nanosleep``); tests/data/trees holds recorded ones (tests/helpers/record_trees.py).
Each is fed once a second, as the agent samples the tree."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from trainctl.core.stall_certain import DEADLOCK_S, CertainWatch, ProcFacts, helper_parked, parked

FUTEX = "futex_do_wait"
POLL = "poll_schedule_timeout.constprop.0"
ACCEPT = "__skb_wait_for_more_packets"  # a worker's resource-sharer thread in accept()

# A train_loop.py trainer with 2 forked DataLoader workers, the worker of the next batch
# blocked on an Event (hang-kind worker): the main thread in _try_get_data's poll, the
# pin-less loader's threads in futex waits, the other worker waiting on its index queue
# (each worker's main thread first, its resource-sharer thread in accept() last).
MAIN = ProcFacts(100, "main", "S", False, 0.0, 5000, (POLL, FUTEX, FUTEX))
W1 = ProcFacts(101, "worker", "S", False, 0.0, 800, (FUTEX, FUTEX, ACCEPT))
W2 = ProcFacts(102, "worker", "S", False, 0.0, 900, (POLL, FUTEX, ACCEPT))
DEADLOCKED = (MAIN, W1, W2)


def stopped(p: ProcFacts) -> ProcFacts:
    return replace(p, state="T", waits=None)


def feed(
    watch: CertainWatch,
    trees,
    *,
    t0: float = 0.0,
    last_batch: float = 0.0,
    mode: str = "train",
    phase: str = "train",
    stack: str | None = None,
    gpu_busy: bool = False,
):
    """Feed one tree a second from ``t0`` (asking after each, as the agent does); the stack
    is answered when asked.  Returns (verdict, when) or (None, None)."""
    t = t0
    for tree in trees:
        watch.on_tree(t, tree, gpu_busy)
        if watch.stack_wanted(t):
            watch.on_stack(stack)
        v = watch.check(t, phase, mode, t - last_batch)
        if v is not None:
            return v, t
        t += 1.0
    return None, None


def test_a_stopped_trainer_is_certain_after_3_s_and_a_debuggers_stop_never_is():
    w = CertainWatch()
    trees = [DEADLOCKED] + [(stopped(MAIN), W1, W2)] * 6
    v, t = feed(w, trees)
    assert v is not None and v.certain == "stopped" and t == 4.0, (v, t)  # stopped from t=1
    assert "the trainer (pid 100) stopped" in v.reason and v.threshold_s == 3.0
    # the same stop under a tracer: state t (gdb), or T with a TracerPid (no hang)
    for under in (replace(MAIN, state="t", waits=None), replace(stopped(MAIN), traced=True)):
        assert feed(CertainWatch(), [DEADLOCKED] + [(under, W1, W2)] * 60)[0] is None
    # a debugger attached to a worker turns every rule off for the tree
    traced_worker = (stopped(MAIN), replace(W1, traced=True), W2)
    assert feed(CertainWatch(), [DEADLOCKED] + [traced_worker] * 60)[0] is None


def test_every_worker_stopped_is_certain_once_the_trainer_blocks_and_one_alone_is_not():
    trees = [DEADLOCKED] + [(MAIN, stopped(W1), stopped(W2))] * 6
    v, t = feed(CertainWatch(), trees)
    assert v is not None and v.certain == "stopped" and t == 4.0, (v, t)
    assert "every worker stopped" in v.reason and "101, 102" in v.reason
    # the trainer still busy on batches it had prefetched: not before it blocks
    busy = replace(MAIN, state="R", cpu_percent=95.0)
    w = CertainWatch()
    trees = [DEADLOCKED] + [(busy, stopped(W1), stopped(W2))] * 5 + [(MAIN, stopped(W1), stopped(W2))] * 3
    v, t = feed(w, trees, last_batch=5.0)
    assert v is not None and t == 6.0, (v, t)  # a batch at 5, asleep at the next sample
    # one worker of two stopped: the other may be what it waits on
    assert feed(CertainWatch(), [DEADLOCKED] + [(MAIN, stopped(W1), W2)] * 60)[0] is None


def test_a_zombie_worker_while_the_trainer_waits_on_its_queue_is_certain_in_2_s():
    zombie = replace(W1, state="Z", cpu_percent=0.0, io_chars=None, waits=None)
    trees = [DEADLOCKED] + [(MAIN, zombie, W2)] * 5
    v, t = feed(CertainWatch(), trees, stack="queue")
    assert v is not None and v.certain == "worker_gone" and t == 3.0, (v, t)
    assert "worker 101 died (zombie)" in v.reason
    # its look-alikes: a collective wait, an unreadable stack, between epochs, in validation
    for stack, mode in (
        ("collective", "train"),
        (None, "train"),
        ("own", "train"),
        ("queue", "boundary"),
        ("queue", "val"),
    ):
        assert (
            feed(CertainWatch(), [DEADLOCKED] + [(MAIN, zombie, W2)] * 30, stack=stack, mode=mode)[0] is None
        )


def test_a_worker_gone_mid_epoch_is_certain_and_workers_replaced_between_epochs_are_not():
    v, t = feed(CertainWatch(), [DEADLOCKED, DEADLOCKED] + [(MAIN, W2)] * 5, stack="dataloader")
    assert v is not None and v.certain == "worker_gone" and "worker 101 gone" in v.reason, v
    # persistent_workers=False: at the epoch's end both go, two new ones come
    new = (MAIN, replace(W1, pid=201, state="R", cpu_percent=40.0), replace(W2, pid=202, cpu_percent=40.0))
    trees = [DEADLOCKED, (MAIN,), (MAIN,), new, new, new, new, new, new]
    assert feed(CertainWatch(), trees, stack="dataloader", mode="boundary")[0] is None
    w = CertainWatch()
    assert feed(w, trees[:3], stack="dataloader", mode="boundary")[0] is None
    assert feed(w, trees[3:] * 5, t0=3.0, stack="dataloader", mode="warmup")[0] is None
    # a worker that left, then a batch: its loader ended and the trainer went on
    w = CertainWatch()
    assert feed(w, [DEADLOCKED, DEADLOCKED, (MAIN, W2)], stack="dataloader")[0] is None
    loading = replace(W2, state="R", cpu_percent=50.0)
    assert feed(w, [(MAIN, loading)] * 30, t0=3.0, last_batch=2.5, stack="dataloader")[0] is None


def test_a_deadlocked_tree_is_certain_after_10_s_with_the_stack_in_a_dataloader_wait():
    w = CertainWatch()
    asked = []
    t = 0.0
    for t in [float(s) for s in range(30)]:
        w.on_tree(t, DEADLOCKED)
        if w.stack_wanted(t):
            asked.append(t)
            w.on_stack("dataloader")
        v = w.check(t, "train", "train", t)
        if v is not None:
            break
    assert v is not None and v.certain == "deadlock", v
    # no CPU and no I/O between the first two samples: quiet since the first
    assert t == DEADLOCK_S and asked == [3.0], (t, asked)
    assert "DataLoader wait" in v.reason
    assert w.check(t + 1, "train", "train", t + 1) is None  # one verdict per stall
    # a batch re-arms it
    assert feed(w, [DEADLOCKED] * 14, t0=40.0, last_batch=39.5, stack="dataloader")[0] is not None


@pytest.mark.parametrize(
    "name, tree, stack, gpu_busy",
    [
        ("slow I/O: a worker reads, its bytes move", "io", "dataloader", False),
        ("a worker sleeps between reads (time.sleep)", "sleep", "dataloader", False),
        ("a worker's main thread waits on a socket (a slow fetch)", "socket", "dataloader", False),
        ("a worker in uninterruptible I/O", "disk", "dataloader", False),
        ("the main thread reads a pipe (pdb at a prompt)", "pipe", "own", False),
        ("a rank waits in a collective (rank 0 evaluates)", "same", "collective", False),
        ("a validation on the GPU, the CPU waiting", "same", "dataloader", True),
        ("a long save: the trainer writes", "save", "own", False),
        ("py-spy missing: no stack", "same", None, False),
    ],
)
def test_the_deadlock_rule_look_alikes_are_never_certain(name, tree, stack, gpu_busy):
    def at(t: int):
        if tree == "io":
            return (MAIN, replace(W1, io_chars=800 + t * 4096), W2)
        if tree == "socket":
            return (MAIN, replace(W1, waits=(ACCEPT, FUTEX)), W2)
        if tree == "sleep":
            return (MAIN, replace(W1, waits=("hrtimer_nanosleep",)), W2)
        if tree == "disk":
            return (MAIN, replace(W1, state="D", waits=("rpc_wait_bit_killable",)), W2)
        if tree == "pipe":
            return (replace(MAIN, waits=("anon_pipe_read", FUTEX)), W1, W2)
        if tree == "save":
            return (replace(MAIN, state="R", cpu_percent=60.0, io_chars=5000 + t * 10**6), W1, W2)
        return DEADLOCKED

    w = CertainWatch()
    for t in range(60):
        w.on_tree(float(t), at(t), gpu_busy)
        if w.stack_wanted(float(t)):
            w.on_stack(stack)
        assert w.check(float(t), "train", "train", float(t)) is None, name


def test_nothing_is_certain_once_finished_and_the_waits_are_read_by_name():
    assert feed(CertainWatch(), [(stopped(MAIN),)] * 10, phase="finished", mode="finished")[0] is None
    assert parked("futex_wait_queue") and parked("futex_wait_queue_me") and parked("do_epoll_wait")
    assert parked("do_sys_poll") and parked(POLL) and not parked("anon_pipe_read") and not parked("")
    assert helper_parked(ACCEPT) and helper_parked(FUTEX) and not parked(ACCEPT)
    with pytest.raises(ValueError, match="unknown stack wait"):
        CertainWatch().on_stack("data")


def test_a_stack_read_that_comes_back_after_a_batch_is_about_nothing():
    w = CertainWatch()
    for t in range(4):
        w.on_tree(float(t), DEADLOCKED)
        asked = w.stack_wanted(float(t))
        assert w.check(float(t), "train", "train", float(t)) is None
    assert asked  # at 3 s of quiet
    assert w.check(3.5, "train", "train", 0.2) is None  # a batch at 3.3 while py-spy read
    w.on_stack("dataloader")  # ... the answer about the silence before it
    for t in range(4, 13):
        w.on_tree(float(t), DEADLOCKED)
        assert w.check(float(t), "train", "train", t - 3.3) is None  # never asked again yet
        if w.stack_wanted(float(t)):
            break
    assert t == 7  # asked anew 3 s into the spell after the batch (quiet since the batch, 3.3)


TREES = Path(__file__).resolve().parent.parent / "data" / "trees"


def _recorded(case: str):
    data = json.loads((TREES / f"{case}.json").read_text(encoding="utf-8"))
    trees = [tuple(ProcFacts(**{**p, "waits": _tuple(p["waits"])}) for p in tree) for tree in data["trees"]]
    return trees, data["main_wait"]


def _tuple(waits):
    return None if waits is None else tuple(waits)


@pytest.mark.parametrize(
    "case, rule, last_batch, goal",
    [
        ("deadlock", "deadlock", -1.0, 12.0),  # blocked before the first sample
        ("workers_stopped", "stopped", 1.9, 5.0),  # the fault just before the third sample
        ("zombie", "worker_gone", 1.9, 5.0),
    ],
)
def test_recorded_hangs_are_certain_within_the_goals(case, rule, last_batch, goal):
    """Real trees (tests/helpers/record_trees.py); the main thread's stack as py-spy read it
    then.  Goals: a stopped or dead worker <= 5 s after the last batch, a deadlock <= 12 s."""
    trees, wait = _recorded(case)
    v, t = feed(CertainWatch(), trees, last_batch=last_batch, stack=wait)
    assert v is not None and v.certain == rule and t - last_batch <= goal, (v, t, wait)


def test_a_recorded_healthy_run_is_never_certain_even_with_no_batch_read():
    """train_loop.py: busy batches and an epoch's end whose workers are replaced, judged as
    if no batch ever came (the harshest reading: mid-epoch, silent since the start)."""
    trees, wait = _recorded("healthy")
    assert any(
        {p.pid for p in a if p.role == "worker"} != {p.pid for p in b if p.role == "worker"}
        for a, b in zip(trees, trees[1:])
    )  # the epoch's end replaced the workers
    assert feed(CertainWatch(), trees, stack="dataloader")[0] is None
