"""Stopping a trainer: look before killing (diagnose a stall), never kill during a save,
kill the whole tree, then wait until the GPU lets go of its memory.

A diagnosis that fails (py-spy missing, stacks/ unwritable, a psutil race) is reported and
recovery goes on without it: nothing here may leave a stalled run stalled."""
from __future__ import annotations

import asyncio
import traceback

from .. import events as E
from ..diagnose import Diagnosis
from ..paths import make_private_dir
from ..supervisor import RunState
from .context import EndRequest, RunContext
from .intake import Intake
from .spawner import Trainer

GPU_RELEASE_S = 30.0


class Stopper:
    def __init__(self, ctx: RunContext, intake: Intake, report_error) -> None:
        self.ctx = ctx
        self.intake = intake
        self.report_error = report_error   # (where, exception) -> None: an `error` event

    async def diagnose(self, trainer: Trainer, tag: str, snapshot: bool = False) -> Diagnosis:
        ctx = self.ctx
        try:
            make_private_dir(ctx.files.stacks)
        except OSError:
            pass   # diagnose() says the stacks could not be written
        try:
            loop = asyncio.get_running_loop()
            probe = ctx.gpu_probe
            gpu = (await loop.run_in_executor(None, probe.sample)
                   if probe is not None and probe.available()[0] else None)
            return await trainer.diagnose(ctx.files.stacks, f"{tag}-{int(ctx.clock())}", gpu,
                                          snapshot=snapshot)
        except Exception as e:   # never in the way of recovery
            self.report_error("diagnose", e)
            return Diagnosis("unknown", None, None, f"the diagnosis failed: {e!r}")

    async def on_stall(self, verdict) -> None:
        """A stall: say so, diagnose it, then end the attempt (when auto-recovery is on)."""
        ctx = self.ctx
        trainer = ctx.trainer
        if trainer is None:
            return
        ctx.set_state(RunState.STALLED, f"no batch for {verdict.idle_s:.0f}s in {verdict.phase}")
        diag = await self.diagnose(trainer, f"{ctx.attempt}")
        ctx.emit(E.Stall(ctx.clock(), verdict.phase, round(verdict.idle_s, 1), diag.diagnosis,
                         diag.cpu_percent, diag.stacks, verdict.threshold_s,
                         f"{diag.detail} ({verdict.reason})"))
        if ctx.policy.auto_recover and trainer.returncode is None and self.intake.stalled:
            ctx.interrupt.set(EndRequest.STALL)

    async def kill(self, trainer: Trainer, why: str) -> None:
        """Kill the trainer's whole tree — but never while it writes a checkpoint."""
        ctx = self.ctx
        if self.intake.phase == "save":
            ctx.info(f"waiting for the checkpoint save to finish before stopping ({why})", "save_wait")
            deadline = ctx.clock() + ctx.spec.save_wait_s
            while self.intake.phase == "save" and trainer.returncode is None and ctx.clock() < deadline:
                await asyncio.sleep(0.1)
        if ctx.sm.state != RunState.STOPPING:
            ctx.set_state(RunState.STOPPING, why)
        report = await trainer.kill(ctx.spec.kill_grace_s)
        detail = f"killed {len(report.pids)} processes in {report.seconds:.1f}s"
        if report.forced:
            detail += f" ({len(report.forced)} needed SIGKILL)"
        if report.survivors:
            detail += f"; STILL ALIVE: {list(report.survivors)}"
        ctx.info(detail, "kill")
        await self.wait_gpu_released(report.pids)

    async def sweep(self, trainer: Trainer) -> None:
        try:
            report = await trainer.sweep()
        except Exception as e:
            self.report_error("sweep", e)
            return
        if report.survivors:
            self.ctx.info(f"processes still alive after kill: {list(report.survivors)}", "kill")

    async def wait_gpu_released(self, pids: tuple[int, ...], limit_s: float = GPU_RELEASE_S) -> None:
        ctx = self.ctx
        probe = ctx.gpu_probe
        try:
            if probe is None or not getattr(probe, "available", lambda: (False, ""))()[0]:
                return
            loop = asyncio.get_running_loop()
            t0 = ctx.clock()
            held: list[int] = []
            while ctx.clock() - t0 < limit_s:
                sample = await loop.run_in_executor(None, probe.sample)
                held = [p for p, _mem in sample.processes if p in pids] if sample else []
                if not held:
                    ctx.info(f"GPU memory released after {ctx.clock() - t0:.1f}s", "gpu_release")
                    return
                await asyncio.sleep(0.5)
            ctx.info(f"GPU memory still held by {held} after {limit_s:.0f}s; restarting anyway",
                     "gpu_release")
        except Exception as e:   # a GPU probe's failure must not hold up the restart
            self.report_error("gpu_release", e)


def format_traceback(e: BaseException) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__))
