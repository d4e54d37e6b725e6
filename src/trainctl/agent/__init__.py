"""The agent: the headless process that keeps one run alive, in parts (docs/internals.md has
the map).

- context: what every part reads (RunConfig, frozen) and the run's facts (RunFacts, one writer each)
- requests: the one owner of stop / suspend / restart requests
- plug: what a host adds to an agent (AgentPlug; Slurm's is hosts/slurm/agent_part.py)
- prepare: the spec builder (a run's inputs checked, its directory and spec.json written)
- bus: one emit, many sinks (journal, projector, clients, printer)
- intake: console lines (through src/trainctl/core/feed.py) and the side channel, taken in
- watch: the periodic watch (stall check, ticks, projection)
- stop: diagnose, save-wait, kill, sweep, GPU release
- attempt: the attempt loop (core/recovery.py's state machine over attempts)
- spawner: the Spawner/Trainer seam and the real PipeSpawner
- launch: how each job kind starts its trainer (argv, env, resume rule per kind)
- server / handlers: the Unix socket and the command handlers
- tasks: supervised background tasks and error reports
- service: Agent, which wires them and owns the run's life


Importing the package imports none of them: `trainctl run --detach` uses the spec builder
alone, and the agent's own process imports the rest once (``Agent`` and
``EXIT_SUPERVISION_LOST`` are read from here lazily).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainctl.agent.attempt import EXIT_SUPERVISION_LOST
    from trainctl.agent.service import Agent

__all__ = ["Agent", "EXIT_SUPERVISION_LOST"]


def __getattr__(name: str):
    if name == "Agent":
        from trainctl.agent.service import Agent

        return Agent
    if name == "EXIT_SUPERVISION_LOST":
        from trainctl.agent.attempt import EXIT_SUPERVISION_LOST

        return EXIT_SUPERVISION_LOST
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
