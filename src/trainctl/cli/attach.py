"""`trainctl attach [RUN_DIR | ssh://HOST[/RUN_DIR]]`: the dashboard on a run's agent, or its
events followed as lines (--json/--headless); a run whose agent died is adopted first."""

from __future__ import annotations

import asyncio
import shlex
import time
from pathlib import Path

from trainctl.cli.common import UsageError, note, printer, resolve_run_dir, self_command
from trainctl.cli.starting import adopt_if_orphaned


def attach_local(run_dir: Path) -> int:
    from trainctl.hosts.all_runs import RunsSource
    from trainctl.hosts.registry import client_for
    from trainctl.tui.app import run_dashboard

    return run_dashboard(
        lambda: client_for(run_dir),
        attach_hint=f"{self_command()} attach {shlex.quote(str(run_dir))}",
        runs=RunsSource(),
        run_key=("local", str(run_dir)),
    )


def cmd_attach(args) -> int:
    if (args.tail is not None or args.from_snapshot) and not (args.json or args.headless):
        raise UsageError("--tail and --from-snapshot go with --json or --headless")
    if args.tail is not None and (args.tail < 0 or args.from_snapshot):
        raise UsageError("--tail takes a count of events (0 or more), without --from-snapshot")
    if args.target and args.target.startswith("ssh://"):
        from trainctl.cli.remote import attach_remote
        from trainctl.hosts.all_runs import RunsSource

        return attach_remote(
            args.target,
            follow=args.json or args.headless,
            as_json=args.json,
            tail=args.tail,
            from_snapshot=args.from_snapshot,
            runs=RunsSource(),
        )
    run_dir = resolve_run_dir(args.target)
    adopt_if_orphaned(run_dir)
    if args.json or args.headless:
        from trainctl.client.follow import follow
        from trainctl.hosts.registry import client_for

        return asyncio.run(
            follow(
                lambda: client_for(run_dir),
                printer(args.json),
                note,
                tail=args.tail,
                from_snapshot=args.from_snapshot,
                between_agents=_Adopting(run_dir),
            )
        )
    return attach_local(run_dir)


class _Adopting:
    """No agent answered, and the journal does not end the run: wait while an agent holds
    the run without listening yet (another `attach` beside this one won the race to adopt
    it, and starts), or the run still needs adopting (this attach's own agent lost that race
    and ended), up to ADOPT_WAIT_S; then end (3, the agent is gone)."""

    ADOPT_WAIT_S = 30.0

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.since = run_dir, None

    async def __call__(self, hello: dict) -> bool:
        from trainctl.agent.adopt import agent_running, needs_adoption

        now = time.monotonic()
        self.since = self.since or now
        if now - self.since > self.ADOPT_WAIT_S:
            return False
        if agent_running(self.run_dir):
            return True
        return await asyncio.get_running_loop().run_in_executor(None, needs_adoption, self.run_dir)
