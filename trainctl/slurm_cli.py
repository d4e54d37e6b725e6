"""`trainctl run --slurm` (or a job's ``[slurm]``): the run's agent runs as a Slurm batch job,
and goes on in a next job at each time limit.  Here: submit the first job, follow the run
across its jobs (PENDING with squeue's reason between them), stop a run whose job waits."""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from .cli_common import UsageError, note, printer


def is_slurm_run(run_dir: Path) -> bool:
    from .engine.slurm import read_jobs
    return bool(read_jobs(run_dir))


def submit_run(args, run_dir: Path, spec, created: bool) -> str:
    """The first job of a prepared run: its batch script, sbatch, slurm.json.  A refusal
    (bad partition, time over the limit, no such gres) or an unreachable slurmctld is a
    UsageError of one line; a run directory made for it is removed."""
    import shutil
    from .engine import slurm
    from .engine.paths import RunFiles
    cfg = dict(spec.slurm or {})
    try:
        limit = slurm.time_limit_s(cfg)
        cfg["warn"] = slurm.warn_seconds(cfg, limit)
        spec.slurm = cfg
        spec.save(RunFiles(run_dir).spec)
        slurm.write_batch_script(run_dir, cfg.get("setup", ""))
        job_id = slurm.submit(slurm.sbatch_argv(cfg, run_dir, slurm.job_name(spec.job_name),
                                                cfg["warn"]))
    except (slurm.SlurmError, ValueError) as e:
        if created and not RunFiles(run_dir).events.exists():   # made for this run: no trace
            shutil.rmtree(run_dir, ignore_errors=True)
        raise UsageError(str(e)) from None
    slurm.add_job(run_dir, job_id)
    from .engine.journal import Journal
    Journal(RunFiles(run_dir).events).close()   # empty until the agent begins: readers find it
    return job_id


def run_slurm(args, run_dir: Path, job_id: str) -> int:
    print(f"trainctl: submitted Slurm job {job_id}; run directory {run_dir}", flush=True)
    if args.detach:
        return 0
    if args.headless or args.json:
        return follow_slurm(run_dir, args.json)
    from .engine.agent_where import client_for
    from .tui.app import run_dashboard
    if not _wait_for_agent(run_dir):
        return follow_slurm(run_dir, False)   # it ended before an agent answered: say how
    return run_dashboard(lambda: client_for(run_dir), attach_hint=f"trainctl attach {run_dir}")


def _wait_for_agent(run_dir: Path) -> bool:
    """Until the job's agent answers, say what Slurm says of the job (PENDING and why).
    False when the job is gone without one."""
    from .engine import slurm
    from .engine.agent.adopt import agent_running
    last = None
    while not agent_running(run_dir):
        job = slurm.current_job(run_dir)
        try:
            info = slurm.job_info(job) if job else None
        except slurm.SlurmError as e:
            info, said = None, str(e)
        else:
            said = f"Slurm job {job} {info.state}" + (f" ({info.reason})" if info and info.reason
                                                       not in ("", "None") else "") if info else ""
        if info is None or info.ended:
            return agent_running(run_dir)
        if info.state == "RUNNING" and _agent_began_in(run_dir, job):
            return True   # on its node: its lock may not be seen from here (shared storage)
        if said != last:
            note(said + ("; Ctrl-C leaves it queued" if info.state == "PENDING" else ""))
            last = said
        time.sleep(1.0)
    return True


def _agent_began_in(run_dir: Path, job: str) -> bool:
    """The agent of ``job`` wrote agent.json and opened its socket."""
    from .engine.agent_where import agent_info
    from .engine.paths import RunFiles
    return RunFiles(run_dir).sock.exists() and agent_info(run_dir).get("slurm_job") == job


def follow_slurm(run_dir: Path, as_json: bool) -> int:
    """`--json`/`--headless` across the run's jobs, until it ends."""
    from .engine.agent_where import client_for
    from .engine.follow import follow
    return asyncio.run(follow(lambda: client_for(run_dir), printer(as_json), note,
                              between_agents=_Between(run_dir)))


class _Between:
    """Between two agents of a Slurm run: wait while its current job is queued or starting
    (saying PENDING and squeue's reason once per change); a job gone without ending the
    run ends the follow, saying how it ended."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.last = run_dir, None

    async def __call__(self, hello: dict) -> bool:
        from .engine import slurm
        job = slurm.current_job(self.run_dir)
        if job is None:
            return False
        try:
            info = await asyncio.get_running_loop().run_in_executor(None, slurm.job_info, job)
        except slurm.SlurmError as e:
            self._say(f"{e}; the job goes on in Slurm, retrying")
            return True
        if info is not None and not info.ended:
            reason = f" ({info.reason})" if info.reason and info.reason != "None" else ""
            self._say(f"Slurm job {job} {info.state}{reason}")
            return True
        if _run_ended(self.run_dir):   # the agent's last events came after our look
            return True
        state = info.state if info else "gone from the queue"
        ended = (f"cancelled outside trainctl (scancel by someone else?)" if state.startswith("CANCELLED")
                 else f"ended ({state})")
        note(f"Slurm job {job} {ended} before its agent went on with the run; the run is "
             f"{hello.get('state')}")
        return False

    def _say(self, text: str) -> None:
        if text != self.last:
            note(text)
            self.last = text


def _run_ended(run_dir: Path) -> bool:
    from .engine.client import offline_hello
    from .engine.supervisor import FINAL_STATES
    return offline_hello(run_dir).get("state") in FINAL_STATES


def slurm_status(run_dir: Path) -> dict | None:
    """{"job", "jobs", "state", "reason"} of a Slurm run's current job; None for other runs."""
    from .engine import slurm
    jobs = slurm.read_jobs(run_dir)
    if not jobs:
        return None
    out = {"job": jobs[-1], "jobs": jobs}
    try:
        info = slurm.job_info(jobs[-1])
    except slurm.SlurmError as e:
        out["error"] = str(e)
        return out
    if info is not None:
        out.update(state=info.state, reason=info.reason, partition=info.partition, node=info.node,
                   time_limit_s=info.time_limit_s)
    return out


def stop_waiting_job(run_dir: Path) -> int:
    """`ctl RUN stop` (and the dashboard's `s`) with no agent to ask (none runs, or its node
    cannot be reached): scancel the run's job (marked as trainctl's: its agent, if one runs,
    ends the run STOPPED by the user) and, when no agent wrote it, end the run STOPPED in its
    journal."""
    from .engine import events as E
    from .engine import slurm
    from .engine.agent.adopt import agent_running
    from .engine.journal import Journal
    from .engine.paths import RunFiles
    from .engine.supervisor import RunState
    job = slurm.current_job(run_dir)
    if job is None or _run_ended(run_dir):
        raise UsageError(f"{run_dir}: no Slurm job of this run is waiting")
    slurm.mark_cancel(run_dir, job)
    try:
        slurm.cancel(job)
    except slurm.SlurmError as e:
        raise UsageError(str(e)) from None
    end = time.monotonic() + 30
    while time.monotonic() < end:
        info = slurm.job_info(job)
        if (info is None or info.ended) and not agent_running(run_dir):
            break
        time.sleep(0.3)
    if not _run_ended(run_dir):   # its agent, if one had started, says STOPPED itself
        journal = Journal(RunFiles(run_dir).events)
        try:
            journal.append(E.State(time.time(), RunState.STOPPED.value,
                                   f"stopped by the user: Slurm job {job} cancelled before it ran"))
        finally:
            journal.close()
    print(json.dumps({"stopped": True, "slurm_job": job}))
    return 0
