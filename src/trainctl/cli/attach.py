"""`trainctl attach [RUN_DIR | ssh://HOST[/RUN_DIR]]`: the dashboard on a run's agent, or its
events followed as lines (--json/--headless); a run whose agent died is adopted first.  The
run's host (src/trainctl/hosts/registry.py `locate`) finds the run, reaches its agent and
says what a follow does between two agents."""

from __future__ import annotations

from trainctl.cli.common import UsageError, note, printer


def dashboard(host, run_dir: str) -> int:
    """The dashboard on a run of ``host``, the user's other runs in its picker."""
    from trainctl.hosts.all_runs import RunsSource
    from trainctl.tui.app import run_dashboard

    return run_dashboard(
        host.client_factory(run_dir),
        attach_hint=host.attach_hint(run_dir),
        runs=RunsSource(),
        run_key=(host.where, str(run_dir)),
    )


def cmd_attach(args) -> int:
    if (args.tail is not None or args.from_snapshot) and not (args.json or args.headless):
        raise UsageError("--tail and --from-snapshot go with --json or --headless")
    if args.tail is not None and (args.tail < 0 or args.from_snapshot):
        raise UsageError("--tail takes a count of events (0 or more), without --from-snapshot")
    from trainctl.hosts.registry import locate

    host, run_dir = locate(args.target)
    host.adopt(run_dir, note)
    if args.json or args.headless:
        import asyncio

        from trainctl.client.follow import follow

        return asyncio.run(
            follow(
                host.client_factory(run_dir),
                printer(args.json),
                note,
                tail=args.tail,
                from_snapshot=args.from_snapshot,
                between_agents=host.between_agents(run_dir, note),
            )
        )
    return dashboard(host, run_dir)
