"""The attempt loop: the supervisor's state machine over attempts.

Each attempt: build the trainer's argv/env from its runner kind, ask the Spawner for a
trainer, take in its output and side channel, watch it, and wait until it exits or an
end request (a stall, a user command) comes; then the pure RecoveryPolicy decides what
comes next (restart with which preset after which pause, finish, fail, stop).  Time comes
from the context's clock and asyncio's sleeps, so a fake spawner on a virtual-time loop
replays a whole recovery in milliseconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import signal
from collections.abc import Callable

from trainctl.agent.checkpoint_keep import INFO_KEY as KEPT_KEY
from trainctl.agent.checkpoint_keep import Kept, keep_for_restart
from trainctl.agent.context import RunContext
from trainctl.agent.intake import Intake
from trainctl.agent.launch import runner_for, trainer_env
from trainctl.agent.plug import AgentPlug
from trainctl.agent.requests import EndRequest
from trainctl.agent.spawner import Spawner, Trainer
from trainctl.agent.stop import Stopper
from trainctl.agent.tasks import ErrorReporter, supervise
from trainctl.agent.watch import Watcher
from trainctl.agent.zero_code import is_python
from trainctl.config import ConfigError
from trainctl.core import events as E
from trainctl.core.recovery import Outcome, OutcomeKind, RunState, exit_code, reached_the_end
from trainctl.core.torchrun import SETUP_MARK, rendezvous_wait
from trainctl.core.tracebacks import last_exception
from trainctl.inside import INSTRUMENT_ENV, OFF_KEY
from trainctl.system.process import signal_name

READERS_DRAIN_S = 5.0
EXIT_SUPERVISION_LOST = 5  # the agent could not go on supervising (its reason is journaled)
KILL_RETRY_S = 1.0
OFFSETS_S = 1.0


def with_setup(argv: list[str], setup: str) -> list[str]:
    """``argv`` run after the job's environment setup (``[host] setup``, e.g. ``source
    ~/venv/bin/activate``): through bash (``source`` is not POSIX sh), which then execs
    the trainer (same pid)."""
    if not setup.strip():
        return argv
    shell = shutil.which("bash") or "/bin/sh"
    return [shell, "-c", f'{setup}\nexec "$@"', SETUP_MARK, *argv]


_IMPORT_ERROR = ("ModuleNotFoundError:", "ImportError:")
_HEALTH_ADVICE = (
    "Check the device (nvidia-smi / rocm-smi, its Xid or dmesg lines), reset it or train on "
    "another one (CUDA_VISIBLE_DEVICES), then `trainctl run ... --resume-from RUN_DIR`."
)


class AttemptLoop:
    def __init__(
        self,
        ctx: RunContext,
        spawner: Spawner,
        report: ErrorReporter,
        on_give_up,
        plug: AgentPlug | None = None,
    ) -> None:
        self.ctx = ctx
        self.spawner = spawner
        self.report = report
        self.on_give_up = on_give_up
        self.intake = Intake(ctx)
        self.stopper = Stopper(ctx, self.intake, report)
        self.runner = runner_for(ctx.spec.kind)
        self._log_loss_warned = False
        self._instrument_said = False
        # What the host adds (a Slurm job: what ends this agent's part of the run at a
        # suspend, the job journaled in each start event).
        self.plug = plug or AgentPlug()
        # Before each start: the run directory made again if it was deleted (the agent's
        # keeper looks every second; an attempt may start sooner).  None: not looked at.
        self.before_start: Callable[[], object] | None = None

    # ------------------------------------------------------------------ the loop
    async def run(
        self,
        adopted: Trainer | None = None,
        outcome: Outcome | None = None,
        resume: bool = False,
        restart: E.Restart | None = None,
    ) -> int:
        """The attempts, from the first one; or, for an agent that takes over a run, from
        the ``adopted`` trainer of attempt ``ctx.facts.attempt``, or from the ``outcome`` of an
        attempt whose decision its dead agent never journaled, or from the ``restart`` it
        journaled before it died in the back-off (waited out, never decided nor journaled
        again); ``resume``: the next attempt of a run an earlier Slurm job suspended, from
        its last good checkpoint."""
        ctx = self.ctx
        preset = ctx.facts.preset
        resume_from: str | None = None
        waits = rendezvous_wait(ctx.spec.command)
        if waits and adopted is None and outcome is None:
            ctx.info(
                f"{waits}: the deadlock watch before the first batch starts with the ranks "
                "(the launcher at its rendezvous is not watched), and a still node whose "
                "every rank waits in a collective is waiting for the other nodes",
                "startup_idle_nodes",
            )
        if resume:
            resume_from = await self.find_resume()
        elif adopted is None and outcome is None:
            resume_from = ctx.spec.resume_from  # --resume-from, for the first attempt
            if resume_from:
                ctx.facts.last_checkpoint = resume_from
                ctx.info(f"starting from checkpoint {resume_from} (--resume-from)", "resume_from")
        while True:
            if restart is not None:  # the dead agent's back-off, what is left of it
                preset, resume_from = restart.preset, restart.resume_from
                delay = max(0.0, restart.ts + (restart.delay_s or 0.0) - ctx.clock())
                if ctx.sm.state != RunState.BACKOFF:
                    ctx.set_state(RunState.BACKOFF, restart.reason)
                restart = outcome = None
                if (code := await self.backoff(delay, preset)) is not None:
                    return code
                preset = ctx.requests.take_next(preset)
                continue
            if outcome is None:
                if adopted is None:
                    ctx.facts.attempt += 1
                ctx.facts.preset = preset
                ctx.projector.preset = preset
                outcome = await self.run_attempt(preset, resume_from, adopted)
                adopted = None
            asked = ctx.requests
            if asked.ending is not None:  # Slurm ends the job: why decides what comes next
                await asyncio.wait({asked.ending}, timeout=15)
                if asked.suspend_requested.is_set() and not asked.stop_requested.is_set():
                    outcome = dataclasses.replace(outcome, kind=OutcomeKind.SUSPEND)
                elif asked.stop_requested.is_set() and outcome.kind in (OutcomeKind.CRASH, OutcomeKind.STALL):
                    outcome = dataclasses.replace(outcome, kind=OutcomeKind.USER_STOP)
            decision = ctx.decide(outcome, ctx.clock())
            if decision.action == "finish":
                ctx.set_state(RunState.FINISHED, decision.reason)
                return exit_code(RunState.FINISHED)
            if decision.action == "stop":
                return self.stopped(asked.stop_reason or decision.reason)
            if decision.action == "suspend":
                return await self.suspend()
            if decision.action == "fail":
                await self.fail(decision.reason, outcome)
                return exit_code(RunState.FAILED)
            if failed := await self.unhealthy_devices():  # never trained on
                ctx.set_state(RunState.FAILED, failed)
                ctx.emit(
                    E.Warning(
                        ctx.clock(), "trainctl.gpu_health", "fatal", failed, _HEALTH_ADVICE, source="trainctl"
                    )
                )
                return exit_code(RunState.FAILED)
            preset = asked.take_next(decision.preset)
            kept = await self.keep_resume(await self.find_resume())
            resume_from = kept.resume_from
            ctx.set_state(RunState.BACKOFF, decision.reason)
            ctx.emit(
                E.Restart(
                    ctx.clock(),
                    ctx.facts.attempt + 1,
                    decision.reason,
                    preset,
                    resume_from,
                    decision.delay_s,
                    **kept.restart_fields(ctx.projector.redone_since_checkpoint()),
                )
            )
            if (code := await self.backoff(decision.delay_s, preset)) is not None:
                return code
            preset = asked.take_next(preset)
            outcome = None

    async def backoff(self, delay_s: float, preset: str | None) -> int | None:
        """Wait out a back-off: the run's exit code when a stop or a suspend ends it."""
        ctx, asked = self.ctx, self.ctx.requests
        stop = asyncio.create_task(asked.stop_requested.wait())
        suspend = asyncio.create_task(asked.suspend_requested.wait())
        await asyncio.wait({stop, suspend}, timeout=delay_s, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        suspend.cancel()
        if asked.stop_requested.is_set():
            return self.stopped(asked.stop_reason or "stopped by the user during backoff")
        if asked.suspend_requested.is_set():
            return await self.suspend()
        if asked.next_preset is not None and asked.next_preset != preset:  # picked meanwhile
            ctx.info(
                f"attempt {ctx.facts.attempt + 1} uses preset {asked.next_preset}, picked during the backoff",
                "next_preset",
            )
        return None

    async def suspend(self) -> int:
        """The Slurm job's time limit is near and the trainer is saved and gone: the part
        that knows Slurm submits the next job (without it, the run stops)."""
        code = await self.plug.suspend()
        return self.stopped("stopped: its time ran out") if code is None else code

    def stopped(self, reason: str) -> int:
        """The run ends on a stop: the user's (STOPPED, 130), or the agent's own when its
        supervision could not go on (FAILED, EXIT_SUPERVISION_LOST)."""
        ctx = self.ctx
        if ctx.requests.lost is not None:
            ctx.set_state(RunState.FAILED, ctx.requests.lost)
            return EXIT_SUPERVISION_LOST
        ctx.set_state(RunState.STOPPED, reason)
        return exit_code(RunState.STOPPED)

    async def unhealthy_devices(self) -> str:
        """Before a restart, the check of the attempt's GPUs (agent/gpus.py): why the
        restart must not train on them, or "" (passed, skipped, no GPU, a remote host)."""
        ctx = self.ctx
        if ctx.spec.remote or not ctx.spec.command:
            return ""
        python = ctx.spec.command[0] if is_python(ctx.spec.command[0]) else None
        try:
            health = await self.stopper.gpus.health_check(python)
        except Exception as e:  # noqa: BLE001 - a check that cannot run stops nothing
            self.report("gpu_health", e)
            return ""
        if health is None or not health.failed:
            return ""
        return f"not restarting on a GPU that failed its health check: {health.said()}"

    async def fail(self, reason: str, outcome: Outcome) -> None:
        ctx = self.ctx
        ctx.set_state(RunState.FAILED, reason)
        advice = (
            "Fix the command or preset named above, then `trainctl run` again."
            if outcome.returncode is None
            else "Read the stall diagnosis, warnings and stacks above; fix, then `trainctl run` again."
        )
        if outcome.exception and outcome.exception.startswith(_IMPORT_ERROR):
            advice = (
                "Install the missing module in the environment the trainer runs in (the "
                "python that runs it), then `trainctl run` again."
            )
            if ctx.spec.remote:
                now = f"(now: {ctx.spec.setup!r})" if ctx.spec.setup.strip() else "(none set)"
                advice = (
                    f"On {ctx.spec.host} the trainer runs in a non-login shell, where "
                    "`python` is often not your venv's: say how to prepare the environment "
                    'with [host] setup = "source ~/venv/bin/activate" (or a conda '
                    f"activate line) in the job {now}, or install the module there."
                )
        elif outcome.exception and outcome.stop_reason:
            advice = "Fix the error above (a restart would meet it again), then `trainctl run` again."
        good = await self.find_resume() if outcome.returncode is not None else None
        if good:
            advice += (
                f" To go on from its last good checkpoint ({good}): "
                f"`trainctl run ... --resume-from {ctx.files.dir}`."
            )
        ctx.emit(E.Warning(ctx.clock(), "trainctl.failed", "fatal", reason, advice, source="trainctl"))

    def resume_checkpoint(self, say: Callable[[str, str], None] | None = None) -> str | None:
        """The checkpoint a restart goes on from (the runner's rule); ``say(text, key)`` gets
        each candidate refused or taken unverified (default: journaled at once)."""
        ctx = self.ctx
        say = say or ctx.info
        return self.runner.resume_checkpoint(
            ctx.spec,
            ctx.files,
            ctx.facts.last_checkpoint,
            on_skip=lambda path, why: say(f"not resuming from {path}: {why}", "resume_skip"),
            on_unverified=lambda path, why: say(
                f"resuming from {path} without verifying it: {why}", "resume_unverified"
            ),
        )

    async def find_resume(self) -> str | None:
        """:meth:`resume_checkpoint` off the event loop: the rule verifies checkpoints and
        reads the journal (seconds on a long run).  What it says is journaled here, in order."""
        said: list[tuple[str, str]] = []
        try:
            return await asyncio.get_running_loop().run_in_executor(
                None, lambda: self.resume_checkpoint(lambda text, key: said.append((text, key)))
            )
        finally:
            for text, key in said:
                self.ctx.info(text, key)

    async def keep_resume(self, chosen: str | None) -> Kept:
        """A command's restart: a copy of the checkpoint it resumes from (agent/checkpoint_keep.py)."""
        ctx = self.ctx
        if ctx.spec.kind not in ("command", "torchrun") or chosen is None:
            return Kept(chosen)
        kept = await asyncio.get_running_loop().run_in_executor(
            None, keep_for_restart, ctx.spec, ctx.files, chosen, ctx.facts.attempt + 1
        )
        for text in kept.said:
            ctx.info(text, KEPT_KEY)
        return kept

    def command(self, preset_name: str | None, resume_from: str | None) -> tuple[list[str], dict[str, str]]:
        ctx = self.ctx
        preset = ctx.load_preset(preset_name)
        env = trainer_env(ctx.files, preset_name, preset, ctx.facts.attempt)
        argv = self.runner.argv(ctx.spec, ctx.files, preset_name, preset, resume_from, ctx.facts.attempt)
        try:
            env = self.runner.env(ctx.spec, ctx.files, env, argv, resume_from)
        except OSError as e:  # the run directory's links (a full disk): run it as it is
            self._instrument_said = True
            ctx.info(
                f"no integration: cannot prepare trainctl's code for the trainer ({e}); console parsing",
                OFF_KEY,
            )
        ctx.facts.instrumented = INSTRUMENT_ENV in env
        ctx.facts.env_names = tuple(sorted(env))
        return with_setup(argv, ctx.spec.setup), env

    def say_instrument(self) -> None:
        """Once a run: why a command gets no zero-code integration (an instrumented one says
        itself which attached; the intake says when none did)."""
        ctx = self.ctx
        if self._instrument_said or ctx.spec.kind != "command" or ctx.facts.instrumented:
            return
        self._instrument_said = True
        why = (
            "off (--no-instrument)"
            if not ctx.spec.instrument
            else "not a Python command (python ..., or a script whose #! names python)"
        )
        ctx.info(f"no integration: {why}; console parsing", OFF_KEY)

    # ------------------------------------------------------------------ one attempt
    async def run_attempt(
        self, preset: str | None, resume_from: str | None, adopted: Trainer | None = None
    ) -> Outcome:
        ctx, intake = self.ctx, self.intake
        asked = ctx.requests.new_attempt()
        if ctx.sm.state != RunState.STARTING:
            ctx.set_state(RunState.STARTING, f"attempt {ctx.facts.attempt}")
        if adopted is not None:
            trainer = adopted
        else:
            started = await self.start(preset, resume_from)
            if isinstance(started, Outcome):
                return started
            trainer = started
        ctx.facts.trainer = trainer
        self._log_loss_warned = False
        now = ctx.clock()
        ctx.detector.reset(now)
        intake.begin(now)
        if adopted is not None:  # what its trainer declared before this agent took over
            intake.save_on_request = adopted.save_on_request
            intake.replay_until = ctx.facts.furthest  # lines read again since the last saved offset
        watcher = Watcher(ctx, intake, self.on_stall, self.report, self.stopper.gpus)
        readers = [
            supervise("output", lambda: self.read_output(trainer), self.report, self.on_give_up),
            supervise("side_channel", lambda: self.read_side(trainer), self.report, self.on_give_up),
        ]
        if trainer.rank_output() is not None:  # torchrun: each rank's own output files
            readers.append(supervise("ranks", lambda: self.read_ranks(trainer), self.report, self.on_give_up))
        watch = supervise("watch", watcher.run, self.report, self.on_give_up)
        offsets = supervise("offsets", lambda: self.keep_offsets(trainer), self.report)
        waiter = asyncio.create_task(trainer.wait())
        interrupt = asyncio.create_task(asked.event.wait())
        await asyncio.wait({waiter, interrupt}, return_when=asyncio.FIRST_COMPLETED)
        kind: OutcomeKind | None = None
        if not waiter.done():
            kind = OutcomeKind(asked.why.value)
            if asked.kind in (EndRequest.USER_RESTART, EndRequest.SUSPEND) and not intake.stalled:
                # restart, preset switch, fallback, the editor's save-and-restart, a Slurm
                # job's time limit: a healthy run saves first and loses nothing (bounded; a
                # trainer that cannot is killed)
                await self.stopper.request_save(trainer, "planned")
            if not waiter.done():
                await self.kill(trainer, kind.value, waiter)
        returncode = await waiter
        interrupt.cancel()
        returncode = self._judge_unknown_exit(trainer, intake, returncode)
        await self.stopper.sweep(trainer)  # orphaned workers included
        try:
            await asyncio.wait_for(asyncio.gather(*readers), READERS_DRAIN_S)
        except TimeoutError:
            for t in readers:
                t.cancel()
        watch.cancel()
        offsets.cancel()
        if watcher.stall_task is not None and not watcher.stall_task.done():
            watcher.stall_task.cancel()
        intake.flush_logs()
        intake.flush_progress(ctx.clock(), force=True)
        self.report_log_loss(trainer, final=True)
        exception, tb = last_exception(intake.tail) if returncode else (None, ())
        ctx.emit(E.Exit(ctx.clock(), returncode, signal_name(returncode), exception, tb))
        if returncode == 0:
            ctx.project(ctx.clock())  # the end: status and the dashboard say 'finished'
        ctx.save_detector_state()
        ctx.facts.trainer = None
        if kind is None or (kind == OutcomeKind.STALL and returncode == 0):
            kind = OutcomeKind.FINISHED if returncode == 0 else OutcomeKind.CRASH
        return Outcome(
            kind,
            intake.progressed,
            returncode,
            preset,
            requested_preset=asked.preset,
            stop_reason=intake.fatal_stop,
            exception=exception,
        )

    def _judge_unknown_exit(self, trainer: Trainer, intake: Intake, returncode: int) -> int:
        """An adopted trainer whose holder was killed ends with no exit status anyone can
        read: finished (0) when it had reached its end, else a crash (as read, -9)."""
        unknown = trainer.exit_unknown
        if not unknown or intake.stalled:
            return returncode
        p = intake.last_progress
        where = f"epoch {p.epoch}/{p.epochs}, batch {p.batch}/{p.batches}" if p else "no batch read"
        ended = (
            reached_the_end(p.epoch, p.epochs, p.batch, p.batches, intake.phase)
            if p
            else intake.phase == "finished"
        )
        if ended:
            self.ctx.info(f"{unknown}; it had reached its end ({where}): taken as finished", "exit.unknown")
            return 0
        self.ctx.info(f"{unknown}; it stopped at {where}: taken as a crash", "exit.unknown")
        return returncode

    async def start(self, preset: str | None, resume_from: str | None) -> Trainer | Outcome:
        """A new trainer (its start event journaled), or the outcome of failing to start one."""
        ctx = self.ctx
        if self.before_start is not None:
            try:
                self.before_start()
            except Exception as e:  # noqa: BLE001 - the start says what is missing, if anything
                self.report("before_start", e)
        try:
            argv, env = self.command(preset, resume_from)
        except ConfigError as e:
            ctx.emit(
                E.Warning(
                    ctx.clock(),
                    "trainctl.preset_invalid",
                    "fatal",
                    str(e),
                    "Fix the preset (trainctl presets validate) and restart.",
                    source="trainctl",
                )
            )
            return Outcome(OutcomeKind.CRASH, False, None, preset, stop_reason=str(e))
        try:
            await self.stopper.gpus.begin_attempt()  # each device's memory before it starts
        except Exception as e:  # noqa: BLE001 - a GPU probe's failure costs the baseline only
            self.report("gpu", e)
        try:
            trainer = await self.spawner.spawn(argv, env, ctx.spec.cwd, ctx.files.log)
        except OSError as e:
            ctx.emit(
                E.Warning(
                    ctx.clock(),
                    "trainctl.spawn_failed",
                    "fatal",
                    f"cannot start {argv[0]}: {e}",
                    "Check the command and its path.",
                    source="trainctl",
                )
            )
            return Outcome(OutcomeKind.CRASH, False, None, preset, stop_reason=str(e))
        ctx.emit(
            E.Start(
                ctx.clock(),
                ctx.facts.attempt,
                trainer.pid,
                preset,
                tuple(argv),
                slurm_job=self.plug.job_id,
                env=ctx.facts.env_names,
            )
        )
        self.say_instrument()
        return trainer

    async def keep_offsets(self, trainer: Trainer) -> None:
        """Where a new agent would read this trainer's files on from, every OFFSETS_S."""
        from trainctl.agent.holder_spawner import save_offsets

        if trainer.offsets() is None:
            return
        while True:
            await asyncio.sleep(OFFSETS_S)
            if (offsets := trainer.offsets()) is not None:
                save_offsets(self.ctx.files.dir, offsets)

    async def kill(self, trainer: Trainer, why: str, waiter: asyncio.Task) -> None:
        """Kill it; if killing fails (no file descriptors left, a psutil race), say so and
        fall back to SIGKILL of its process group (its pid cannot have been reused: it is
        our child and not reaped yet), until it is gone."""
        try:
            await self.stopper.kill(trainer, why)
            return
        except Exception as e:  # noqa: BLE001 - a failed kill is reported, the wait goes on
            self.report("kill", e)
        while not waiter.done():
            try:
                os.killpg(trainer.pid, signal.SIGKILL)
            except OSError:
                pass
            await asyncio.wait({waiter}, timeout=KILL_RETRY_S)

    async def on_stall(self, verdict) -> None:
        try:
            await self.stopper.on_stall(verdict)
        except Exception as e:  # noqa: BLE001 - recovery must happen even if the stall report failed
            self.report("stall", e)
            if self.ctx.policy.auto_recover and self.ctx.facts.trainer is not None:
                self.ctx.requests.recover()

    # ------------------------------------------------------------------ reading
    async def read_output(self, trainer: Trainer) -> None:
        async for data in trainer.output():
            self.intake.on_output(data)
            self.report_log_loss(trainer)
        self.intake.end_output()

    async def read_ranks(self, trainer: Trainer) -> None:
        ranks = trainer.rank_output()
        if ranks is not None:
            async for rank, stream, data in ranks:
                self.intake.on_rank_output(rank, stream, data)
        self.intake.end_rank_output()

    async def read_side(self, trainer: Trainer) -> None:
        async for line in trainer.side_lines():
            try:
                self.intake.on_side_line(line)
            except Exception as e:  # noqa: BLE001 - a bug meeting one line: said, the next lines read
                self.report("side_channel", e)

    def report_log_loss(self, trainer: Trainer, final: bool = False) -> None:
        """One warning when train.log starts losing lines; the count at the attempt's end."""
        ctx = self.ctx
        if trainer.log_dropped and not self._log_loss_warned:
            self._log_loss_warned = True
            ctx.emit(
                E.Warning(
                    ctx.clock(),
                    "trainctl.log_write_failed",
                    "error",
                    f"cannot write {ctx.files.log}: {trainer.log_error}",
                    "Free disk space. Supervision goes on; the lines are read but not "
                    "kept in train.log until then.",
                    source="trainctl",
                )
            )
        elif final and trainer.log_dropped:
            ctx.info(f"{trainer.log_dropped} lines of output could not be kept in train.log", "log_dropped")
