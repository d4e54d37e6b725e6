"""The agent: the headless supervisor of one run.  It wires the parts (context, bus and its
sinks, attempt loop, socket server, command handlers, kernel log) and owns their life:
the job lock, agent.json, signals, and an orderly end."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from trainctl import __version__
from trainctl.agent.adopt import projector_catches_up, where_the_run_was
from trainctl.agent.attempt import AttemptLoop
from trainctl.agent.bus import PrinterSink
from trainctl.agent.checkpoint_watch import CheckpointWatch
from trainctl.agent.claim import RunBusy, agent_lock, claim_run
from trainctl.agent.context import RunConfig, RunContext
from trainctl.agent.handlers import CommandHandlers
from trainctl.agent.holder_spawner import held_spawner
from trainctl.agent.plug import AgentPlug
from trainctl.agent.server import ClientServer
from trainctl.agent.snapshots import SnapshotKeeper
from trainctl.agent.spawner import PipeSpawner, Spawner
from trainctl.agent.tasks import ErrorReporter
from trainctl.core import events as E
from trainctl.core.recovery import exit_code
from trainctl.store.joblock import JobBusy, JobLock
from trainctl.store.journal import Journal
from trainctl.store.paths import RunFiles, make_private_dir, write_private
from trainctl.store.spec import RunSpec
from trainctl.system.machine import where_i_run
from trainctl.system.process import become_subreaper

KEEP_S = 1.0  # how often the agent looks whether its run directory or socket were deleted


class Agent:
    def __init__(
        self,
        run_dir: Path,
        spec: RunSpec,
        *,
        printer: Callable[[E.Event], None] | None = None,
        clock: Callable[[], float] = time.time,
        gpu_probe=None,
        serve: bool = True,
        on_locked: Callable[[], None] | None = None,
        spawner: Spawner | None = None,
        kernel_log: bool | None = None,
        adopt: bool = False,
        subreaper: bool = True,
        plug: AgentPlug | None = None,
    ):
        """``on_locked``: called once the job is this agent's (its lock taken), before the
        trainer starts: `trainctl run --headless` points `latest` at the run then.
        ``spawner``: how trainers are started (a fake one in tests; by default each
        trainer runs under a holder and outlives this agent).  ``adopt``: take over a run
        whose agent died (its trainer, or its attempt loop, goes on).  ``subreaper``: become
        the child subreaper of orphans (off in tests that run an agent inside pytest).
        ``plug``: what the host adds (src/trainctl/agent/plug.py): a run's Slurm batch job
        (`agent --slurm`, src/trainctl/hosts/slurm/agent_part.py) goes on with the run an
        earlier job began, and continues it in a next job at the time limit."""
        files = RunFiles(run_dir)  # the context is given what it reads, opened here
        self.ctx = ctx = RunContext(RunConfig(files, spec, clock), Journal(files.events), None, gpu_probe)
        self.files, self.spec, self.clock = ctx.files, spec, clock
        self.on_locked = on_locked
        self.serve = serve
        self.kernel_log = spec.kernel_log if kernel_log is None else kernel_log
        self.report = ErrorReporter(ctx.emit, ctx.files.dir / "errors", clock)
        self.adopt = adopt
        self.subreaper = subreaper
        self.lock = JobLock(spec.job_name)
        if spawner is None and os.environ.get("TRAINCTL_SPAWNER") == "pipe":
            spawner = PipeSpawner()  # for side-by-side benches only: the trainer dies with the agent
        self.spawner = spawner or held_spawner(ctx, self._lock_fd)
        self.plug = plug or AgentPlug()
        self.loop = AttemptLoop(ctx, self.spawner, self.report, self.give_up, self.plug)
        self.loop.before_start = self._say_remade
        self.plug.attach(ctx, self.loop)
        self.commands = CommandHandlers(ctx, self.hello, self.loop.intake, self.loop.stopper)
        self.snapshots = SnapshotKeeper(ctx.files.dir, ctx.journal, clock)
        self.commands.goodput = self.snapshots.goodput
        self.commands.resumed = lambda: self.snapshots.view.resumed if self.snapshots.ready else None
        self.server = ClientServer(
            ctx.files.sock, ctx.journal, self.hello, self.commands, snapshot=self.snapshots.current
        )
        ctx.bus.on_journaled.append(self.snapshots)
        ctx.bus.sinks.append(self.server)
        if printer is not None:
            ctx.bus.printers.append(PrinterSink(printer))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._agent_lock: int | None = None
        self._more_locks: list[int] = []  # agent.lock made again in a re-made run directory
        self._kept: dict[str, bytes] = {}  # the run's own small files, to make them again
        self.alerts = _alert_sink(ctx, self._alert_warning)
        if self.alerts is not None:
            ctx.bus.printers.append(self.alerts)

    # the names the CLI, tests and benches read
    @property
    def journal(self):
        return self.ctx.journal

    @property
    def intake(self):
        return self.loop.intake

    def emit(self, ev: E.Event) -> E.Event:
        return self.ctx.emit(ev)

    def hello(self) -> dict:
        ctx, spec = self.ctx, self.spec
        return {
            "op": "hello",
            "ok": True,
            "version": __version__,
            "job": spec.job_name,
            "run_dir": str(ctx.files.dir),
            "host": spec.host,
            "state": ctx.sm.state.value,
            "auto_recover": ctx.policy.auto_recover,
            "preset": ctx.facts.preset,
            "fallback": spec.fallback,
            "attempt": ctx.facts.attempt,
            "deadline": spec.deadline,
            "budget": spec.budget,
            "currency": spec.currency,
            "live": True,
        }

    def give_up(self, where: str, exc: BaseException) -> None:
        """A supervised task failed too often: supervision cannot go on.  Say so (an error
        warning, FAILED with the reason) and end the attempt; never silently."""
        ctx = self.ctx
        lost = f"the agent's {where} task kept failing ({type(exc).__name__}: {exc})"
        ctx.emit(
            E.Warning(
                ctx.clock(),
                "trainctl.supervision_lost",
                "fatal",
                lost,
                f"See {ctx.files.dir / 'errors'}; the trainer is stopped rather than left unwatched.",
                source="trainctl",
            )
        )
        ctx.requests.give_up(lost)

    def _alert_warning(self, ev: E.Warning) -> None:
        """From the alerts thread: journal it on the loop."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.ctx.emit, ev)

    # ------------------------------------------------------------------ life
    async def run(self) -> int:
        loop = self._loop = asyncio.get_running_loop()
        ctx = self.ctx
        begun = self.plug.takes_over_begun and _begun(ctx.files.events)  # an earlier job's run
        if self.subreaper:
            become_subreaper()
        loop.set_exception_handler(_quiet_repeats(loop))
        handlers: dict[int, Callable[[], None]] = {
            signal.SIGINT: self._on_signal,
            signal.SIGTERM: self._on_signal,
            signal.SIGHUP: lambda: None,
        }  # SIGHUP: the run outlives the terminal
        handlers.update(self.plug.signals())
        for sig, handler in handlers.items():
            loop.add_signal_handler(sig, handler)
        try:
            make_private_dir(ctx.files.dir)
        except OSError as e:  # UnsafePathError: not ours, or open to others
            print(f"trainctl: {e}", file=sys.stderr, flush=True)
            return 2
        try:  # (blocking: nothing of this agent may run, nor write to the run, before it)
            run_lock = self._agent_lock = claim_run(
                ctx.files.dir,
                self.lock,
                adopt=self.adopt,
                wait_s=self.plug.takeover_wait_s if begun and not self.adopt else 0.0,
                say=lambda text: print(text, flush=True),
            )
        except RunBusy as e:
            print(f"trainctl: {e}", file=sys.stderr, flush=True)
            return 2
        if self.on_locked is not None:
            self.on_locked()
        self._kept = _small_files(ctx.files.dir)
        priming = asyncio.ensure_future(self._prime_snapshots())
        self._write_info()
        if self.alerts is not None:
            ctx.info(f"alerts to {', '.join(self.alerts.about)} on {', '.join(self.alerts.on)}", "alerts")
        if self.serve:
            await self.server.start()
        # (not in an agent without a socket: tests on a virtual-time loop, where a timer
        # every second would make time race ahead while an executor job runs)
        keeper = asyncio.ensure_future(self._keep_run_dir()) if self.serve else None
        kernel = self._start_kernel_log()
        found = (
            await CheckpointWatch.start(ctx, lambda: self.loop.intake.last_progress) if self.serve else None
        )
        if ctx.facts.gpu_probe is None:
            from trainctl.system.gpu import detect_gpu_probe

            ctx.facts.gpu_probe = await loop.run_in_executor(None, detect_gpu_probe)
        try:
            try:
                await self.plug.begin()
            except Exception as e:  # noqa: BLE001 - supervision goes on without the host's facts
                self.report(self.plug.name, e)
            if self.adopt or begun:
                return await self._take_over()
            return await self.loop.run()
        finally:
            if keeper is not None:
                keeper.cancel()
            if kernel is not None:
                kernel.stop()
            if found is not None:
                found.stop()
            if self.serve:
                await self.server.close()
            if not priming.done():
                await asyncio.wait([priming], timeout=30.0)
            await loop.run_in_executor(None, self.snapshots.close)
            if self.alerts is not None:  # the last message (finished, failed), bounded
                await loop.run_in_executor(None, self.alerts.close)
            ctx.journal.close()
            self.lock.release()
            os.close(run_lock)
            for fd in self._more_locks:
                os.close(fd)

    async def _keep_run_dir(self) -> None:
        """Every KEEP_S: the run directory deleted by mistake (``rm -rf``) is made again with
        what this agent holds (journal, spec, agent.json, agent.lock, socket) while the
        holder makes its own files again (src/trainctl/holder/main.py), and the training goes on; a
        socket file deleted alone is made again too, so clients reach the agent."""
        while True:
            await asyncio.sleep(KEEP_S)
            try:
                self._say_remade()
                if self.serve and await self.server.keep_listening():
                    self.ctx.info(
                        f"the agent's socket {self.files.sock} was deleted: listening on a new one",
                        "socket.remade",
                    )
            except Exception as e:  # noqa: BLE001 - said, tried again at the next turn
                self.report("keep_run_dir", e)

    def _say_remade(self) -> None:
        if not self.ctx.journal.lost():  # as last saved (a preset edited in the dashboard)
            self._kept.update(_small_files(self.files.dir))
        if self._remake_run_dir():
            self.ctx.info(
                f"the run directory {self.files.dir} was deleted or moved away while the run went on: "
                "made again from what the agent holds (the journal whole, spec, "
                "agent.json); the trainer goes on",
                "run_dir.remade",
            )

    def _remake_run_dir(self) -> bool:
        files = self.files
        if not self.ctx.journal.lost():
            return False
        make_private_dir(files.dir)
        self.ctx.journal.remake()
        if not files.spec.exists():
            self.spec.save(files.spec)
        for rel, data in self._kept.items():  # presets, alerts.json: as they were
            path = files.dir / rel
            if not path.exists():
                make_private_dir(path.parent)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
        self._write_info()
        if (lock := agent_lock(files.dir, wait_s=0)) is not None:  # one agent per directory, still
            self._more_locks.append(lock)
        return True

    async def _prime_snapshots(self) -> None:
        """The view of the journal so far (an adopting agent's, an older run's), then the
        snapshot keeper follows every event; a failure costs clients the fast hello only."""
        keeper = self.snapshots
        try:
            upto = keeper.prime_at()
            covered = await asyncio.get_running_loop().run_in_executor(None, keeper.prime, upto)
            keeper.primed(covered)
        except Exception as e:  # noqa: BLE001 - the journal is still complete
            print(f"trainctl: no snapshots for this run: {e!r}", file=sys.stderr, flush=True)

    def _lock_fd(self) -> int | None:
        """The job lock's fd, for the holder to keep while its trainer lives (taken now
        if this agent adopted a run whose lock its trainer's holder had)."""
        if self.lock._fd is None:
            try:
                self.lock.acquire(self.files.dir)
            except JobBusy as e:
                raise OSError(str(e)) from None
        return self.lock._fd

    async def _take_over(self) -> int:
        """Go on with a run whose agent died: adopt its trainer, or go on from where its
        attempt loop was (it died in BACKOFF or STARTING: no trainer to adopt)."""
        ctx = self.ctx
        was = where_the_run_was(ctx.files.events)
        plug = self.plug
        lead = await plug.lead_goes_on() if was.ended else None
        if was.ended and lead is None:
            ctx.info(f"nothing to adopt: the run already ended {was.state}", "adopt")
            return exit_code(was.state)
        ctx.facts.restore(was.attempt, was.preset, was.last_checkpoint, was.furthest)
        projector_catches_up(ctx.projector, ctx.files.events)
        ctx.policy.auto_restarts = ctx.policy.used = ctx.policy.incident_restarts = was.auto_restarts
        if lead is not None:  # a node of a Slurm job: its run is the lead's, which goes on
            ctx.info(
                f"this node's part ended {was.state} in an earlier Slurm job, but the run goes "
                f"on (the lead is {lead}): from its last good checkpoint",
                "slurm.continue",
            )
            return await self.loop.run(resume=True)
        kept = plug.killed_before()
        restarts = plug.restarted()
        requeued = kept is None and restarts not in ("", "0")
        handle = (
            self.spawner.adopt(was.attempt, ctx.files.log)
            if was.exited is None and was.attempt and not requeued
            else None
        )
        if handle is not None:
            handle.save_on_request = was.save_on_request
            if handle.orphan:
                try:
                    await self.spawner.rehold(handle)
                    ctx.info(
                        f"the trainer of attempt {was.attempt} (pid {handle.pid}) ran on unsupervised, "
                        "its holder killed too: a new holder reads its output again",
                        "adopt.rehold",
                    )
                except OSError as e:
                    ctx.info(
                        f"the trainer of attempt {was.attempt} (pid {handle.pid}) ran on unsupervised, "
                        f"its holder killed too, and no new holder could start ({e}): it is watched "
                        "by its pid, its output no longer read",
                        "adopt.rehold",
                    )
            ctx.info(
                f"a new agent (pid {os.getpid()}) adopted the trainer of attempt {was.attempt} "
                f"(pid {handle.pid}){'' if handle.alive() else ', which ended meanwhile'}",
                "adopt",
            )
            return await self.loop.run(adopted=handle)
        if was.state == "PENDING" or (requeued and was.attempt):
            # an earlier Slurm job saved and queued this one; or Slurm started this job again
            # (its processes all gone: nothing to adopt) after its node died under it (no
            # save, no end in the journal): not a crash of the trainer
            if was.exited is None:
                ctx.emit(E.Exit(ctx.clock(), None, None))
            again = (
                ""
                if was.state == "PENDING"
                else (
                    f" (Slurm started it again, restart {restarts}: its node "
                    "failed under it, or it was requeued before a save)"
                )
            )
            ctx.info(
                f"Slurm job {plug.job_id if plug.name else '?'}{again} goes on with the "
                f"run after attempt {was.attempt}, from its last good checkpoint",
                "slurm.continue",
            )
            return await self.loop.run(resume=True)
        if was.attempt == 0:
            ctx.info(f"a new agent (pid {os.getpid()}) starts the run its agent never began", "adopt")
            return await self.loop.run()
        if was.exited is None:  # started but no trainer to be found: it is gone
            ctx.emit(E.Exit(ctx.clock(), None, None))
        ctx.info(f"a new agent (pid {os.getpid()}) goes on after attempt {was.attempt}", "adopt")
        if was.exited is not None and was.restart is not None:  # it died in its back-off
            return await self.loop.run(restart=was.restart)
        return await self.loop.run(outcome=was.outcome())

    def _on_signal(self) -> None:
        self.ctx.requests.stop()

    def _write_info(self) -> None:
        info = {
            "pid": os.getpid(),
            "version": __version__,
            "job": self.spec.job_name,
            "host": self.spec.host,
            "started": self.clock(),
            "tmux_session": os.environ.get("TRAINCTL_TMUX_SESSION", ""),
            **where_i_run(),
        }  # node, hostname, boot id: clients elsewhere go over ssh
        write_private(self.files.info, json.dumps(info))

    def _start_kernel_log(self):
        if not self.kernel_log:
            return None
        from trainctl.system.kernlog import KernelLogFollower

        loop = asyncio.get_running_loop()
        intake = self.loop.intake

        def on_line(line: str) -> None:
            loop.call_soon_threadsafe(intake.on_kernel_line, line)

        def on_info(text: str) -> None:
            loop.call_soon_threadsafe(self.ctx.info, text, "kernel_log")

        follower = KernelLogFollower(on_line, on_info)
        follower.start()
        return follower


KEPT = ("presets/*.toml", "alerts.json")  # what a re-made run directory gets back


def _small_files(run_dir: Path, most: int = 1 << 20) -> dict[str, bytes]:
    """The run's own small files (its presets, alerts.json) as they are at the
    agent's start: a run directory deleted by mistake gets them back."""
    out: dict[str, bytes] = {}
    for pattern in KEPT:
        for path in sorted(run_dir.glob(pattern)):
            try:
                if path.is_file() and not path.is_symlink() and path.stat().st_size <= most:
                    out[str(path.relative_to(run_dir))] = path.read_bytes()
            except OSError:
                continue
    return out


def _begun(journal: Path) -> bool:
    try:
        return journal.stat().st_size > 0
    except OSError:
        return False


def _alert_sink(ctx: RunContext, on_warning):
    """The run's alert sink when its alerts.json names URLs (None otherwise; apprise is never
    imported here: a helper process sends)."""
    from trainctl.alerts.policy import AlertPolicy
    from trainctl.alerts.settings import AlertConfigError, read_run_alerts
    from trainctl.alerts.sink import AlertSink

    try:
        conf = read_run_alerts(ctx.files.dir)
    except (OSError, ValueError, AlertConfigError) as e:
        print(f"trainctl: alerts off: {e}", file=sys.stderr, flush=True)
        return None
    if conf is None:
        return None
    spec = ctx.spec
    on = conf.get("on") or None
    policy = AlertPolicy(
        spec.job_name, spec.host, conf.get("attach") or f"trainctl attach {ctx.files.dir}", on
    )
    return AlertSink(conf["urls"], policy, on_warning=on_warning)


def _quiet_repeats(loop: asyncio.AbstractEventLoop, every_s: float = 60.0):
    """asyncio's own error reports (a failed accept() when file descriptors run out comes
    once per try) at most once a minute each, so agent.out cannot fill a disk."""
    last: dict[str, float] = {}

    def handler(_loop, context: dict) -> None:
        key = str(context.get("message"))
        now = time.monotonic()
        if now - last.get(key, -every_s) >= every_s:
            last[key] = now
            loop.default_exception_handler(context)

    return handler
