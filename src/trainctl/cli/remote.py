"""`trainctl run --host HOST` and `trainctl attach ssh://HOST[/RUN_DIR]`: the agent lives on
the box (inside tmux), the dashboard wherever the user is, joined by the user's own ssh.
What the box does (sending the job, starting its agent, reaching it) is its Host's,
src/trainctl/hosts/box.py; here: the options, what is printed, the follow or the dashboard."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from trainctl.cli.common import UsageError, note, printer, resolve_alerts, run_name


def _forwarded_options(args) -> list[str]:
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
    if args.no_auto_recover:
        out.append("--no-auto-recover")
    if getattr(args, "no_instrument", False):
        out.append("--no-instrument")
    out.append("--via-ssh")  # the box's agent says so in its advice
    return out


def run_remote(args, runs=None) -> int:
    """Send the job and presets to the box, start the agent there in tmux, then attach."""
    from trainctl.config import ConfigError, load_job
    from trainctl.hosts.base import LaunchRequest
    from trainctl.hosts.registry import host_for_destination

    job = None
    try:
        job = load_job(Path(args.job)) if args.job else None
    except ConfigError as e:
        raise UsageError(str(e)) from e
    host_cfg = dict(job.host or {}) if job else {}
    box = host_for_destination(args.host or host_cfg.get("destination"), host_cfg.get("trainctl"))
    request = LaunchRequest(
        name=run_name(args, job),
        job=job,
        command=list(args.command_argv or []),
        run_dir=args.run_dir,
        preset=args.preset,
        fallback=args.fallback,
        setup=args.setup or "",
        options=_forwarded_options(args),
        alerts=resolve_alerts(args, job),
    )
    launched = box.launch(request)
    run_dir = launched.run_dir
    print(launched.said, flush=True)
    if args.headless or args.json or args.detach:
        if args.detach:
            print(f"trainctl: dashboard: {box.attach_hint(run_dir)}")
            return 0
        return _follow(box, run_dir, args.json)
    return _dashboard(box, run_dir, runs)


def _follow(box, run_dir: str, as_json: bool, *, tail: int | None = None, from_snapshot: bool = False) -> int:
    from trainctl.client.follow import follow

    return asyncio.run(
        follow(box.client_factory(run_dir), printer(as_json), note, tail=tail, from_snapshot=from_snapshot)
    )


def _dashboard(box, run_dir: str, runs=None) -> int:
    """``runs``: the user's other runs for the dashboard's picker (the CLI's RunsSource)."""
    from trainctl.tui.app import run_dashboard

    return run_dashboard(
        box.client_factory(run_dir),
        attach_hint=box.attach_hint(run_dir),
        runs=runs,
        run_key=(box.where, run_dir),
    )


def attach_remote(
    url: str,
    *,
    follow: bool = False,
    as_json: bool = False,
    tail: int | None = None,
    from_snapshot: bool = False,
    runs=None,
) -> int:
    from trainctl.hosts.registry import host_for
    from trainctl.hosts.ssh import parse_attach_url

    try:
        _, run_dir = parse_attach_url(url)
    except ValueError as e:
        raise UsageError(str(e)) from e
    box = host_for(url)
    box.check()
    run_dir = run_dir or "latest"
    if run_dir == "latest":
        run_dir = box.latest_run()
    if follow:
        return _follow(box, run_dir, as_json, tail=tail, from_snapshot=from_snapshot)
    return _dashboard(box, run_dir, runs)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(2)
