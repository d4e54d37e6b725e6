"""`trainctl run`: a job file or `-- COMMAND`, started by the host the registry picks
(src/trainctl/hosts/registry.py `host_for_launch`): here (the agent detached, the dashboard
on it; or in this process with --json/--headless), on a box (--host, a job's [host]) or as
Slurm batch jobs (--slurm, a job's [slurm]).  Here: the options, what is printed, the
follow or the dashboard.  The run's spec comes from the spec builder
(src/trainctl/agent/prepare.py)."""

from __future__ import annotations

from pathlib import Path

from trainctl.agent.prepare import prepare_run
from trainctl.cli.attach import dashboard
from trainctl.cli.common import UsageError, note, printer, resolve_alerts, run_name


def _load_job(args):
    if not getattr(args, "job", None):
        return None
    from trainctl.config import ConfigError, load_job

    try:
        return load_job(Path(args.job))
    except ConfigError as e:
        raise UsageError(str(e)) from e


def _forwarded_options(args) -> list[str]:
    """The options a box's `trainctl run` gets (what the box cannot read from the job)."""
    out: list[str] = []
    for flag in ("preset", "fallback", "deadline", "name", "resume_from"):
        value = getattr(args, flag, None)
        if value:
            out += [f"--{flag.replace('_', '-')}", value]
    for flag in ("stall_timeout", "startup_idle", "silence_floor"):
        value = getattr(args, flag, None)
        if value is not None:
            out += [f"--{flag.replace('_', '-')}", repr(value)]
    if args.max_restarts is not None:
        out += ["--max-restarts", str(args.max_restarts)]
    if getattr(args, "node_rank", None) is not None:
        out += ["--node-rank", str(args.node_rank)]
    for r in args.resume_arg or []:
        out += ["--resume-arg", r]
    for t in args.trust_checkpoint or []:  # a path on the box, as --resume-from is
        out += ["--trust-checkpoint", t]
    for glob in getattr(args, "checkpoints", None) or []:
        out += ["--checkpoints", glob]
    if args.no_auto_recover:
        out.append("--no-auto-recover")
    if getattr(args, "no_instrument", False):
        out.append("--no-instrument")
    if getattr(args, "no_spare", False):
        out.append("--no-spare")
    out.append("--via-ssh")  # the box's agent says so in its advice
    return out


def cmd_run(args) -> int:
    from trainctl.hosts.base import LaunchRequest
    from trainctl.hosts.registry import host_for_launch

    job = _load_job(args)
    host_cfg = dict(job.host or {}) if job else {}
    if (args.host or host_cfg) and args.slurm:  # an option pair, before any host is asked
        raise UsageError("give --host or --slurm, not both (run from the cluster's login node)")
    host = host_for_launch(
        args.host or host_cfg.get("destination"),
        slurm=args.slurm or (job is not None and job.slurm is not None),
        trainctl_cmd=host_cfg.get("trainctl"),
    )
    request = LaunchRequest(
        naming=lambda: run_name(args, job),
        job=job,
        command=list(args.command_argv or []),
        run_dir=args.run_dir,
        preset=args.preset,
        fallback=args.fallback,
        setup=args.setup or "",
        options=_forwarded_options(args),
        alerts=lambda: resolve_alerts(args, job),
        prepare=lambda: prepare_run(args, note),
        foreground=bool(args.json or args.headless),
        use_tmux=not args.no_tmux,
    )
    launched = host.launch(request)
    run_dir = launched.run_dir
    if launched.run_here is not None:  # its agent runs in this process, printing its events
        if not args.json:
            print(launched.said, flush=True)
        return launched.run_here(printer(args.json))
    if launched.said:
        print(launched.said, flush=True)
    if args.detach:
        if launched.detached:
            print(launched.detached, flush=True)
        return 0
    if args.headless or args.json:
        import asyncio

        from trainctl.client.follow import follow

        return asyncio.run(
            follow(
                host.client_factory(run_dir),
                printer(args.json),
                note,
                between_agents=host.between_agents(run_dir, note),
            )
        )
    code = dashboard(host, run_dir)
    after = launched.after()
    if after:
        print(after)
    return code
