"""What every part of the agent reads: the run's configuration (:class:`RunConfig`, fixed),
its pure pieces (state machine, policy, detector, matcher, projector), the event bus, the
requests that change its course (src/trainctl/agent/requests.py), and the few facts that
outlive an attempt (:class:`RunFacts`: attempt number, preset, last checkpoint, furthest
batch), each with one writer.  The context opens nothing of its own: the service gives it
the run's journal and signature catalog, so a test builds one without a whole agent."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainctl.agent.bus import EventBus
from trainctl.agent.checkpoint_auto import CheckpointAuto
from trainctl.agent.ladder import LadderKeeper
from trainctl.agent.preset_feed import PresetFeed
from trainctl.agent.requests import Requests
from trainctl.config import ConfigError, load_preset
from trainctl.config.ladder import rung_preset
from trainctl.core import events as E
from trainctl.core.projection import LEARNS_FROM, Projector
from trainctl.core.rates import RateHistory
from trainctl.core.recovery import Decision, Outcome, RecoveryPolicy, RunState, StateMachine
from trainctl.core.signatures import Catalog, WarningMatcher
from trainctl.core.stall import SILENCE_FLOOR_S, STARTUP_IDLE_S, StallDetector
from trainctl.store.journal import Journal
from trainctl.store.paths import RunFiles, config_dir, read_private, write_private
from trainctl.store.spec import RunSpec


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The run's configuration, fixed for the agent's life."""

    files: RunFiles  # the run directory's files
    spec: RunSpec  # what to run, and how to supervise it
    clock: Callable[[], float]  # the time (a virtual one in the replayed tests)


@dataclasses.dataclass
class RunFacts:
    """What the run has come to that outlives an attempt, beyond its state (the state
    machine's) and its journal.  Each fact has one writer, named; an adopting agent's
    service sets them once, from the journal, before its attempt loop runs (:meth:`restore`)."""

    preset: str | None  # the attempt loop: the current attempt's preset
    attempt: int = 0  # the attempt loop: the current attempt's number
    trainer: Any = None  # the attempt loop: the live trainer's handle (spawner.Trainer)
    instrumented: bool = False  # the attempt loop: this attempt's trainer got the zero-code bootstrap
    env_names: tuple[str, ...] = ()  # the attempt loop: the names in this attempt's trainer's env
    workers_seen: int | None = None  # the watch: DataLoader workers in the trainer's tree, last tick
    last_checkpoint: str | None = None  # the intake (a good checkpoint read); the loop: --resume-from
    furthest: tuple[int, int] = (0, 0)  # the intake: the furthest (epoch, batch) of the run
    gpu_probe: Any = None  # the service: found once, before the first attempt
    gpu_model: str | None = None  # the watch (agent/gpus.py): the model of the run's own devices
    gpus: dict[str, Any] | None = None  # the watch (agent/gpus.py): the run's devices, last reading

    def restore(
        self, attempt: int, preset: str | None, last_checkpoint: str | None, furthest: tuple[int, int]
    ) -> None:
        """Where a dead agent's run was (read from its journal), before this agent goes on."""
        self.attempt, self.preset = attempt, preset or self.preset
        self.last_checkpoint, self.furthest = last_checkpoint, furthest


class RunContext:
    def __init__(self, config: RunConfig, journal: Journal, catalog: Catalog | None, gpu_probe=None) -> None:
        """``journal``: the run's events.jsonl, opened by the service; ``catalog``: the
        signatures its warnings are matched against (None: the packaged ones, loaded at the
        first line)."""
        self.config = config
        spec, clock = config.spec, config.clock
        self.journal = journal
        self.bus = EventBus(self.journal, clock)
        self.sm = StateMachine()
        self.policy = RecoveryPolicy(
            spec.preset,
            spec.fallback,
            max_restarts=spec.max_restarts,
            backoff_base=spec.backoff_base_s,
            no_progress_limit=spec.no_progress_limit,
            auto_recover=spec.auto_recover,
        )
        self.detector = StallDetector(
            train_timeout=spec.stall.get("train_timeout"),
            startup_timeout=spec.stall.get("startup_timeout"),
            val_timeout=spec.stall.get("val_timeout"),
            save_timeout=spec.stall.get("save_timeout"),
            silence_floor=spec.stall.get("silence_floor", SILENCE_FLOOR_S),
            startup_idle=spec.stall.get("startup_idle", STARTUP_IDLE_S),
        )
        self.matcher = WarningMatcher(catalog)
        self.projector = Projector(
            deadline=spec.deadline,
            cost_per_hour=spec.cost_per_hour,
            budget=spec.budget,
            preset=spec.preset,
            expected_rates=self.expected_rates(),
            history=RateHistory(config_dir() / "rates.json"),
            job=spec.job_name,
        )
        self._read_rate_history()
        self.load_detector_state()
        self.facts = RunFacts(spec.preset, gpu_probe=gpu_probe)
        self.requests = Requests()  # stop, suspend, restart: asked through it only
        self._last_projection = 0.0  # project()'s own
        self.preset_feed = PresetFeed(self)  # the preset history, and the projector's risks
        self.bus.on_journaled.append(self.preset_feed)
        self.ladder = LadderKeeper(self) if spec.ladder else None  # the job's ladder (agent/ladder.py)
        if self.ladder is not None:
            self.bus.on_journaled.append(self.ladder)
        if spec.checkpoint_auto:  # after the feed: the risk it decides on is this event's
            self.bus.on_journaled.append(CheckpointAuto(self))
        self.bus.on_journaled.append(self._project_on)

    def _project_on(self, ev: E.Event) -> None:
        """The journaled events the projector learns from (its rates, losses and restarts)."""
        if ev.type in LEARNS_FROM:
            self.projector.on_event(ev)

    # ------------------------------------------------------------------ the configuration
    @property
    def files(self) -> RunFiles:
        return self.config.files

    @property
    def spec(self) -> RunSpec:
        return self.config.spec

    @property
    def clock(self) -> Callable[[], float]:
        return self.config.clock

    # ------------------------------------------------------------------ events
    def emit(self, ev: E.Event) -> E.Event:
        return self.bus.emit(ev)

    def set_state(self, state: RunState, reason: str = "") -> None:
        if self.sm.to(state):
            self.emit(E.State(self.clock(), state.value, reason))

    def info(self, text: str, key: str = "") -> None:
        self.emit(E.Info(self.clock(), text, key))

    def project(self, now: float, risk: E.Warning | None = None) -> None:
        """A projection event, then the at-risk warning it implies (``risk``: already found)."""
        self._last_projection = now
        proj = self.projector.project(now)
        if proj is not None:
            self.emit(proj)
        risk = risk or self.projector.at_risk(now)
        if risk is not None:
            self.emit(risk)

    @property
    def last_projection(self) -> float:
        return self._last_projection

    def decide(self, outcome: Outcome, now: float) -> Decision:
        """What follows an attempt: the recovery policy's decision, its restart on the
        ladder's rung when the job has a ladder."""
        decision = self.policy.decide(outcome, now)
        return decision if self.ladder is None else self.ladder.after(outcome, decision)

    # ------------------------------------------------------------------ presets
    def preset_path(self, name: str) -> Path:
        return self.files.presets / f"{name}.toml"

    def expected_rates(self) -> dict[str, float | None]:
        rates: dict[str, float | None] = {}
        for path in sorted(self.files.presets.glob("*.toml")):
            try:
                rates[path.stem] = load_preset(path).expected_rate
            except ConfigError:
                continue
        return rates

    def load_preset(self, name: str | None):
        if name is None:
            return None
        return rung_preset(name, lambda n: load_preset(self.preset_path(n)))  # A.w4: a workers rung

    # ------------------------------------------------------------------ detector memory
    def _read_rate_history(self) -> None:
        """Read the rate history once now, so that a damaged one is said (and set aside) at
        the start of the run, not in the middle of a projection."""
        history = self.projector.history
        if history is None:
            return
        history.rate(self.spec.job_name, self.spec.preset or "")
        for text in history.problems:
            self.info(text, "rate_history")
        history.problems.clear()

    def load_detector_state(self) -> None:
        path = self.files.dir / "detector.json"
        try:
            self.detector.load_state_dict(json.loads(read_private(path, 1 << 20)))
        except (OSError, ValueError, TypeError, KeyError, OverflowError):
            pass  # derived (the thresholds learnt so far): a missing or damaged one is relearnt

    def save_detector_state(self) -> None:
        path = self.files.dir / "detector.json"
        try:
            write_private(path, json.dumps(self.detector.state_dict()))
        except (OSError, TypeError, ValueError):
            pass
