"""The run's state machine and the recovery policy. Pure: no OS calls, no clock."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class RunState(str, enum.Enum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    STALLED = "STALLED"
    STOPPING = "STOPPING"
    BACKOFF = "BACKOFF"
    PENDING = "PENDING"  # waiting in a Slurm queue for its next job (the run goes on there)
    FINISHED = "FINISHED"  # the trainer exited 0
    FAILED = "FAILED"  # gave up: budget spent, a fatal error, auto-recovery off
    STOPPED = "STOPPED"  # stopped by the user (ctl stop, the dashboard's `s`, Ctrl-C)


#: The states a run ends in: nothing follows them.  Every reader (the agent, `attach`,
#: the CLI, the dashboard, the tests) asks this, never its own list.  The members are
#: ``str`` enums, so a state read from the journal (``"FINISHED"``) is found here too.
FINAL_STATES: frozenset[RunState] = frozenset({RunState.FINISHED, RunState.FAILED, RunState.STOPPED})

#: The process exit code for each final state: 130 for a stop, as for Ctrl-C.
EXIT_CODES: dict[RunState, int] = {RunState.FINISHED: 0, RunState.FAILED: 1, RunState.STOPPED: 130}


def exit_code(state: str | None, live: int = 0) -> int:
    """The exit code for a run in ``state``: its final state's, else ``live`` (a run that
    goes on, or a state nobody knows)."""
    try:
        return EXIT_CODES.get(RunState(state), live)
    except ValueError:
        return live


ALLOWED = {
    RunState.STARTING: {
        RunState.RUNNING,
        RunState.STALLED,
        RunState.STOPPING,
        RunState.BACKOFF,
        RunState.PENDING,
        *FINAL_STATES,
    },
    RunState.RUNNING: {
        RunState.STALLED,
        RunState.STOPPING,
        RunState.BACKOFF,
        RunState.PENDING,
        *FINAL_STATES,
    },
    RunState.STALLED: {
        RunState.RUNNING,
        RunState.STOPPING,
        RunState.BACKOFF,
        RunState.PENDING,
        *FINAL_STATES,
    },
    RunState.STOPPING: {RunState.BACKOFF, RunState.STARTING, RunState.PENDING, *FINAL_STATES},
    RunState.BACKOFF: {RunState.STARTING, RunState.STOPPING, RunState.PENDING, *FINAL_STATES},
    RunState.PENDING: {RunState.STARTING, RunState.STOPPING, *FINAL_STATES},
    **{final: set() for final in FINAL_STATES},
}


class StateMachine:
    def __init__(self) -> None:
        self.state = RunState.STARTING

    def can(self, new: RunState) -> bool:
        return new == self.state or new in ALLOWED[self.state]

    def to(self, new: RunState) -> bool:
        """Move to `new`; False (and no change) when that transition is not allowed."""
        if new == self.state:
            return False
        if new not in ALLOWED[self.state]:
            raise ValueError(f"run state cannot go from {self.state.value} to {new.value}")
        self.state = new
        return True


class OutcomeKind(str, enum.Enum):
    """How an attempt ended."""

    FINISHED = "finished"
    CRASH = "crash"
    STALL = "stall"
    USER_RESTART = "user_restart"
    USER_STOP = "user_stop"
    SUSPEND = "suspend"  # a Slurm job's time limit is near: saved, the run goes on in the next job


USER_RESTART_REASON = "restart requested by the user"
"""A restart's reason when the user asked for it (r, f, p, `ctl restart`): no incident."""


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended (``kind``: an OutcomeKind; its value compares equal to the string)."""

    kind: str
    made_progress: bool
    returncode: int | None = None
    preset: str | None = None
    requested_preset: str | None = None  # for user_restart: the preset asked for
    stop_reason: str | None = None  # a fatal warning whose advice is "a human must act"
    exception: str | None = None  # the trainer's last exception line


def reached_the_end(
    epoch: int | None, epochs: int | None, batch: int | None, batches: int | None, phase: str = ""
) -> bool:
    """A trainer whose exit status is unknown (adopted after its holder was killed) is taken
    as finished when it had said so (phase finished) or reached its last batch of its last
    epoch; else as a crash, recovered from its last good checkpoint."""
    if phase == "finished":
        return True
    if not (epochs and batches and epoch and batch):
        return False
    return epoch >= epochs and batch >= batches


@dataclass(frozen=True)
class Decision:
    action: str  # restart | finish | fail | stop | suspend
    reason: str
    preset: str | None = None
    delay_s: float = 0.0


class RecoveryPolicy:
    """Restart on a stall or crash — with the fallback preset when there is one (A → B) —
    within a restart budget, and a no-progress guard: an automatic restart whose attempt
    made no new batch costs double, and `no_progress_limit` of those in a row end the run
    as FAILED.

    The first restart of an incident goes at once; the doubling back-off (`backoff_base`,
    then × `backoff_factor`, at most `backoff_max`) is for the failures that follow it.  An
    incident ends when an attempt runs `calm_s` after its restart without failing (the
    time is an argument of `decide`; without it every failure belongs to one incident)."""

    def __init__(
        self,
        preset: str | None,
        fallback: str | None,
        *,
        max_restarts: int = 3,
        backoff_base: float = 1.0,
        backoff_factor: float = 2.0,
        backoff_max: float = 300.0,
        no_progress_limit: int = 2,
        auto_recover: bool = True,
        calm_s: float = 600.0,
    ):
        self.preset = preset
        self.fallback = fallback
        self.max_restarts = max_restarts
        self.backoff_base = backoff_base
        self.backoff_factor = backoff_factor
        self.backoff_max = backoff_max
        self.no_progress_limit = no_progress_limit
        self.auto_recover = auto_recover
        self.calm_s = calm_s
        self.used = 0  # budget spent (no-progress restarts count double)
        self.auto_restarts = 0  # automatic restarts so far
        self.incident_restarts = 0  # automatic restarts of this incident (drive the back-off)
        self.last_restart_at: float | None = None
        self.no_progress_streak = 0

    def _next_delay(self, now: float | None) -> float:
        """No back-off for an incident's first restart; then base, base × factor, ..."""
        if now is not None and self.last_restart_at is not None and now - self.last_restart_at >= self.calm_s:
            self.incident_restarts = 0  # the last restart held: this failure starts a new incident
        if self.incident_restarts == 0:
            return 0.0
        return min(self.backoff_max, self.backoff_base * self.backoff_factor ** (self.incident_restarts - 1))

    def decide(self, outcome: Outcome, now: float | None = None) -> Decision:
        """What follows the attempt that ended with ``outcome`` at time ``now``."""
        current = outcome.preset or self.preset
        if outcome.kind == "finished":
            return Decision("finish", "the trainer finished", current)
        if outcome.kind == "user_stop":
            return Decision("stop", "stopped by the user", current)
        if outcome.kind == "suspend":
            return Decision(
                "suspend", "the Slurm job's time limit is near: the run goes on in its next job", current
            )
        if outcome.kind == "user_restart":
            # The user's own restart is not charged to the automatic budget.
            self.no_progress_streak = 0
            return Decision("restart", USER_RESTART_REASON, outcome.requested_preset or current, 0.0)
        what = "stalled" if outcome.kind == "stall" else f"exited with code {outcome.returncode}"
        if outcome.exception and outcome.kind != "stall":
            what += f" ({outcome.exception})"
        if outcome.stop_reason and outcome.returncode is None and outcome.kind == "crash":
            # It never ran (spawn failed, preset invalid): no exit code to speak of.
            return Decision("fail", f"the trainer could not start: {outcome.stop_reason}", current)
        if outcome.stop_reason:
            return Decision(
                "fail",
                f"the trainer {what} after a fatal error that a restart will not fix: {outcome.stop_reason}",
                current,
            )
        if not self.auto_recover:
            return Decision("fail", f"the trainer {what} and auto-recovery is off", current)
        if outcome.made_progress:
            self.no_progress_streak = 0
            self.used += 1
        else:
            self.no_progress_streak += 1
            self.used += 2
        if self.no_progress_streak >= self.no_progress_limit:
            return Decision(
                "fail",
                f"{self.no_progress_streak} attempts in a row made no new "
                f"batch; giving up (the last one {what})",
                current,
            )
        if self.used > self.max_restarts:
            return Decision(
                "fail",
                f"restart budget spent ({self.max_restarts} restarts, "
                f"no-progress attempts count double); the last attempt {what}",
                current,
            )
        target = self.fallback or current
        delay = self._next_delay(now)
        self.auto_restarts += 1
        self.incident_restarts += 1
        self.last_restart_at = now
        reason = f"the trainer {what}"
        if target != current:
            reason += f"; falling back from {current} to {target}"
        return Decision("restart", reason, target, delay)
