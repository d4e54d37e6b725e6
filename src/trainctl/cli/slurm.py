"""`trainctl run --slurm` as the CLI shows it: the first job submitted (by the Slurm host,
src/trainctl/hosts/slurm/), then the run followed across its jobs (PENDING with squeue's
reason between them) or its dashboard; `ctl RUN stop` of a run whose job waits."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from trainctl.cli.common import note, printer
from trainctl.hosts.slurm.jobs import BetweenJobs, cancel_waiting_job


def run_slurm(args, run_dir: Path, job_id: str, runs=None) -> int:
    """``runs``: the user's other runs for the dashboard's picker (the CLI's RunsSource)."""
    print(f"trainctl: submitted Slurm job {job_id}; run directory {run_dir}", flush=True)
    if args.detach:
        return 0
    if args.headless or args.json:
        return follow_slurm(run_dir, args.json)
    from trainctl.hosts.registry import client_for
    from trainctl.tui.app import run_dashboard

    # The dashboard at once: while the job waits it shows PENDING and squeue's reason, and
    # follows the job's agent when it answers (and each next job's).
    return run_dashboard(
        lambda: client_for(run_dir),
        attach_hint=f"trainctl attach {run_dir}",
        runs=runs,
        run_key=("local", str(Path(run_dir).resolve())),
    )


def follow_slurm(run_dir: Path, as_json: bool) -> int:
    """`--json`/`--headless` across the run's jobs, until it ends."""
    from trainctl.client.follow import follow
    from trainctl.hosts.registry import client_for

    return asyncio.run(
        follow(lambda: client_for(run_dir), printer(as_json), note, between_agents=BetweenJobs(run_dir, note))
    )


def stop_waiting_job(run_dir: Path) -> int:
    """`ctl RUN stop` with no agent to ask: scancel the run's job (:func:`cancel_waiting_job`)."""
    print(json.dumps({"stopped": True, "slurm_job": cancel_waiting_job(run_dir)}))
    return 0
