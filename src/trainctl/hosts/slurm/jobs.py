"""`trainctl run --slurm` (or a job's ``[slurm]``): the run's agent runs as a Slurm batch job,
and goes on in a next job at each time limit.  Here: submit the first job, a run's jobs and
nodes as status shows them, stop a run whose job waits, and what a follow does between two
of its jobs (BetweenJobs: PENDING with squeue's reason), each through the Slurm host
(src/trainctl/hosts/slurm/host.py)."""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainctl.core.usage import UsageError


def is_slurm_run(run_dir: Path) -> bool:
    from trainctl.hosts.slurm.queue import read_jobs

    return bool(read_jobs(run_dir))


def submit_run(args, run_dir: Path, spec, created: bool) -> str:
    """The first job of a prepared run: its batch script, sbatch, slurm.json.  A refusal
    (bad partition, time over the limit, no such gres) or an unreachable slurmctld is a
    UsageError of one line; a run directory made for it is removed."""
    import shutil

    from trainctl.hosts.slurm import queue as slurm
    from trainctl.store.paths import RunFiles

    cfg = dict(spec.slurm or {})
    try:
        limit = slurm.time_limit_s(cfg)
        cfg["warn"] = slurm.warn_seconds(cfg, limit)
        spec.slurm = cfg
        spec.save(RunFiles(run_dir).spec)
        slurm.write_batch_script(run_dir, cfg.get("setup", ""), cfg.get("nodes", 1))
        job_id = slurm.submit(slurm.sbatch_argv(cfg, run_dir, slurm.job_name(spec.job_name), cfg["warn"]))
    except (slurm.SlurmError, ValueError) as e:
        if created and not RunFiles(run_dir).events.exists():  # made for this run: no trace
            shutil.rmtree(run_dir, ignore_errors=True)
        raise UsageError(str(e)) from None
    slurm.add_job(run_dir, job_id)
    from trainctl.store.journal import Journal

    Journal(RunFiles(run_dir).events).close()  # empty until the agent begins: readers find it
    return job_id


def _agent_began_in(run_dir: Path, job: str) -> bool:
    """An agent of ``job`` began in ``run_dir`` (its agent.json names the job and its socket
    is there): it may still run, on a node this machine cannot reach or see the lock of."""
    from trainctl.hosts.where import agent_info
    from trainctl.store.paths import RunFiles

    return RunFiles(run_dir).sock.exists() and agent_info(run_dir).get("slurm_job") == job


class BetweenJobs:
    """Between two agents of a Slurm run: wait while its current job is queued or starting
    (saying PENDING and squeue's reason once per change); a job gone without ending the
    run ends the follow, saying how it ended."""

    def __init__(self, run_dir: Path, say: Callable[[str], None]) -> None:
        self.run_dir, self.say = run_dir, say
        self.last: str | None = None

    async def __call__(self, hello: dict) -> bool:
        from trainctl.hosts.slurm import queue as slurm

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
        if run_ended(self.run_dir):  # the agent's last events came after our look
            return True
        self.say(self._ended_without_agent(job, info, hello.get("state")))
        return False

    def _ended_without_agent(self, job: str, info, last: str | None) -> str:
        """The job that was to carry the run ended before its agent went on with it: nothing
        supervises the run now, whatever its journal's last state; where to look, how to go on."""
        from trainctl.hosts.here import self_command
        from trainctl.hosts.slurm import queue as slurm

        state = info.state if info else "gone from the queue"
        ended = (
            "was cancelled outside trainctl (scancel by someone else?)"
            if state.startswith("CANCELLED")
            else f"ended ({state})"
        )
        run_dir = shlex.quote(str(self.run_dir))
        return (
            f"Slurm job {job} {ended} before its agent went on with the run: no agent supervises "
            f"the run now (its journal's last state, {last}, is an earlier agent's); why: "
            f"{slurm.job_output(self.run_dir, job)}; where the run was: `{self_command()} attach "
            f"{run_dir}`{self._go_on()}"
        )

    def _go_on(self) -> str:
        """How the user goes on with the run: its next job submitted by hand (from the run's spec)."""
        from trainctl.hosts.slurm import queue as slurm
        from trainctl.store.paths import RunFiles
        from trainctl.store.spec import RunSpec

        try:
            spec = RunSpec.load(RunFiles(self.run_dir).spec)
        except (OSError, ValueError):
            return ""
        by_hand = slurm.sbatch_by_hand(dict(spec.slurm or {}), self.run_dir, slurm.job_name(spec.job_name))
        return f"; to go on with it: `{by_hand}`"

    def _say(self, text: str) -> None:
        if text != self.last:
            self.say(text)
            self.last = text


def run_ended(run_dir: Path) -> bool:
    from trainctl.client.connection import offline_hello
    from trainctl.core.recovery import FINAL_STATES

    return offline_hello(run_dir).get("state") in FINAL_STATES


def slurm_status(run_dir: Path) -> dict | None:
    """{"job", "jobs", "state", "reason"} of a Slurm run's current job; None for other runs."""
    from trainctl.hosts.slurm import queue as slurm

    jobs = slurm.read_jobs(run_dir)
    if not jobs:
        return None
    out: dict[str, Any] = {"job": jobs[-1], "jobs": jobs}
    try:
        info = slurm.job_info(jobs[-1])
    except slurm.SlurmError as e:
        out["error"] = str(e)
        return out
    if info is not None:
        out.update(
            state=info.state,
            reason=info.reason,
            partition=info.partition,
            node=info.node,
            time_limit_s=info.time_limit_s,
        )
    return out


def node_status(run_dir: Path) -> list[dict]:
    """The other nodes of a Slurm run of several nodes, from their run directories
    (``<run_dir>/node<N>``): ``{"node", "run_dir", "state", "attempt", "live", "ranks"}`` each;
    [] for any other run."""
    from trainctl.agent.adopt import agent_running
    from trainctl.agent.handlers import rank_status
    from trainctl.client.connection import offline_hello, offline_view
    from trainctl.hosts.slurm.nodes import node_dirs

    out = []
    for rank, path in node_dirs(run_dir):
        covered = offline_view(path)
        hello, view = offline_hello(path, covered), covered.view
        out.append(
            {
                "node": rank,
                "run_dir": str(path),
                "state": hello.get("state"),
                "attempt": hello.get("attempt"),
                "live": agent_running(path),
                "ranks": rank_status(view.rank_rows(), view.stuck_ranks) if view.ranks else {},
            }
        )
    return out


def cancel_waiting_job(run_dir: Path) -> str:
    """Stop a Slurm run with no agent to ask (none runs, or its node cannot be reached):
    `ctl RUN stop` and the dashboard's `s`.  scancel the run's job (marked as trainctl's: its
    agent, if one runs, ends the run STOPPED by the user) and, where no agent of the job
    began, end the run STOPPED in its journal (and its other nodes').  Blocks up to 30 s for the job to
    leave; its id.  UsageError (one line) when no job of the run waits or scancel fails."""
    from trainctl.agent.adopt import agent_running
    from trainctl.core import events as E
    from trainctl.core.recovery import RunState
    from trainctl.hosts.slurm import queue as slurm
    from trainctl.store.journal import Journal
    from trainctl.store.paths import RunFiles

    job = slurm.current_job(run_dir)
    if job is None or run_ended(run_dir):
        raise UsageError(f"{run_dir}: no Slurm job of this run is waiting")
    try:  # running: its agents (reached or not from here) say STOPPED themselves
        before = slurm.job_info(job)
        running = before is not None and before.state.split()[0] in ("RUNNING", "COMPLETING")
    except slurm.SlurmError:
        running = True  # Slurm does not say: a journal that may have a writer is left to it
    slurm.mark_cancel(run_dir, job)
    try:
        slurm.cancel(job)
    except slurm.SlurmError as e:
        raise UsageError(str(e)) from None
    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            info = slurm.job_info(job)
        except slurm.SlurmError:
            info = None
        if (info is None or info.ended) and not agent_running(run_dir):
            break
        time.sleep(0.3)
    from trainctl.hosts.slurm.nodes import node_dirs

    for path in [run_dir, *(p for _, p in node_dirs(run_dir))]:  # and a job's other nodes
        if run_ended(path) or (running and _agent_began_in(path, job)):
            continue  # its agent says STOPPED itself: a journal has one writer
        journal = Journal(RunFiles(path).events)
        try:
            journal.append(
                E.State(
                    time.time(),
                    RunState.STOPPED.value,
                    f"stopped by the user: Slurm job {job} cancelled before it ran",
                )
            )
        finally:
            journal.close()
    return job
