"""Stopping a trainer: look before killing (diagnose a stall), never kill during a save,
kill the whole tree, then wait until the GPU lets go of its memory.

A diagnosis that fails (py-spy missing, stacks/ unwritable, a psutil race) is reported and
recovery goes on without it: nothing here may leave a stalled run stalled."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import traceback

import psutil

from trainctl.agent import flight
from trainctl.agent.context import RunContext
from trainctl.agent.gpus import RunGpus
from trainctl.agent.intake import Intake
from trainctl.agent.spawner import Trainer
from trainctl.core import events as E
from trainctl.core import gpu_release
from trainctl.core.gpu_text import verdict_devices
from trainctl.core.recovery import RunState
from trainctl.core.torchrun import rendezvous_wait
from trainctl.inside.report import SAVE_REQUEST_SIGNAL, write_save_request
from trainctl.store.paths import make_private_dir
from trainctl.system.diagnose import BUSY_CPU, Diagnosis, main_thread_frames
from trainctl.system.probes import ProcSample

#: The diagnosis measures the tree's CPU over its first second (diagnose's ``sample_s``):
#: a rescue save asked within it would read as a spin.
CPU_WINDOW_S = 1.0
#: The save is asked when the diagnosis says its window is over (its ``on_sampled``), at the
#: latest this long after the window (a diagnosis slow to start on loaded cores).
SAMPLED_LATE_S = 2.0


class Stopper:
    def __init__(self, ctx: RunContext, intake: Intake, report_error) -> None:
        self.ctx = ctx
        self.intake = intake
        self.report_error = report_error  # (where, exception) -> None: an `error` event
        self.gpus = RunGpus(ctx)  # the run's own devices: the attempt loop's, its watch's
        self.requests = 0  # save requests sent (their ids)

    async def diagnose(
        self, trainer: Trainer, tag: str, snapshot: bool = False, on_sampled=None
    ) -> Diagnosis:
        ctx = self.ctx
        try:
            make_private_dir(ctx.files.stacks)
        except OSError:
            pass  # diagnose() says the stacks could not be written
        try:
            gpu = await self.gpus.for_verdict()  # the run's device, its own utilisation
            stacks = trainer.diagnose(
                ctx.files.stacks, f"{tag}-{int(ctx.clock())}", gpu, snapshot=snapshot, on_sampled=on_sampled
            )
            if snapshot:
                return await stacks
            if ctx.spec.kind != "torchrun":
                return self.with_devices(await stacks)
            # the ranks' Flight Recorder, asked while py-spy reads their stacks
            diag, (collectives, said) = await asyncio.gather(stacks, self.flight_verdict())
            if said:
                # no culprit in the stacks (unreadable, or every rank in a collective): the
                # ranks that never entered the collective are
                missing = sorted({r for c in collectives for r in c["missing"]})
                diag = dataclasses.replace(
                    diag,
                    collectives=collectives,
                    detail=f"{said} {diag.detail}",
                    culprits=tuple(diag.culprits) or tuple(missing),
                )
            return self.with_devices(diag)
        except Exception as e:  # noqa: BLE001 - never in the way of recovery
            self.report_error("diagnose", e)
            return Diagnosis("unknown", None, None, f"the diagnosis failed: {e!r}")

    def with_devices(self, diag: Diagnosis) -> Diagnosis:
        """``diag`` with the run's devices as read for it (utilisation, power) in its fields
        and its text: "GPU 0 idle at 60 W (0% util) while the host waits in a collective"."""
        devices = self.gpus.verdict_devices()
        if not devices:
            return diag
        in_collective = any(c["entered"] for c in diag.collectives) or bool(
            diag.rank_pids and not diag.culprits
        )
        said = verdict_devices(devices, in_collective)
        return dataclasses.replace(diag, devices=devices, detail=f"{diag.detail} {said}".strip())

    async def flight_verdict(self) -> tuple[tuple[dict, ...], str]:
        """The ranks' Flight Recorder's verdict (agent/flight.py); ``((), "")`` when it
        fails (said as an error): never in the way of the stacks."""
        try:
            return await asyncio.to_thread(flight.verdict, self.ctx.files.dir)
        except Exception as e:  # noqa: BLE001
            self.report_error("flight_recorder", e)
            return (), ""

    async def on_stall(self, verdict) -> None:
        """A stall: say so at once, then read the stacks while the rescue save is asked and
        taken; the verdict follows as its own event; then end the attempt (when
        auto-recovery is on)."""
        ctx = self.ctx
        trainer = ctx.facts.trainer
        if trainer is None:
            return
        stalled = f"no batch for {verdict.idle_s:.0f}s in {verdict.phase}"
        if verdict.still and rendezvous_wait(ctx.spec.command):
            # several nodes: this node's ranks all still may be waiting for another node's;
            # only the stacks tell, so they come before the stall is said
            diag = await self.diagnose(trainer, f"{ctx.facts.attempt}")
            if diag.rank_pids and not diag.culprits:  # every rank waits in a collective
                ctx.info(
                    f"every rank of this node waits in a collective for "
                    f"{verdict.idle_s:.0f}s in {verdict.phase}: the other nodes are awaited "
                    f"(the phase's threshold still applies). {diag.detail}",
                    "startup_idle_nodes",
                )
                self.intake.stalled = False
                return
            ctx.set_state(RunState.STALLED, stalled)
            self.emit_stall(verdict)
            self.emit_verdict(verdict, diag)
            await self.rescue(trainer, diag)
        else:
            ctx.set_state(RunState.STALLED, stalled)
            self.emit_stall(verdict)
            loop, sampled = asyncio.get_running_loop(), asyncio.Event()
            diagnosing = asyncio.create_task(
                self.diagnose(
                    trainer, f"{ctx.facts.attempt}", on_sampled=lambda: loop.call_soon_threadsafe(sampled.set)
                )
            )
            answers, why = can_answer_now(main_sample(trainer))
            if answers is None:  # busy: only the stacks tell whether it spins in native code
                await asyncio.wait({diagnosing})
                await self.rescue(trainer, diagnosing.result())
            elif answers:  # the save once the diagnosis's CPU window is over: busy, not a spin
                window = asyncio.ensure_future(sampled.wait())
                await asyncio.wait(
                    {window, diagnosing},
                    timeout=CPU_WINDOW_S + SAMPLED_LATE_S,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                window.cancel()
                await asyncio.gather(diagnosing, self.rescue(trainer, None))
            else:
                await self.rescue(trainer, None, why)
            self.emit_verdict(verdict, await diagnosing)
        if ctx.policy.auto_recover and trainer.returncode is None and self.intake.stalled:
            ctx.requests.recover()

    def emit_stall(self, verdict) -> None:
        """The Stall event, at detection (DIAGNOSING): the stalled ranks, the rule that
        proved the hang where one did; its StallDiagnosis follows (:meth:`emit_verdict`)."""
        ctx = self.ctx
        self.intake.stuck_ranks = tuple(verdict.ranks)
        ctx.emit(
            E.Stall(
                ctx.clock(),
                verdict.phase,
                round(verdict.idle_s, 1),
                E.DIAGNOSING,
                None,
                None,
                verdict.threshold_s,
                verdict.reason,
                tuple(verdict.ranks),
                verdict.certain,
            )
        )

    def emit_verdict(self, verdict, diag: Diagnosis) -> None:
        """The StallDiagnosis of the stall just said: what the stacks and the tree say, and
        the culprit ranks (the status marks them stuck; none known: the stalled ranks)."""
        ctx = self.ctx
        self.intake.stuck_ranks = tuple(diag.culprits) or tuple(verdict.ranks)
        ctx.emit(
            E.StallDiagnosis(
                ctx.clock(),
                verdict.phase,
                diag.diagnosis,
                diag.cpu_percent,
                diag.stacks,
                f"{diag.detail} ({verdict.reason})",
                tuple(diag.culprits),
                round(diag.elapsed_s, 1),
                tuple(diag.collectives),
                tuple(diag.devices),
            )
        )

    async def rescue(self, trainer: Trainer, diag: Diagnosis | None, why_not: str = "") -> None:
        """The rescue save of a stalled trainer, unless the diagnosis (or ``why_not``) says
        its main thread cannot answer."""
        ctx = self.ctx
        if not (ctx.policy.auto_recover and trainer.returncode is None and self.intake.stalled):
            return
        if not self.intake.save_on_request:
            return
        if diag is not None and not why_not:
            answers, why = can_answer(diag)
            why_not = "" if answers else why
        if why_not:
            ctx.info(
                f"no rescue save: {why_not}; the restart goes on from the last checkpoint",
                "save_request_skipped",
            )
            return
        await self.request_save(trainer, "rescue")

    async def request_save(self, trainer: Trainer, kind: str) -> bool:
        """Ask a trainer that declared save-on-request to save now ("rescue" on a stall,
        "planned" before a restart), and wait for its checkpoint a bounded time.  Whether
        a good checkpoint came; never raises."""
        ctx, intake = self.ctx, self.intake
        if not intake.save_on_request or trainer.returncode is not None:
            return False
        limit = ctx.spec.rescue_wait_s if kind == "rescue" else ctx.spec.planned_wait_s
        self.requests += 1
        t0, seen = ctx.clock(), intake.checkpoints
        try:
            write_save_request(ctx.files.dir, self.requests, kind, t0, hold=kind == "planned")
            sent = trainer.signal_main(SAVE_REQUEST_SIGNAL)
        except Exception as e:  # noqa: BLE001 - a full disk, a psutil race: kill without the save
            self.report_error("save_request", e)
            return False
        if not sent:
            ctx.info(f"could not signal the trainer for a {kind} save (it is gone)", "save_request")
            return False
        ctx.info(
            f"asked the trainer for a {kind} save (request {self.requests}); waiting up to {limit:.0f}s",
            "save_request",
        )
        while ctx.clock() - t0 < limit and trainer.returncode is None:
            if intake.checkpoints > seen and intake.phase != "save":
                break
            await asyncio.sleep(0.1)
        took = ctx.clock() - t0
        ev = intake.last_checkpoint if intake.checkpoints > seen else None
        if ev is not None and ev.ok:
            ctx.info(f"{kind} save took {took:.1f}s: {ev.path} ({position(ev)})", "save_request_done")
            return True
        if ev is not None:
            ctx.info(
                f"the {kind} save failed after {took:.1f}s: {ev.detail or ev.path}", "save_request_failed"
            )
        elif trainer.returncode is not None:
            ctx.info(
                f"the trainer exited {took:.1f}s after the {kind} save request, without a checkpoint",
                "save_request_failed",
            )
        else:
            ctx.info(
                f"no {kind} save after {took:.0f}s (the main thread does not answer); "
                "stopping it; the restart goes on from the last checkpoint",
                "save_request_timeout",
            )
        return False

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
        # a stalled trainer's workers hold nothing to save: the grace is for its main process
        report = await trainer.kill(ctx.spec.kill_grace_s, workers_at_once=self.intake.stalled)
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
        except Exception as e:  # noqa: BLE001 - a failed sweep is reported
            self.report_error("sweep", e)
            return
        if report.survivors:
            self.ctx.info(f"processes still alive after kill: {list(report.survivors)}", "kill")

    async def wait_gpu_released(self, pids: tuple[int, ...], limit_s: float = gpu_release.LIMIT_S) -> None:
        """On a GPU box, until the killed attempt's device memory is released on every
        device it used (agent/gpus.py); a probe's failure is reported, never in the way."""
        try:
            await self.gpus.wait_released(pids, limit_s)
        except Exception as e:  # noqa: BLE001 - a GPU probe's failure must not hold up the restart
            self.report_error("gpu_release", e)


def position(ev: E.Checkpoint) -> str:
    """'epoch 2 batch 700' (batches done in that epoch), 'end of epoch 2'."""
    if ev.epoch is None:
        return "position unknown"
    return f"epoch {ev.epoch} batch {ev.batch}" if ev.batch is not None else f"end of epoch {ev.epoch}"


_PY_FRAME = re.compile(r"\.pyw?:\d+\)$")


def can_answer(diag: Diagnosis) -> tuple[bool, str]:
    """Whether a stalled trainer's main thread can still run Python (a signal handler),
    from the diagnosis and the stacks; (False, why) only when surely not: the main process
    stopped (SIGSTOP) or in uninterruptible I/O, or spinning in native code.  When unsure,
    True: the bounded wait decides."""
    main = next((p for p in diag.processes if p.role == "main"), None)
    if main is None:
        return True, "main process not sampled"
    if main.status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
        return False, "the main process is stopped (SIGSTOP)"
    if main.status == psutil.STATUS_DISK_SLEEP:
        return False, "the main process is in uninterruptible I/O"
    if diag.diagnosis == "spin" and (main.cpu_percent or 0.0) > BUSY_CPU:
        frame = _main_innermost(diag.stacks, main.pid)
        if frame and not _PY_FRAME.search(frame):
            return False, f"the main thread spins in native code ({frame[:80]})"
    return True, ""


def main_sample(trainer: Trainer) -> ProcSample | None:
    """The main process in the trainer's last tree sample (the watch's tick), if any."""
    sampler = getattr(trainer, "sampler", None)
    last = getattr(sampler, "last", None) or ()
    return next((s for s in last if s.role == "main"), None)


def can_answer_now(main: ProcSample | None) -> tuple[bool | None, str]:
    """Before the diagnosis: (False, why) when the main process surely cannot answer a save
    request (stopped, in uninterruptible I/O); (True, "") when it idles (a deadlock: ask at
    once, the stacks are read meanwhile); (None, "") when it is busy or unknown: only its
    stacks tell a native spin, so the diagnosis decides."""
    if main is None:
        return None, ""
    if main.status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
        return False, "the main process is stopped (SIGSTOP)"
    if main.status == psutil.STATUS_DISK_SLEEP:
        return False, "the main process is in uninterruptible I/O"
    if main.cpu_percent is None or main.cpu_percent > BUSY_CPU:
        return None, ""
    return True, ""


def _main_innermost(stacks: str | None, pid: int) -> str | None:
    """The main thread's innermost frame, native ones included, from the stall dump."""
    if not stacks:
        return None
    try:
        with open(stacks, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    part = re.search(rf"^=== pid {pid} .*?$(.*?)(?=^=== pid |\Z)", text, re.M | re.S)
    if part is None:
        return None
    dump = part.group(1)
    for line in dump.splitlines():
        if line.startswith("Thread ") and ('"MainThread"' in line or line.split()[1:2] == [str(pid)]):
            idx = dump.index(line)
            frames = [ln.strip() for ln in dump[idx:].splitlines()[1:] if ln.startswith("    ")]
            return frames[0] if frames else None
    frames = main_thread_frames(dump)
    return frames[0] if frames else None


def format_traceback(e: BaseException) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__))
