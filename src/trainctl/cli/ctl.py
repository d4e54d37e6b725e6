"""`trainctl ctl RUN_DIR COMMAND`: one command to a run's agent (a run whose agent died is
adopted first; a run with no agent to ask that waits, a Slurm run's queued job, is stopped
by its host: src/trainctl/hosts/base.py `cancel_waiting`)."""

from __future__ import annotations

import asyncio
import json
import sys

from trainctl.cli.common import UsageError, note
from trainctl.hosts.run_status import one_command


def cmd_ctl(args) -> int:
    from trainctl.client.connection import AgentNotResponding, AgentUnavailable
    from trainctl.hosts.registry import locate

    host, run_dir = locate(args.run_dir)
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

    def ask() -> dict:
        return asyncio.run(one_command(run_dir, args.command, client=host.client_factory(run_dir), **kw))

    try:
        try:
            reply = ask()
        except AgentUnavailable as e:  # no agent here: a trainer without one is adopted first
            if isinstance(e, (UntrustedRun, AgentNotResponding, AgentUnreachable)) or not host.adopt(
                run_dir, note
            ):
                raise
            reply = ask()
    except UntrustedRun as e:  # never a scancel of a job id read from such a directory
        print(f"trainctl: {e}", file=sys.stderr)
        return e.exit_code
    except (AgentNotResponding, AgentUnreachable) as e:
        if isinstance(e, AgentUnreachable) and args.command == "stop" and host.waits_in_queue(run_dir):
            note(f"{e}; stopping the run through Slurm instead (scancel)")
            return _cancel_waiting(host, run_dir)  # its agent gets SIGTERM: STOPPED by the user
        print(f"trainctl: {e}", file=sys.stderr)
        return e.exit_code
    except AgentUnavailable as e:
        if args.command == "stop" and host.waits_in_queue(run_dir):
            return _cancel_waiting(host, run_dir)  # its job waits in the queue: cancel it
        print(f"trainctl: {e}", file=sys.stderr)
        return 1
    if not reply.get("ok"):
        print(f"trainctl: {args.command} refused: {reply.get('error')}", file=sys.stderr)
        return 2
    print(json.dumps(reply.get("result"), indent=2))
    return 0


def _cancel_waiting(host, run_dir: str) -> int:
    """`ctl RUN stop` with no agent to ask: the host cancels what waits (a Slurm job)."""
    print(json.dumps({"stopped": True, "slurm_job": host.cancel_waiting(run_dir)}))
    return 0
