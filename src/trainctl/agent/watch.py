"""The periodic watch of a running attempt: every WATCH_S it flushes what the throttle and
the log tail hold, asks the stall detector and then the certain-evidence rules
(:mod:`trainctl.core.stall_certain`: a tree that proves a hang), and on its cadences
samples the process tree and GPU (a tick for the dashboard), projects the deadline and
checks the risk.  The certain rules watch a plain trainer's tree (under torchrun a rank's
stop or loss shows in the other ranks' collective waits: the thresholds decide)."""

from __future__ import annotations

import asyncio

from trainctl.agent.context import RunContext
from trainctl.agent.gpus import RunGpus
from trainctl.agent.intake import Intake
from trainctl.core import events as E
from trainctl.core.stall_certain import CertainWatch
from trainctl.system.probes import tree_activity
from trainctl.system.tree_facts import read_main_wait, tree_facts

TICK_S = 1.0
WATCH_S = 0.5
PROJECTION_S = 30.0


class Watcher:
    def __init__(
        self, ctx: RunContext, intake: Intake, on_stall, report=None, gpus: RunGpus | None = None
    ) -> None:
        self.ctx = ctx
        self.gpus = gpus or RunGpus(ctx)  # the run's own devices (agent/gpus.py)
        self.report = report  # (where, exception): a probe that fails costs its figures only
        self.intake = intake
        self.on_stall = on_stall  # async (verdict) -> None, run as its own task
        self._last_tick = 0.0
        self._last_risk_check = 0.0
        self._projection_basis = (False, False)
        self._last_gpu: dict | None = None
        self._rank_of: dict[int, int | None] = {}  # torchrun: pid -> its rank (read once per pid)
        self.stall_task: asyncio.Task | None = None
        self.certain = CertainWatch()
        self._stack_read: asyncio.Future | None = None  # the main thread's stack, being read

    async def run(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            await self.step(self.ctx.clock())

    async def step(self, now: float) -> None:
        ctx, intake = self.ctx, self.intake
        intake.flush_progress(now)
        intake.say_unknown_format(now)
        intake.flush_logs_if_due()  # lines that came with the trainer's last write
        verdict = ctx.detector.check(now)
        if verdict is None and ctx.spec.kind != "torchrun":
            d = ctx.detector
            verdict = self.certain.check(now, d.phase, d.mode(), d.idle(now))
        if verdict is not None and not intake.stalled:
            intake.say_unknown_format(now, at_stall=True)  # said before its stall
            intake.stalled = True
            self.stall_task = asyncio.create_task(self.on_stall(verdict))
        if now - self._last_tick >= TICK_S:
            self._last_tick = now
            await self.tick(now)
        if now - ctx.last_projection >= PROJECTION_S:
            ctx.project(now)
        elif now - self._last_risk_check >= TICK_S:
            # The risk is checked every second (cheap), so a deadline or budget that becomes
            # unreachable is said within a second, not at the next projection; so is the
            # first projection that knows the work left or the run's own rate.
            self._last_risk_check = now
            risk = ctx.projector.at_risk(now)
            basis = ctx.projector.basis()
            if risk is not None or basis != self._projection_basis:
                self._projection_basis = basis
                ctx.project(now, risk)

    async def tick(self, now: float) -> None:
        ctx = self.ctx
        trainer = ctx.facts.trainer
        processes: tuple = ()
        samples: tuple = ()
        try:
            if trainer is not None and trainer.returncode is None:
                samples = await trainer.sample()
                if ctx.spec.kind == "torchrun":
                    ranks = self.rank_map(samples)
                    processes = self.with_ranks(samples, ranks)
                    # the ranks' activity only: the launcher polls its workers and its
                    # rendezvous store for ever (a few KB of I/O a second), which is not the
                    # ranks' work; no rank yet: the launcher is at its rendezvous, not watched
                    watched = tuple(s for s in samples if ranks.get(s.pid) is not None)
                else:
                    processes, watched = tuple(s.as_dict() for s in samples), samples
                if watched:  # a still tree (no output, CPU, I/O or GPU) is a deadlock
                    cpu, io = tree_activity(watched)
                    if any(s.status == "disk-sleep" for s in watched):
                        cpu = None  # in an uninterruptible read or write: not still
                    # the run's own GPU work only: another process's, or a device shared
                    # without per-process figures, is not the run's (agent/gpus.py)
                    ctx.detector.on_tree(now, cpu, io, self.gpus.activity if self._last_gpu else None)
                elif ctx.spec.kind == "torchrun":
                    # no rank (torchrun restarting its workers, a new rendezvous): not
                    # watched, as before the first ranks, rather than judged on stale figures
                    ctx.detector.on_tree(now, None, None)
                if self.intake.phase == "startup" and any((s.cpu_percent or 0) > 50 for s in samples):
                    ctx.detector.on_evidence(now, "cpu")
                if ctx.spec.kind != "torchrun" and samples:
                    self.watch_certain(now, samples)
            if ctx.facts.gpu_probe is not None and int(now) % 2 == 0:
                self._last_gpu = None  # a probe that fails leaves no stale figure behind
                pids = tuple(s.pid for s in samples)
                self._last_gpu = await self.gpus.sample(pids, pids)
        except Exception as e:  # e.g. no file descriptor left to read /proc: no figures this tick
            if self.report is None:
                raise
            self.report("probes", e)
        tick = E.Tick(
            now,
            self.intake.phase,
            round(ctx.detector.idle(now), 1),
            _round(ctx.detector.threshold(now)),
            ctx.policy.auto_recover,
            processes,
            self._last_gpu,
            ctx.ladder.describe() if ctx.ladder is not None else None,
        )
        ctx.facts.workers_seen = tick.workers if processes else None
        ctx.emit(tick)

    def watch_certain(self, now: float, samples) -> None:
        """Feed the certain rules this tick's tree; read the main thread's stack when they
        ask (in a thread, one at a time: a tick never waits for py-spy).  While our own
        py-spy is attached the tree is not fed (its tracer would read as a debugger's)."""
        read = self._stack_read
        if read is not None:
            if not read.done():
                return
            self._stack_read = None
            self.certain.on_stack(None if read.cancelled() or read.exception() else read.result())
        gpu = self._last_gpu.get("util") if self._last_gpu else None
        self.certain.on_tree(now, tree_facts(samples), gpu is not None and gpu >= 5.0)
        if self.certain.stack_wanted(now):
            loop = asyncio.get_running_loop()
            self._stack_read = loop.run_in_executor(None, read_main_wait, samples[0])

    def with_ranks(self, samples, ranks: dict[int, int | None] | None = None) -> tuple[dict, ...]:
        """The tick's process dicts, each rank process and its descendants (DataLoader
        workers) with ``rank`` (:meth:`rank_map`)."""
        ranks = self.rank_map(samples) if ranks is None else ranks
        out = []
        for s in samples:
            d = s.as_dict()
            if ranks.get(s.pid) is not None:
                d["rank"] = ranks[s.pid]
            out.append(d)
        return tuple(out)

    def rank_map(self, samples) -> dict[int, int | None]:
        """pid -> the rank of each process of the tick: a rank process and its descendants
        (DataLoader workers) have the rank's (read from its environment once per new pid);
        the launcher and its other children have None."""
        from trainctl.system.diagnose import find_ranks

        root = samples[0].pid if samples else None
        # the launcher's own children are asked again until they say (caught before exec)
        new = tuple(
            s
            for s in samples
            if s.pid not in self._rank_of or (self._rank_of[s.pid] is None and s.ppid == root)
        )
        if new:
            found = find_ranks(samples)
            for s in new:
                self._rank_of[s.pid] = found.get(s.pid)
        parent = {s.pid: s.ppid for s in samples}
        out: dict[int, int | None] = {}
        for s in samples:
            pid = s.pid
            while pid in parent and self._rank_of.get(pid) is None:
                pid = parent[pid]
            out[s.pid] = self._rank_of.get(pid)
        return out


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 1)
