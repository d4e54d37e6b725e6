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

from ... import __version__
from .. import events as E
from ..joblock import JobBusy, JobLock
from ..paths import make_private_dir
from ..process import become_subreaper
from ..spec import RunSpec
from .attempt import AttemptLoop
from .bus import PrinterSink
from .commands import CommandHandlers
from .context import EndRequest, RunContext
from .server import ClientServer
from .spawner import PipeSpawner, Spawner
from .tasks import ErrorReporter


class Agent:
    def __init__(self, run_dir: Path, spec: RunSpec, *, printer: Callable[[E.Event], None] | None = None,
                 clock: Callable[[], float] = time.time, gpu_probe=None, serve: bool = True,
                 on_locked: Callable[[], None] | None = None, spawner: Spawner | None = None,
                 kernel_log: bool | None = None):
        """``on_locked``: called once the job is this agent's (its lock taken), before the
        trainer starts: `trainctl run --headless` points `latest` at the run then.
        ``spawner``: how trainers are started (a fake one in tests)."""
        self.ctx = ctx = RunContext(run_dir, spec, clock, gpu_probe)
        self.files, self.spec, self.clock = ctx.files, spec, clock
        self.on_locked = on_locked
        self.serve = serve
        self.kernel_log = spec.kernel_log if kernel_log is None else kernel_log
        self.report = ErrorReporter(ctx.emit, ctx.files.dir / "errors", clock)
        self.loop = AttemptLoop(ctx, spawner or PipeSpawner(), self.report, self.give_up)
        self.commands = CommandHandlers(ctx, self.hello, self.loop.intake, self.loop.stopper)
        self.server = ClientServer(ctx.files.sock, ctx.journal, self.hello, self.commands)
        ctx.bus.on_journaled.append(self._project_on)
        ctx.bus.sinks.append(self.server)
        if printer is not None:
            ctx.bus.printers.append(PrinterSink(printer))

    # the names the CLI, tests and benches read
    @property
    def journal(self):
        return self.ctx.journal

    @property
    def intake(self):
        return self.loop.intake

    def emit(self, ev: E.Event) -> E.Event:
        return self.ctx.emit(ev)

    def _project_on(self, ev: E.Event) -> None:
        if ev.type in ("start", "phase", "restart", "stall", "exit", "checkpoint"):
            self.ctx.projector.on_event(ev)

    def hello(self) -> dict:
        ctx, spec = self.ctx, self.spec
        return {"op": "hello", "ok": True, "version": __version__, "job": spec.job_name,
                "run_dir": str(ctx.files.dir), "host": spec.host, "state": ctx.sm.state.value,
                "auto_recover": ctx.policy.auto_recover, "preset": ctx.preset,
                "fallback": spec.fallback, "attempt": ctx.attempt,
                "deadline": spec.deadline, "budget": spec.budget,
                "currency": spec.currency, "live": True}

    def give_up(self, where: str, exc: BaseException) -> None:
        """A supervised task failed too often: supervision cannot go on.  Say so (an error
        warning, FAILED with the reason) and end the attempt; never silently."""
        ctx = self.ctx
        ctx.lost = f"the agent's {where} task kept failing ({type(exc).__name__}: {exc})"
        ctx.emit(E.Warning(ctx.clock(), "trainctl.supervision_lost", "fatal", ctx.lost,
                           f"See {ctx.files.dir / 'errors'}; the trainer is stopped rather than left "
                           "unwatched.", source="trainctl"))
        ctx.stop_requested.set()
        ctx.interrupt.set(EndRequest.USER_STOP)

    # ------------------------------------------------------------------ life
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        ctx = self.ctx
        become_subreaper()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal)
        loop.add_signal_handler(signal.SIGHUP, lambda: None)  # the run outlives the terminal
        make_private_dir(ctx.files.dir)
        lock = JobLock(self.spec.job_name)
        try:
            lock.acquire(ctx.files.dir)
        except JobBusy as e:
            print(f"trainctl: {e}", file=sys.stderr, flush=True)
            return 2
        if self.on_locked is not None:
            self.on_locked()
        self._write_info()
        if self.serve:
            await self.server.start()
        kernel = self._start_kernel_log()
        if ctx.gpu_probe is None:
            from ..probes import detect_gpu_probe
            ctx.gpu_probe = await loop.run_in_executor(None, detect_gpu_probe)
        try:
            return await self.loop.run()
        finally:
            if kernel is not None:
                kernel.stop()
            if self.serve:
                await self.server.close()
            ctx.journal.close()
            lock.release()

    def _on_signal(self) -> None:
        self.ctx.stop_requested.set()
        self.ctx.interrupt.set(EndRequest.USER_STOP)

    def _write_info(self) -> None:
        info = {"pid": os.getpid(), "version": __version__, "job": self.spec.job_name,
                "host": self.spec.host, "started": self.clock(),
                "tmux_session": os.environ.get("TRAINCTL_TMUX_SESSION", "")}
        tmp = self.files.info.with_suffix(".tmp")
        tmp.write_text(json.dumps(info))
        tmp.replace(self.files.info)

    def _start_kernel_log(self):
        if not self.kernel_log:
            return None
        from ..kernlog import KernelLogFollower
        loop = asyncio.get_running_loop()
        intake = self.loop.intake

        def on_line(line: str) -> None:
            loop.call_soon_threadsafe(intake.on_kernel_line, line)

        def on_info(text: str) -> None:
            loop.call_soon_threadsafe(self.ctx.info, text, "kernel_log")

        follower = KernelLogFollower(on_line, on_info)
        follower.start()
        return follower
