"""The Slurm host: a cluster reached from its login node.  A run's agent runs as a batch job
(src/trainctl/hosts/slurm/queue.py submits it), on a node whose run directory is the one
here (shared storage): its runs are listed with this machine's (hosts/local.py); a client
reaches its agent through the socket, or over ssh to its node (hosts/where.py), and reads
the journal here once Slurm says the agent's job has left its node."""

from __future__ import annotations

import shlex
from pathlib import Path

from trainctl.core.usage import UsageError
from trainctl.hosts.base import Launched, LaunchRequest
from trainctl.hosts.slurm import queue as slurm


def job_gone(job: str) -> bool:
    """ssh to an agent's node failed: is the agent gone with its job (a node failure leaves
    its socket file on the shared storage; the job is requeued, PENDING, or ended)?  False
    when Slurm does not say either: the node is what cannot be reached."""
    try:
        info = slurm.job_info(job)
    except slurm.SlurmError:
        return False
    return info is None or info.state.split()[0] not in ("RUNNING", "COMPLETING")


def queued_slurm_runs() -> list[Path]:
    """Run directories of this user's trainctl jobs in the Slurm queue ([] without Slurm)."""
    if not slurm.configured():
        return []
    try:
        r = slurm._run(["squeue", "-h", "--me", "-o", "%j|%Z"], timeout=15)
    except slurm.SlurmError:
        return []
    if r.returncode != 0:
        return []
    out = []
    for line in r.stdout.splitlines():
        name, _, workdir = line.partition("|")
        if name.startswith("trainctl-") and workdir:
            out.append(Path(workdir))
    return out


class SlurmHost:
    """Runs as Slurm jobs, from this machine (the cluster's login node)."""

    where = "local"  # their run directories are this machine's (shared storage)

    def launch(self, request: LaunchRequest) -> Launched:
        """Prepare the run here (the CLI's spec builder), submit its first job."""
        from trainctl.hosts.slurm.jobs import submit_run

        if request.prepare is None:
            raise UsageError("a Slurm run is prepared on this machine: no spec builder given")
        run_dir, spec, created = request.prepare()
        job_id = submit_run(None, run_dir, spec, created)
        return Launched(str(run_dir), f"trainctl: submitted Slurm job {job_id}; run directory {run_dir}")

    def client_factory(self, run_dir: str):
        from trainctl.client.connection import AgentClient
        from trainctl.hosts.where import transport_for

        return lambda: AgentClient(transport_for(run_dir, job_gone))

    def runs(self, folds: dict | None = None, ended_slurm: bool = True) -> list[dict]:
        return []  # listed with this machine's runs (hosts/local.py), their directories here

    def waits_in_queue(self, run_dir: str) -> bool:
        from trainctl.hosts.slurm.jobs import is_slurm_run

        return is_slurm_run(Path(run_dir))

    def cancel_waiting(self, run_dir: str) -> str:
        from trainctl.hosts.slurm.jobs import cancel_waiting_job

        return cancel_waiting_job(Path(run_dir))

    def between_agents(self, run_dir: str, say):
        """Wait while the run's current job is queued or starting (hosts/slurm/jobs.py)."""
        from trainctl.hosts.slurm.jobs import BetweenJobs

        return BetweenJobs(Path(run_dir), say)

    def url(self, run_dir: str) -> str:
        return str(run_dir)

    def attach_hint(self, run_dir: str) -> str:
        return f"trainctl attach {shlex.quote(str(run_dir))}"


def claim(target: str) -> SlurmHost | None:
    """A run directory of a Slurm run: its jobs recorded (slurm.json), or its agent says it
    ran in a Slurm job (agent.json); ``slurm:`` (`--slurm`, a job's ``[slurm]``).  A
    directory that is not the user's own is not read: this machine's host refuses it."""
    if target == "slurm:":
        return SlurmHost()
    if "://" in target or target == "local:":
        return None
    from trainctl.hosts.where import agent_info
    from trainctl.store.paths import UnsafePathError, trusted_run_dir

    try:
        trusted_run_dir(target)
    except (UnsafePathError, OSError, ValueError):
        return None
    if slurm.read_jobs(Path(target)) or agent_info(target).get("slurm_job"):
        return SlurmHost()
    return None
