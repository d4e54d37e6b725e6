"""What every part of the agent reads: the run's spec and files, its pure pieces (state
machine, policy, detector, matcher, projector), the event bus, and the few facts that
outlive an attempt (attempt number, preset, last checkpoint, furthest batch)."""
from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import Callable
from pathlib import Path

from trainctl.core import events as E
from trainctl.config import ConfigError, load_preset
from trainctl.store.journal import Journal
from trainctl.store.paths import RunFiles, config_dir, write_private
from trainctl.core.projection import Projector
from trainctl.core.rates import RateHistory
from trainctl.core.signatures import Catalog, WarningMatcher
from trainctl.store.spec import RunSpec
from trainctl.core.stall import SILENCE_FLOOR_S, STARTUP_IDLE_S, StallDetector
from trainctl.core.recovery import RecoveryPolicy, RunState, StateMachine
from trainctl.agent.bus import EventBus


class EndRequest(str, enum.Enum):
    """Why an attempt must end before its trainer exits (also the attempt's outcome kind)."""

    STALL = "stall"
    USER_RESTART = "user_restart"
    USER_STOP = "user_stop"
    SUSPEND = "suspend"


class Interrupt:
    """Why the current attempt must end early (the first request wins)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.kind: EndRequest | None = None
        self.preset: str | None = None

    def set(self, kind: EndRequest, preset: str | None = None) -> bool:
        if self.kind is not None:
            return False
        self.kind, self.preset = kind, preset
        self.event.set()
        return True


class RunContext:
    def __init__(self, run_dir: Path, spec: RunSpec, clock: Callable[[], float], gpu_probe=None) -> None:
        self.files = RunFiles(run_dir)
        self.spec = spec
        self.clock = clock
        self.gpu_probe = gpu_probe
        self.journal = Journal(self.files.events)
        self.bus = EventBus(self.journal, clock)
        self.sm = StateMachine()
        self.policy = RecoveryPolicy(spec.preset, spec.fallback, max_restarts=spec.max_restarts,
                                     backoff_base=spec.backoff_base_s,
                                     no_progress_limit=spec.no_progress_limit,
                                     auto_recover=spec.auto_recover)
        self.detector = StallDetector(train_timeout=spec.stall.get("train_timeout"),
                                      startup_timeout=spec.stall.get("startup_timeout"),
                                      val_timeout=spec.stall.get("val_timeout"),
                                      save_timeout=spec.stall.get("save_timeout"),
                                      silence_floor=spec.stall.get("silence_floor", SILENCE_FLOOR_S),
                                      startup_idle=spec.stall.get("startup_idle", STARTUP_IDLE_S))
        self.matcher = WarningMatcher(Catalog.load())
        self.projector = Projector(deadline=spec.deadline, cost_per_hour=spec.cost_per_hour,
                                   budget=spec.budget, preset=spec.preset,
                                   expected_rates=self.expected_rates(),
                                   history=RateHistory(config_dir() / "rates.json"),
                                   job=spec.job_name)
        self.load_detector_state()
        self.preset: str | None = spec.preset
        self.next_preset: str | None = None
        self.attempt = 0
        self.trainer = None               # the live trainer's handle (spawner.Trainer)
        self.last_checkpoint: str | None = None
        self.furthest: tuple[int, int] = (0, 0)   # the furthest (epoch, batch) of the run
        self.instrumented = False   # this attempt's trainer got the zero-code bootstrap
        self.stop_requested = asyncio.Event()
        self.suspend_requested = asyncio.Event()   # a Slurm job's time-limit warning
        self.stop_reason: str | None = None        # why the run stops, when not the user's `s`
        self.ending: asyncio.Future | None = None  # finding out why Slurm ends the job
        self.interrupt = Interrupt()
        self.lost: str | None = None      # why supervision could not go on (the run then FAILS)
        self._last_projection = 0.0

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
        return None if name is None else load_preset(self.preset_path(name))

    # ------------------------------------------------------------------ detector memory
    def load_detector_state(self) -> None:
        path = self.files.dir / "detector.json"
        try:
            self.detector.load_state_dict(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            pass

    def save_detector_state(self) -> None:
        path = self.files.dir / "detector.json"
        try:
            write_private(path, json.dumps(self.detector.state_dict()))
        except (OSError, TypeError, ValueError):
            pass
