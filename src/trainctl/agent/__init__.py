"""The agent: the headless supervisor of one run, in parts (docs/internals.md has the map).

- context: what every part reads (spec, files, pure pieces, bus, run-wide facts)
- bus: one emit, many sinks (journal, projector, clients, printer)
- intake: console lines (through src/trainctl/core/feed.py) and the side channel, taken in
- watch: the periodic watch (stall check, ticks, projection)
- stop: diagnose, save-wait, kill, sweep, GPU release
- attempt: the attempt loop (the supervisor's state machine over attempts)
- spawner: the Spawner/Trainer seam and the real PipeSpawner
- runners: the runner registry (argv, env, resume rule per kind)
- server / commands: the Unix socket and the command handlers
- tasks: supervised background tasks and error reports
- service: Agent, which wires them and owns the run's life
"""

from trainctl.agent.attempt import EXIT_SUPERVISION_LOST
from trainctl.agent.service import Agent

__all__ = ["Agent", "EXIT_SUPERVISION_LOST"]
