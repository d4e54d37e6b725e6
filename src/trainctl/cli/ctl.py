"""`trainctl ctl RUN_DIR COMMAND`: one command to a run's agent (a run whose agent died is
adopted first; a Slurm run with no agent to ask is stopped through Slurm)."""

from __future__ import annotations

import asyncio
import json
import sys

from trainctl.cli.common import UsageError, note, resolve_run_dir
from trainctl.cli.starting import adopt_if_orphaned
from trainctl.hosts.run_status import one_command


def cmd_ctl(args) -> int:
    from trainctl.client.connection import AgentNotResponding, AgentUnavailable

    run_dir = resolve_run_dir(args.run_dir)
    kw = {}
    if args.command == "switch_preset":
        if not args.preset:
            raise UsageError("switch_preset needs --preset NAME")
        kw["preset"] = args.preset
    elif args.preset and args.command == "restart":
        args.command, kw = "switch_preset", {"preset": args.preset}
    if args.command == "auto_recover" and args.on is not None:
        kw["on"] = args.on
    from trainctl.hosts.where import AgentUnreachable, UntrustedRun

    try:
        try:
            reply = asyncio.run(one_command(run_dir, args.command, **kw))
        except AgentUnavailable as e:  # no agent here: a trainer without one is adopted first
            if isinstance(e, (UntrustedRun, AgentNotResponding, AgentUnreachable)) or not adopt_if_orphaned(
                run_dir
            ):
                raise
            reply = asyncio.run(one_command(run_dir, args.command, **kw))
    except UntrustedRun as e:  # never a scancel of a job id read from such a directory
        print(f"trainctl: {e}", file=sys.stderr)
        return e.exit_code
    except (AgentNotResponding, AgentUnreachable) as e:
        from trainctl.cli.slurm import stop_waiting_job
        from trainctl.hosts.slurm.jobs import is_slurm_run

        if isinstance(e, AgentUnreachable) and args.command == "stop" and is_slurm_run(run_dir):
            note(f"{e}; stopping the run through Slurm instead (scancel)")
            return stop_waiting_job(run_dir)  # its agent gets SIGTERM: STOPPED by the user
        print(f"trainctl: {e}", file=sys.stderr)
        return e.exit_code
    except AgentUnavailable as e:
        from trainctl.cli.slurm import stop_waiting_job
        from trainctl.hosts.slurm.jobs import is_slurm_run

        if args.command == "stop" and is_slurm_run(run_dir):
            return stop_waiting_job(run_dir)  # its job waits in the queue: scancel it
        print(f"trainctl: {e}", file=sys.stderr)
        return 1
    if not reply.get("ok"):
        print(f"trainctl: {args.command} refused: {reply.get('error')}", file=sys.stderr)
        return 2
    print(json.dumps(reply.get("result"), indent=2))
    return 0
