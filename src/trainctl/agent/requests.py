"""The requests that change a run's course -- stop, suspend (a Slurm job's time limit, a
preemption), restart (with a preset), recover from a stall, give up supervision -- and
their one owner.

As the state machine (src/trainctl/core/recovery.py ``StateMachine.to``) is the one way
the run's state changes, :class:`Requests` is the one way a change is asked for: the
user's commands, the signals, a host's plug (src/trainctl/agent/plug.py) and the agent's
own give-up call its methods; the attempt loop reads what was asked.  Each method sets
every flag its request needs, so no caller can set half of one."""

from __future__ import annotations

import asyncio
import enum


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

    @property
    def why(self) -> EndRequest:
        """The request that set it; asked only once it is set (:attr:`event`)."""
        assert self.kind is not None, "the interrupt is not set"
        return self.kind


class Requests:
    """What was asked of the run: read by anyone, written only through the methods below."""

    def __init__(self) -> None:
        self.stop_requested = asyncio.Event()
        self.suspend_requested = asyncio.Event()  # a Slurm job's time-limit warning
        self.stop_reason: str | None = None  # why the run stops, when not the user's `s`
        self.ending: asyncio.Future | None = None  # finding out why Slurm ends the job
        self.lost: str | None = None  # why supervision could not go on (the run then FAILS)
        self.next_preset: str | None = None  # the preset the next attempt uses, when picked
        self.interrupt = Interrupt()  # the current attempt's

    # ------------------------------------------------------------------ the run
    def stop(self, reason: str | None = None) -> None:
        """Stop the run (the user's `s`, a signal, a node of the job ended): the attempt
        ends, no other starts.  ``reason``: why, when not the user's stop."""
        if reason is not None:
            self.stop_reason = reason
        self.stop_requested.set()
        self.interrupt.set(EndRequest.USER_STOP)

    def give_up(self, why: str) -> None:
        """Supervision cannot go on: the run stops, and ends FAILED with ``why``."""
        self.lost = why
        self.stop()

    def suspend(self) -> None:
        """Save and end this agent's part of the run; it goes on elsewhere (the next Slurm
        job, or this one requeued)."""
        self.suspend_requested.set()
        self.interrupt.set(EndRequest.SUSPEND)

    def hold(self, why: asyncio.Future) -> None:
        """The run's end is coming and ``why`` finds out what it means (Slurm's SIGTERM):
        the attempt ends at once, no restart until ``why`` settles it with
        :meth:`ends_stopped` or :meth:`ends_suspended`."""
        if self.ending is None:
            self.ending = why
        self.interrupt.set(EndRequest.USER_STOP)

    def ends_suspended(self) -> None:
        """What :meth:`hold` waited for: the run goes on elsewhere."""
        self.suspend_requested.set()

    def ends_stopped(self, reason: str) -> None:
        """What :meth:`hold` waited for: the run stops, for ``reason``."""
        self.stop_reason = reason
        self.stop_requested.set()

    @property
    def over(self) -> bool:
        """A stop or a suspend was asked: nothing new starts."""
        return self.stop_requested.is_set() or self.suspend_requested.is_set()

    # ------------------------------------------------------------------ the attempt
    def restart(self, preset: str | None) -> bool:
        """End the attempt; the next one uses ``preset``.  False when it already ends."""
        return self.interrupt.set(EndRequest.USER_RESTART, preset)

    def recover(self) -> bool:
        """End a stalled attempt (recovery goes on as the policy decides)."""
        return self.interrupt.set(EndRequest.STALL)

    def pick_next(self, preset: str | None) -> None:
        """The next attempt's preset (picked while none runs, or for the next restart)."""
        self.next_preset = preset

    def take_next(self, default: str | None) -> str | None:
        """The preset picked for the next attempt, else ``default``; the pick is used up."""
        preset, self.next_preset = self.next_preset or default, None
        return preset

    def new_attempt(self) -> Interrupt:
        """A new attempt's interrupt, already set when a stop or a suspend is pending."""
        self.interrupt = Interrupt()
        if self.stop_requested.is_set():
            self.interrupt.set(EndRequest.USER_STOP)
        elif self.suspend_requested.is_set():
            self.interrupt.set(EndRequest.SUSPEND)
        return self.interrupt
