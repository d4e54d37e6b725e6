"""The headless supervisor: owns the training process, writes the journal, serves clients.

One asyncio loop.  Per attempt: spawn the trainer in its own session, read its output and
the runner's side channel, feed parser → detector/matcher/projector, and wait until the
trainer exits or something (a stall, a user command) asks for the attempt to end.  Then the
pure RecoveryPolicy decides what comes next.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import psutil

from .. import __version__
from . import events as E
from .config import ConfigError, load_preset, preset_problems
from .joblock import JobBusy, JobLock
from .journal import Journal, ProgressThrottle, journal_lines
from .parse import ConsoleParser, LineSplitter
from .paths import RunFiles, config_dir, make_private_dir
from .process import become_subreaper, kill_tree, signal_name
from .projection import Projector, RateHistory
from .signatures import Catalog, WarningMatcher
from .spec import RunSpec
from .stall import StallDetector
from .supervisor import FINAL_STATES, Outcome, RecoveryPolicy, RunState, StateMachine

TICK_S = 1.0
WATCH_S = 0.5
READ_PAUSE_S = 0.1     # after a small read of the trainer's output, read again this much later
READ_BURST = 32768     # a read this large (a flood) is followed at once
PROJECTION_S = 30.0
LOG_FLUSH_S = 0.25
CLIENT_QUEUE = 20000
PROJECTED = frozenset({"start", "phase", "restart", "stall", "exit", "checkpoint"})


class _Interrupt:
    """Why the current attempt must end early (first request wins)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.kind: str | None = None
        self.preset: str | None = None

    def set(self, kind: str, preset: str | None = None) -> bool:
        if self.kind is not None:
            return False
        self.kind, self.preset = kind, preset
        self.event.set()
        return True


class Agent:
    def __init__(self, run_dir: Path, spec: RunSpec, *, printer: Callable[[E.Event], None] | None = None,
                 clock: Callable[[], float] = time.time, gpu_probe=None, serve: bool = True,
                 on_locked: Callable[[], None] | None = None):
        """``on_locked``: called once the job is this agent's (its lock taken), before
        the trainer starts: `trainctl run --headless` points `latest` at the run then."""
        self.files = RunFiles(run_dir)
        self.on_locked = on_locked
        self.spec = spec
        self.printer = printer
        self.clock = clock
        self.serve = serve
        self.gpu_probe = gpu_probe
        self.journal = Journal(self.files.events)
        self.sm = StateMachine()
        self.policy = RecoveryPolicy(spec.preset, spec.fallback, max_restarts=spec.max_restarts,
                                     backoff_base=spec.backoff_base_s,
                                     no_progress_limit=spec.no_progress_limit,
                                     auto_recover=spec.auto_recover)
        self.detector = StallDetector(train_timeout=spec.stall.get("train_timeout"),
                                      startup_timeout=spec.stall.get("startup_timeout"),
                                      val_timeout=spec.stall.get("val_timeout"),
                                      save_timeout=spec.stall.get("save_timeout"))
        self.matcher = WarningMatcher(Catalog.load())
        self.projector = Projector(deadline=spec.deadline, cost_per_hour=spec.cost_per_hour,
                                   budget=spec.budget, preset=spec.preset,
                                   expected_rates=self._expected_rates(),
                                   history=RateHistory(config_dir() / "rates.json"),
                                   job=spec.job_name)
        self._load_detector_state()
        self.preset = spec.preset
        self.next_preset: str | None = None
        self.attempt = 0
        self.clients: set[asyncio.Queue] = set()
        self.proc: asyncio.subprocess.Process | None = None
        self.phase = "startup"
        self._reported_phase = False
        self.last_checkpoint: str | None = None
        self._furthest: tuple[int, int] = (0, 0)   # the furthest (epoch, batch) of the run
        self.stop_requested = asyncio.Event()
        self._interrupt = _Interrupt()
        self._log_lines: deque[str] = deque(maxlen=200)
        self._last_log_flush = 0.0
        self._seen_procs: dict[int, psutil.Process] = {}
        self._last_workers: set[int] = set()
        self._sampler = None
        self._last_tick = 0.0
        self._last_projection = 0.0
        self._last_risk_check = 0.0
        self._projection_basis = (False, False)
        self._last_gpu: dict | None = None
        self._server: asyncio.base_events.Server | None = None

    # ------------------------------------------------------------------ events
    def emit(self, ev: E.Event) -> E.Event:
        if ev.type not in E.EPHEMERAL:
            ev = self.journal.append(ev)
            if ev.type in PROJECTED:
                self.projector.on_event(ev)
            if self.printer:
                self._print(ev)
        if self.clients:
            line = E.encode(ev) + "\n"
            for q in list(self.clients):
                try:
                    q.put_nowait(line)
                except asyncio.QueueFull:
                    self.clients.discard(q)
                    q.put_nowait(None) if not q.full() else None
        return ev

    def _print(self, ev: E.Event) -> None:
        """Print an event; a terminal that went away (tmux session killed, ssh gone: EIO or
        EPIPE) stops the printing, never the supervision."""
        try:
            self.printer(ev)
        except (OSError, ValueError):
            self.printer = None
            try:
                fd = os.open(os.devnull, os.O_WRONLY)   # later stray prints must not fail either
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.close(fd)
            except OSError:
                pass

    def set_state(self, state: RunState, reason: str = "") -> None:
        if self.sm.to(state):
            self.emit(E.State(self.clock(), state.value, reason))

    def info(self, text: str, key: str = "") -> None:
        self.emit(E.Info(self.clock(), text, key))

    def _load_detector_state(self) -> None:
        path = self.files.dir / "detector.json"
        try:
            self.detector.load_state_dict(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            pass

    def _save_detector_state(self) -> None:
        path = self.files.dir / "detector.json"
        try:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.detector.state_dict()))
            tmp.replace(path)
        except (OSError, TypeError, ValueError):
            pass

    # ------------------------------------------------------------------ presets
    def _preset_path(self, name: str) -> Path:
        return self.files.presets / f"{name}.toml"

    def _expected_rates(self) -> dict[str, float | None]:
        rates: dict[str, float | None] = {}
        for path in sorted(self.files.presets.glob("*.toml")):
            try:
                rates[path.stem] = load_preset(path).expected_rate
            except ConfigError:
                continue
        return rates

    def _load_preset(self, name: str | None):
        return None if name is None else load_preset(self._preset_path(name))

    # ------------------------------------------------------------------ trainer command
    def _command(self, preset_name: str | None, resume_from: str | None) -> tuple[list[str], dict[str, str]]:
        preset = self._load_preset(preset_name)
        env = dict(os.environ)
        env.pop("GITHUB_ACTIONS", None)   # Ultralytics prints no progress frames under it
        if preset is not None:
            env.update(preset.child_env())
        env.update(TRAINCTL_RUN_DIR=str(self.files.dir), TRAINCTL_ATTEMPT=str(self.attempt),
                   TRAINCTL_PRESET=preset_name or "", PYTHONUNBUFFERED="1")
        if self.spec.kind == "ultralytics":
            argv = [sys.executable, "-m", "trainctl.engine.runners.ultralytics",
                    "--job", str(self.spec.job_file), "--run-dir", str(self.files.dir)]
            if preset_name is not None:
                argv += ["--preset", str(self._preset_path(preset_name))]
            if resume_from:
                argv += ["--resume", resume_from]
        else:
            argv = list(self.spec.command) + list(preset.args if preset else ())
            needs = any("{checkpoint}" in a for a in self.spec.resume_args)
            resuming = self.attempt > 1 or resume_from is not None
            if resuming and self.spec.resume_args and (resume_from or not needs):
                argv += [a.replace("{checkpoint}", resume_from or "") for a in self.spec.resume_args]
        return argv, env

    def _resume_checkpoint(self) -> str | None:
        if self.spec.kind != "ultralytics":
            for arg in self.spec.resume_args:
                if os.path.isfile(arg):
                    return arg
            return self.last_checkpoint
        from .runners.checkpoint import pick_resume_checkpoint
        candidates = [self.files.checkpoints / "last_good.pt"]
        if self.last_checkpoint:
            candidates.append(Path(self.last_checkpoint))
        chosen = pick_resume_checkpoint(
            candidates, on_skip=lambda path, why: self.info(f"not resuming from {path}: {why}", "resume_skip"))
        return str(chosen) if chosen else None

    # ------------------------------------------------------------------ main loop
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self._loop = loop
        become_subreaper()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal)
        loop.add_signal_handler(signal.SIGHUP, lambda: None)  # the run outlives the terminal
        make_private_dir(self.files.dir)
        lock = JobLock(self.spec.job_name)
        try:
            lock.acquire(self.files.dir)
        except JobBusy as e:
            print(f"trainctl: {e}", file=sys.stderr, flush=True)
            return 2
        if self.on_locked is not None:
            self.on_locked()
        self._write_info()
        if self.serve:
            await self._start_server()
        kernel = self._start_kernel_log()
        if self.gpu_probe is None:
            from .probes import detect_gpu_probe
            self.gpu_probe = await loop.run_in_executor(None, detect_gpu_probe)
        try:
            return await self._attempts()
        finally:
            if kernel is not None:
                kernel.stop()
            if self._server is not None:
                self._server.close()
                await asyncio.sleep(0.2)   # let clients read the last events
                for q in list(self.clients):
                    q.put_nowait(None) if not q.full() else None
            try:
                self.files.sock.unlink()
            except FileNotFoundError:
                pass
            self.journal.close()
            lock.release()

    def _on_signal(self) -> None:
        self.stop_requested.set()
        self._interrupt.set("user_stop")

    async def _attempts(self) -> int:
        preset = self.preset
        resume_from: str | None = self.spec.resume_from   # --resume-from, for the first attempt
        if resume_from:
            self.last_checkpoint = resume_from
            self.info(f"starting from checkpoint {resume_from} (--resume-from)", "resume_from")
        while True:
            self.attempt += 1
            self.preset = preset
            self.projector.preset = preset
            outcome = await self._run_attempt(preset, resume_from)
            decision = self.policy.decide(outcome)
            if decision.action == "finish":
                self.set_state(RunState.FINISHED, decision.reason)
                return 0
            if decision.action == "stop":
                self.set_state(RunState.STOPPED, decision.reason)
                return 130
            if decision.action == "fail":
                self.set_state(RunState.FAILED, decision.reason)
                advice = ("Fix the command or preset named above, then `trainctl run` again."
                          if outcome.returncode is None else
                          "Read the stall diagnosis, warnings and stacks above; fix, then "
                          "`trainctl run` again.")
                good = self._resume_checkpoint() if outcome.returncode is not None else None
                if good:
                    advice += (f" To go on from its last good checkpoint ({good}): "
                               f"`trainctl run ... --resume-from {self.files.dir}`.")
                self.emit(E.Warning(self.clock(), "trainctl.failed", "fatal", decision.reason,
                                    advice, source="trainctl"))
                return 1
            preset = self.next_preset or decision.preset
            self.next_preset = None
            resume_from = self._resume_checkpoint()
            self.set_state(RunState.BACKOFF, decision.reason)
            self.emit(E.Restart(self.clock(), self.attempt + 1, decision.reason, preset,
                                resume_from, decision.delay_s))
            try:
                await asyncio.wait_for(self.stop_requested.wait(), decision.delay_s)
                self.set_state(RunState.STOPPED, "stopped by the user during backoff")
                return 130
            except asyncio.TimeoutError:
                pass

    async def _run_attempt(self, preset: str | None, resume_from: str | None) -> Outcome:
        loop = asyncio.get_running_loop()
        self._interrupt = _Interrupt()
        if self.stop_requested.is_set():
            self._interrupt.set("user_stop")
        if self.sm.state != RunState.STARTING:
            self.set_state(RunState.STARTING, f"attempt {self.attempt}")
        try:
            argv, env = self._command(preset, resume_from)
        except ConfigError as e:
            self.emit(E.Warning(self.clock(), "trainctl.preset_invalid", "fatal", str(e),
                                "Fix the preset (trainctl presets validate) and restart.", source="trainctl"))
            return Outcome("crash", False, None, preset, stop_reason=str(e))
        r_fd, w_fd = os.pipe()
        # The trainer's output goes to a pipe of our own (not asyncio's): reading it can be
        # paused to take a burst of lines in one read, and proc.wait() does not wait for
        # it to close (workers orphaned by a dead trainer may hold it open).
        out_r, out_w = os.pipe()
        _grow_pipe(out_w)
        env["TRAINCTL_EVENTS_FD"] = str(w_fd)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out_w,
                stderr=asyncio.subprocess.STDOUT, env=env, cwd=self.spec.cwd,
                start_new_session=True, pass_fds=(w_fd,))
        except OSError as e:
            for fd in (r_fd, w_fd, out_r, out_w):
                os.close(fd)
            self.emit(E.Warning(self.clock(), "trainctl.spawn_failed", "fatal",
                                f"cannot start {argv[0]}: {e}", "Check the command and its path.",
                                source="trainctl"))
            return Outcome("crash", False, None, preset, stop_reason=str(e))
        os.close(w_fd)
        os.close(out_w)
        self.proc = proc
        now = self.clock()
        self._seen_procs = {}
        self._last_workers: set[int] = set()
        self._structured = False
        self._structured_phases = False
        self._progressed = False
        self._fatal_stop: str | None = None
        self._stalled = False
        self.emit(E.Start(now, self.attempt, proc.pid, preset, tuple(argv)))
        self.detector.reset(now)
        self.splitter = LineSplitter()
        self.parser = ConsoleParser()
        self.throttle = ProgressThrottle(1.0)
        self._set_phase("startup", now, force=True)
        from .probes import TreeSampler
        self._sampler = TreeSampler()

        readers = [asyncio.create_task(self._read_output(out_r)),
                   asyncio.create_task(self._read_side_channel(r_fd))]
        watcher = asyncio.create_task(self._watch())
        waiter = asyncio.create_task(proc.wait())
        interrupt = asyncio.create_task(self._interrupt.event.wait())
        await asyncio.wait({waiter, interrupt}, return_when=asyncio.FIRST_COMPLETED)
        kind = None
        if not waiter.done():
            kind = self._interrupt.kind
            await self._kill(proc, f"{kind}")
        returncode = await waiter
        interrupt.cancel()
        # The trainer is gone: sweep what is left of its tree (orphaned workers included).
        await loop.run_in_executor(None, self._sweep, proc.pid)
        try:
            await asyncio.wait_for(asyncio.gather(*readers), 5.0)
        except asyncio.TimeoutError:
            for t in readers:
                t.cancel()
        watcher.cancel()
        self._flush_logs()
        pending = self.throttle.flush(self.clock(), force=True)
        if pending is not None:
            self.emit(pending)
        self.emit(E.Exit(self.clock(), returncode, signal_name(returncode)))
        if returncode == 0:
            self._project(self.clock())     # the end: status and the dashboard say 'finished'
        self._save_detector_state()
        self.proc = None
        if kind is None:
            kind = "finished" if returncode == 0 else "crash"
        if kind == "stall" and returncode == 0:
            kind = "finished"
        return Outcome(kind, self._progressed, returncode, preset,
                       requested_preset=self._interrupt.preset, stop_reason=self._fatal_stop)

    # ------------------------------------------------------------------ killing
    def _sweep(self, pid: int) -> None:
        extra = tuple(p.pid for p in self._seen_procs.values() if p.is_running())
        report = kill_tree(pid, pid, grace=2.0, extra_roots=extra)
        if report.survivors:
            self.loop_call(self.info, f"processes still alive after kill: {report.survivors}")

    def loop_call(self, fn, *args) -> None:
        self._loop.call_soon_threadsafe(fn, *args)

    async def _kill(self, proc: asyncio.subprocess.Process, why: str) -> None:
        """Kill the trainer's whole tree — but never while it writes a checkpoint."""
        loop = asyncio.get_running_loop()
        if self.phase == "save":
            self.info(f"waiting for the checkpoint save to finish before stopping ({why})", "save_wait")
            deadline = self.clock() + self.spec.save_wait_s
            while self.phase == "save" and proc.returncode is None and self.clock() < deadline:
                await asyncio.sleep(0.1)
        if self.sm.state not in (RunState.STOPPING,):
            self.set_state(RunState.STOPPING, why)
        extra = tuple(p.pid for p in self._seen_procs.values() if p.is_running())
        report = await loop.run_in_executor(
            None, lambda: kill_tree(proc.pid, proc.pid, grace=self.spec.kill_grace_s, extra_roots=extra))
        detail = f"killed {len(report.pids)} processes in {report.seconds:.1f}s"
        if report.forced:
            detail += f" ({len(report.forced)} needed SIGKILL)"
        if report.survivors:
            detail += f"; STILL ALIVE: {list(report.survivors)}"
        self.info(detail, "kill")
        await self._wait_gpu_released(report.pids)

    async def _wait_gpu_released(self, pids: tuple[int, ...], limit_s: float = 30.0) -> None:
        probe = self.gpu_probe
        if probe is None or not getattr(probe, "available", lambda: (False, ""))()[0]:
            return
        loop = asyncio.get_running_loop()
        t0 = self.clock()
        while self.clock() - t0 < limit_s:
            sample = await loop.run_in_executor(None, probe.sample)
            held = [p for p, _mem in sample.processes if p in pids] if sample else []
            if not held:
                self.info(f"GPU memory released after {self.clock() - t0:.1f}s", "gpu_release")
                return
            await asyncio.sleep(0.5)
        self.info(f"GPU memory still held by {held} after {limit_s:.0f}s; restarting anyway", "gpu_release")

    # ------------------------------------------------------------------ reading the trainer
    async def _read_output(self, fd: int) -> None:
        """Read the trainer's output until every writer has closed it.  After a small read
        the pipe is left alone for READ_PAUSE_S, so a trainer that flushes every line costs
        one wake-up per pause, not one per line (the cost of a wake-up, not of a line,
        dominates at ordinary rates); a large read is followed at once."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 22)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0))
        try:
            with open(self.files.log, "ab") as log:
                while data := await reader.read(1 << 20):
                    log.write(data)
                    log.flush()
                    self._on_lines(self.splitter.feed(data))
                    self._flush_logs_if_due()   # here, not only on the watch loop's wake-ups
                    if len(data) < READ_BURST:
                        transport.pause_reading()
                        try:
                            await asyncio.sleep(READ_PAUSE_S)
                        finally:
                            transport.resume_reading()
                self._on_lines(self.splitter.flush())
        finally:
            transport.close()

    def _on_lines(self, lines: list[str]) -> None:
        now = self.clock()
        for line in lines:
            self._log_lines.append(line)
            warning = self.matcher.feed(line, now, "trainer")
            if warning is not None:
                self._on_warning(warning)
            if self.matcher.last is not None and self.matcher.last.startup_evidence:
                self.detector.on_evidence(now, "log")
            for ev in self.parser.feed(line, now):
                if isinstance(ev, E.Progress) and not self._structured:
                    self._on_progress(ev, console=True)
                elif isinstance(ev, E.Phase) and not (self._structured or self._structured_phases):
                    self._set_phase(ev.phase, now)

    def _on_warning(self, warning: E.Warning) -> None:
        self.emit(warning)
        sig = self.matcher.catalog.get(warning.id)
        if sig is not None and sig.action == "stop" and warning.severity == "fatal":
            self._fatal_stop = f"{warning.id}: {warning.text[:200]}"

    async def _read_side_channel(self, fd: int) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0))
        try:
            while line := await reader.readline():
                try:
                    ev = E.decode(line)
                except (ValueError, TypeError, KeyError):
                    continue
                now = self.clock()
                ev = _restamp(ev, now)
                if isinstance(ev, E.Progress):
                    self._structured = True
                    self._on_progress(ev)
                elif isinstance(ev, E.Phase):
                    # A script may report only its phases (engine/report.py): its console
                    # progress still counts.
                    self._structured_phases = True
                    self._set_phase(ev.phase, now, reported=True)
                elif isinstance(ev, E.Checkpoint):
                    if ev.ok:
                        self.last_checkpoint = ev.path
                    self.emit(ev)
                elif isinstance(ev, (E.Info, E.Warning)):
                    if isinstance(ev, E.Info) and ev.key == "runner.config_error":
                        self._fatal_stop = f"bad configuration: {ev.text}"   # a restart cannot fix it
                    self.emit(ev)
        finally:
            transport.close()

    def _set_phase(self, phase: str, now: float, force: bool = False, reported: bool = False) -> None:
        """Enter ``phase``; a repeat (the runner's own "startup" after ours) is dropped.
        ``reported``: the trainer said so on its side channel (not guessed from output)."""
        if phase == self.phase and not force:
            self._reported_phase = self._reported_phase or reported
            return
        self._reported_phase = reported
        self.phase = phase
        self.detector.on_phase(phase, now)
        self.emit(E.Phase(now, phase))
        self._project(now)

    def _on_progress(self, ev: E.Progress, console: bool = False) -> None:
        now = ev.ts
        # A batch line read from the console may be older than a val/save phase the trainer
        # reported on its side channel (two pipes, read at different moments): it must not
        # end that phase, or a restart could kill the trainer in the middle of a save.
        late = console and self._reported_phase and self.phase in ("val", "save")
        if self.phase != "train" and not late:
            self._set_phase("train", now)
        mark = (ev.epoch or 0, ev.batch or 0)
        if mark > self._furthest:   # only a batch beyond any earlier attempt's is new progress
            self._furthest = mark
            self._progressed = True
        self.detector.on_progress(ev, now)
        self.projector.on_event(ev)   # every batch, not only the throttled ones in the journal
        warning = self.matcher.feed_progress(ev, now)
        if warning is not None:
            self._on_warning(warning)
        if self.sm.state in (RunState.STARTING, RunState.STALLED):
            self._stalled = False
            self.set_state(RunState.RUNNING, "progress")
        admitted = self.throttle.offer(ev)
        if admitted is not None:
            self.emit(admitted)

    # ------------------------------------------------------------------ watching
    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            now = self.clock()
            pending = self.throttle.flush(now)
            if pending is not None:
                self.emit(pending)
            self._flush_logs_if_due()   # lines that came with the trainer's last write
            verdict = self.detector.check(now)
            if verdict is not None and not self._stalled:
                self._stalled = True
                asyncio.create_task(self._on_stall(verdict))
            if now - self._last_tick >= TICK_S:
                self._last_tick = now
                await self._tick(now)
            if now - self._last_projection >= PROJECTION_S:
                self._project(now)
            elif now - self._last_risk_check >= TICK_S:
                # The risk is checked every second (cheap), so a deadline or budget that
                # becomes unreachable is said within a second, not at the next projection;
                # so is the first projection that knows the work left or the run's own rate.
                self._last_risk_check = now
                risk = self.projector.at_risk(now)
                basis = self.projector.basis()
                if risk is not None or basis != self._projection_basis:
                    self._projection_basis = basis
                    self._project(now, risk)

    async def _tick(self, now: float) -> None:
        loop = asyncio.get_running_loop()
        proc = self.proc
        processes: tuple = ()
        if proc is not None and proc.returncode is None and self._sampler is not None:
            samples = await loop.run_in_executor(None, self._sampler.sample, proc.pid)
            processes = tuple(s.as_dict() for s in samples)
            self._last_workers = {s.pid for s in samples if s.role == "worker"}
            for s in samples:
                if s.pid not in self._seen_procs:
                    try:
                        self._seen_procs[s.pid] = psutil.Process(s.pid)
                    except psutil.Error:
                        pass
            if self.phase == "startup" and any((s.cpu_percent or 0) > 50 for s in samples):
                self.detector.on_evidence(now, "cpu")
        if self.gpu_probe is not None and int(now) % 2 == 0:
            sample = await loop.run_in_executor(None, self.gpu_probe.sample)
            self._last_gpu = sample.as_dict() if sample is not None and hasattr(sample, "as_dict") else None
        self.emit(E.Tick(now, self.phase, round(self.detector.idle(now), 1),
                         _round(self.detector.threshold(now)), self.policy.auto_recover,
                         processes, self._last_gpu))

    def _project(self, now: float, risk: E.Warning | None = None) -> None:
        """A projection event, then the at-risk warning it implies (``risk``: already found)."""
        self._last_projection = now
        proj = self.projector.project(now)
        if proj is not None:
            self.emit(proj)
        risk = risk or self.projector.at_risk(now)
        if risk is not None:
            self.emit(risk)

    def _flush_logs_if_due(self) -> None:
        if self.clock() - self._last_log_flush >= LOG_FLUSH_S:
            self._flush_logs()

    def _flush_logs(self) -> None:
        self._last_log_flush = self.clock()
        if self._log_lines:
            lines = tuple(self._log_lines)
            self._log_lines.clear()
            self.emit(E.Log(self.clock(), lines))

    async def _on_stall(self, verdict) -> None:
        loop = asyncio.get_running_loop()
        proc = self.proc
        if proc is None:
            return
        self.set_state(RunState.STALLED, f"no batch for {verdict.idle_s:.0f}s in {verdict.phase}")
        diag = await loop.run_in_executor(None, self._diagnose, proc.pid, f"{self.attempt}")
        self.emit(E.Stall(self.clock(), verdict.phase, round(verdict.idle_s, 1), diag.diagnosis,
                          diag.cpu_percent, diag.stacks, verdict.threshold_s,
                          f"{diag.detail} ({verdict.reason})"))
        if self.policy.auto_recover and proc.returncode is None and self._stalled:
            self._interrupt.set("stall")

    def _diagnose(self, pid: int, tag: str):
        from .diagnose import diagnose
        make_private_dir(self.files.stacks)
        gpu = self.gpu_probe.sample() if self.gpu_probe is not None else None
        return diagnose(pid, self.files.stacks, sampler=self._sampler, gpu=gpu,
                        tag=f"{tag}-{int(self.clock())}",
                        known_workers=set(self._last_workers))

    # ------------------------------------------------------------------ kernel log
    def _start_kernel_log(self):
        if not self.spec.kernel_log:
            return None
        from .kernlog import KernelLogFollower
        loop = asyncio.get_running_loop()

        def on_line(line: str) -> None:
            loop.call_soon_threadsafe(self._on_kernel_line, line)

        def on_info(text: str) -> None:
            loop.call_soon_threadsafe(self.info, text, "kernel_log")

        follower = KernelLogFollower(on_line, on_info)
        follower.start()
        return follower

    def _on_kernel_line(self, line: str) -> None:
        warning = self.matcher.feed(line, self.clock(), "kernel")
        if warning is not None:
            self._on_warning(warning)

    # ------------------------------------------------------------------ clients
    def _write_info(self) -> None:
        info = {"pid": os.getpid(), "version": __version__, "job": self.spec.job_name,
                "host": self.spec.host, "started": self.clock(),
                "tmux_session": os.environ.get("TRAINCTL_TMUX_SESSION", "")}
        tmp = self.files.info.with_suffix(".tmp")
        tmp.write_text(json.dumps(info))
        tmp.replace(self.files.info)

    async def _start_server(self) -> None:
        sock = self.files.sock
        if sock.exists():
            sock.unlink()
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(self._serve_client, path=str(sock),
                                                           limit=1 << 22)
        finally:
            os.umask(old)
        os.chmod(sock, 0o600)

    def hello(self) -> dict:
        return {"op": "hello", "ok": True, "version": __version__, "job": self.spec.job_name,
                "run_dir": str(self.files.dir), "host": self.spec.host, "state": self.sm.state.value,
                "auto_recover": self.policy.auto_recover, "preset": self.preset,
                "fallback": self.spec.fallback, "attempt": self.attempt,
                "deadline": self.spec.deadline, "budget": self.spec.budget,
                "currency": self.spec.currency, "live": True}

    async def _serve_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue = asyncio.Queue(maxsize=CLIENT_QUEUE)
        sender = None
        try:
            first = await reader.readline()
            try:
                since = int(json.loads(first).get("since", 0)) if first.strip() else 0
            except (ValueError, AttributeError):
                since = 0
            upto = self.journal.next_seq
            self.clients.add(queue)
            writer.write((json.dumps(self.hello()) + "\n").encode())
            sender = asyncio.create_task(self._send(writer, queue, max(0, since), upto))
            while line := await reader.readline():
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if msg.get("op") == "cmd":
                    reply = await self.command(str(msg.get("cmd")), dict(msg.get("args") or {}))
                    reply.update(op="reply", id=msg.get("id"))
                    try:
                        queue.put_nowait(json.dumps(reply) + "\n")
                    except asyncio.QueueFull:
                        break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.clients.discard(queue)
            if sender is not None:
                sender.cancel()
            writer.close()

    async def _send(self, writer: asyncio.StreamWriter, queue: asyncio.Queue, since: int, upto: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            if since < upto:
                lines = await loop.run_in_executor(None, journal_lines, self.files.events, since, upto)
                for i in range(0, len(lines), 2000):
                    writer.write("".join(lines[i:i + 2000]).encode())
                    await writer.drain()
            while True:
                line = await queue.get()
                if line is None:
                    break
                writer.write(line.encode())
                if queue.empty():
                    await writer.drain()
        except (ConnectionError, RuntimeError):
            pass
        finally:
            writer.close()

    # ------------------------------------------------------------------ commands
    async def command(self, name: str, args: dict) -> dict:
        try:
            result = await self._command_impl(name, args)
            return {"ok": True, "error": None, "result": result}
        except (ValueError, ConfigError, OSError) as e:
            return {"ok": False, "error": str(e), "result": None}

    def _check_preset_name(self, name: str) -> str:
        if not name or not all(c.isalnum() or c in "._-" for c in name):
            raise ValueError(f"preset name {name!r}: use letters, digits, '.', '_' or '-'")
        return name

    async def _command_impl(self, name: str, args: dict):
        if name == "status":
            proj = self.projector.project(self.clock())
            return {**self.hello(), "phase": self.phase,
                    "projection": E.to_dict(proj) if proj else None}
        if name in ("restart", "fallback", "switch_preset"):
            if self.sm.state in FINAL_STATES:
                raise ValueError(f"the run is {self.sm.state.value}; start a new one with trainctl run")
            if name == "restart":
                target = self.preset
            elif name == "fallback":
                if not self.spec.fallback:
                    raise ValueError("this run has no fallback preset (set `fallback` in the job or --fallback)")
                target = self.spec.fallback
            else:
                target = self._check_preset_name(str(args.get("preset", "")))
            if target is not None:
                load_preset(self._preset_path(target))   # refuse a missing or invalid preset now
            if self.proc is None:
                self.next_preset = target
                return {"restart": "next attempt", "preset": target}
            if not self._interrupt.set("user_restart", target):
                raise ValueError(f"the attempt is already ending ({self._interrupt.kind})")
            return {"restart": "now", "preset": target}
        if name == "stop":
            self.stop_requested.set()
            self._interrupt.set("user_stop")
            return {"stopping": True}
        if name == "auto_recover":
            on = bool(args.get("on", not self.policy.auto_recover))
            self.policy.auto_recover = on
            self.info(f"auto-recovery {'on' if on else 'off'}", "auto_recover")
            if on and self.sm.state == RunState.STALLED and self.proc is not None:
                self._interrupt.set("stall")
            return {"auto_recover": on}
        if name == "dump_stacks":
            proc = self.proc
            if proc is None:
                raise ValueError("no trainer is running")
            loop = asyncio.get_running_loop()
            diag = await loop.run_in_executor(None, self._diagnose, proc.pid, f"manual-{self.attempt}")
            self.info(f"stacks dumped to {diag.stacks} ({diag.diagnosis}: {diag.detail})", "stacks")
            return {"stacks": diag.stacks, "diagnosis": diag.diagnosis, "detail": diag.detail}
        if name == "list_presets":
            out = []
            for path in sorted(self.files.presets.glob("*.toml")):
                try:
                    desc = load_preset(path).description
                except ConfigError as e:
                    desc = f"INVALID: {e}"
                out.append({"name": path.stem, "path": str(path), "description": desc})
            return out
        if name == "read_preset":
            path = self._preset_path(self._check_preset_name(str(args.get("name", ""))))
            if not path.exists():
                raise ValueError(f"no preset named {path.stem!r} in {self.files.presets}")
            return {"name": path.stem, "path": str(path), "text": path.read_text()}
        if name == "write_preset":
            pname = self._check_preset_name(str(args.get("name", "")))
            text = str(args.get("text", ""))
            path = self._preset_path(pname)
            problems = preset_problems(text, str(path))
            if problems:
                raise ValueError("; ".join(str(p) for p in problems))
            tmp = path.with_suffix(".toml.tmp")
            tmp.write_text(text)
            os.replace(tmp, path)
            self.projector.expected_rates = self._expected_rates()
            self.info(f"preset {pname} saved to {path}", "preset_saved")
            return {"name": pname, "path": str(path)}
        if name == "set_next_preset":
            pname = self._check_preset_name(str(args.get("name", "")))
            load_preset(self._preset_path(pname))
            self.next_preset = pname
            self.info(f"the next restart will use preset {pname}", "next_preset")
            return {"next_preset": pname}
        raise ValueError(f"unknown command {name!r}; known: status, restart, fallback, switch_preset, "
                         "stop, auto_recover, dump_stacks, list_presets, read_preset, write_preset, "
                         "set_next_preset")


def _grow_pipe(fd: int, size: int = 1 << 20) -> None:
    """Room for a burst of output while the reader pauses (64 KiB by default on Linux;
    1 MiB is what an unprivileged process may ask for).  Best effort."""
    try:
        import fcntl
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), size)
    except OSError:
        pass


def _restamp(ev: E.Event, now: float) -> E.Event:
    """Events from the trainer get the agent's clock (one time base for detector and journal)."""
    import dataclasses
    return dataclasses.replace(ev, ts=now)


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 1)
