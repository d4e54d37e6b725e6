"""What a host adds to an agent: the :class:`AgentPlug` seam.

The agent (src/trainctl/agent/service.py) calls its plug at defined points; a host that has
more to say about where its agent runs (Slurm: src/trainctl/hosts/slurm/agent_part.py)
implements them, and the CLI (`trainctl agent --slurm`) hands the plug to the agent.  The
plug never sets attributes of the agent's parts nor replaces their handlers: it asks for
changes of the run's course through ``ctx.requests`` (src/trainctl/agent/requests.py),
e.g. a suspend before the save deadline it knows of.  This base class is the plug of a
run with nothing to add (a local or an ssh run): every point answers "nothing"."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from trainctl.agent.context import RunContext


class Attempts(Protocol):
    """What a plug may ask of the attempt loop (src/trainctl/agent/attempt.py)."""

    def stopped(self, reason: str) -> int:
        """The run ends on a stop (STOPPED, or FAILED when supervision was lost): its exit code."""


class AgentPlug:
    name = ""  # what its errors are reported as ("" : no plug)
    job_id: str | None = None  # the host's job this agent runs in, in each start event
    takes_over_begun = False  # a journal already begun is a run to go on with (a next job)
    # how long an agent going on with a begun run waits for the run's locks, still held by
    # the processes of an earlier agent of it (src/trainctl/agent/claim.py)
    takeover_wait_s = 0.0

    def attach(self, ctx: RunContext, attempts: Attempts) -> None:
        """Once, when the agent has built its parts (before its event loop runs)."""

    def signals(self) -> dict[int, Callable[[], None]]:
        """Signal handlers of its own: they take the place of the agent's for the same
        signal (the agent's SIGTERM stops the run)."""
        return {}

    async def begin(self) -> None:
        """Once the run is this agent's, before its first attempt: what the host knows
        (a job's time limit: the save deadline, its own timers and watches)."""

    async def suspend(self) -> int | None:
        """The trainer saved and gone at a suspend: what ends this agent's part of the
        run (the next job submitted), the agent's exit code; None: the run stops."""
        return None

    async def lead_goes_on(self) -> str | None:
        """A run whose journal ended: the state of the part that goes on with it (a job's
        lead node), else None."""
        return None

    def killed_before(self) -> str | None:
        """The agent before this one was killed and started again by the host's keeper:
        said (journaled), and how; None otherwise."""
        return None

    def restarted(self) -> str:
        """How many times the host started this same job again ("" or "0": never)."""
        return ""
