"""`trainctl run`: a job file or `-- COMMAND`, here (the agent detached, the dashboard on
it; or in this process with --json/--headless), on a box (--host: src/trainctl/cli/remote.py)
or as Slurm batch jobs (--slurm).  The run's spec comes from the spec builder
(src/trainctl/agent/prepare.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from trainctl.agent.prepare import link_latest, prepare_run
from trainctl.cli.attach import attach_local
from trainctl.cli.common import UsageError, note
from trainctl.cli.starting import agent_answers, never_began, run_agent, start_detached_agent


def _job_has_host(args) -> bool:
    if not getattr(args, "job", None):
        return False
    from trainctl.config import ConfigError, load_job

    try:
        return bool(load_job(Path(args.job)).host)
    except ConfigError as e:
        raise UsageError(str(e)) from e


def cmd_run(args) -> int:
    if args.host or _job_has_host(args):
        if args.slurm:
            raise UsageError("give --host or --slurm, not both (run from the cluster's login node)")
        from trainctl.cli.remote import run_remote
        from trainctl.hosts.all_runs import RunsSource

        return run_remote(args, RunsSource())
    run_dir, spec, created = prepare_run(args, note)
    if spec.slurm is not None:
        from trainctl.cli.slurm import run_slurm
        from trainctl.hosts.slurm.jobs import submit_run

        job_id = submit_run(args, run_dir, spec, created)
        link_latest(run_dir)
        from trainctl.hosts.all_runs import RunsSource

        return run_slurm(args, run_dir, job_id, RunsSource())
    if args.headless or args.json:
        if not args.json:
            print(f"trainctl: run directory {run_dir}", flush=True)
        # `latest` names the run once the job is its own: a refused run never touches it.
        code = run_agent(run_dir, spec, args.json, on_locked=lambda: link_latest(run_dir))
        if code == 2 and created and never_began(run_dir):  # another run won: no trace
            shutil.rmtree(run_dir, ignore_errors=True)
        return code
    try:
        where = start_detached_agent(run_dir, spec, use_tmux=not args.no_tmux)
    except UsageError:
        if created and never_began(run_dir):  # refused before it began: leave no trace
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    link_latest(run_dir)
    if args.detach:
        print(f"trainctl: {where}\ntrainctl: run directory {run_dir}", flush=True)
        return 0
    code = attach_local(run_dir)
    if agent_answers(run_dir):  # said after the dashboard: while it ran the line was hidden,
        print(f"trainctl: {where}")  # and for a run that has ended it is no longer true
    return code
