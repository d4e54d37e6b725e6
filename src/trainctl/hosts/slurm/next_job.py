"""The run's next Slurm job, as the agent's Slurm part (src/trainctl/hosts/slurm/agent_part.py)
submits it: sbatch tried again while slurmctld does not answer, and the gaps measured
between a run's jobs (what the projection counts between two jobs' work)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from trainctl.core import events as E
from trainctl.hosts.slurm import queue as slurm
from trainctl.store.journal import read_events


def gap_step(ev: E.Event, pending: float | None) -> tuple[float | None, float | None]:
    """One event of the gaps between a run's jobs (a PENDING state to the next job's first
    progress): (a gap it closes or None, the PENDING time still open)."""
    if isinstance(ev, E.State) and ev.state == "PENDING":
        return None, ev.ts
    if isinstance(ev, E.Progress) and pending is not None:
        return ev.ts - pending, None
    return None, pending


def journal_gaps(events: Path) -> tuple[list[float], float | None]:
    """The gaps between the run's jobs so far, read from its journal (a long run's is big:
    the agent reads it off the loop), and the PENDING time still open."""
    gaps: list[float] = []
    pending: float | None = None
    try:
        for ev in read_events(events):
            gap, pending = gap_step(ev, pending)
            if gap is not None:
                gaps.append(gap)
    except OSError:
        pass
    return gaps, pending


async def submit_retrying(
    argv: list[str],
    clock,
    end: float | None,
    say,
    *,
    gave_up=lambda: False,
    submit=slurm.submit,
    sleep=asyncio.sleep,
    queued=None,
    cancel=slurm.cancel,
) -> str:
    """sbatch, tried again (bounded, with backoff: ``slurm.submit_retry_wait``) while
    slurmctld does not answer, each failure said (``say(tries, error, wait)``).  The job id;
    SlurmUnreachable once no try is left (the job's end is near, or ``gave_up()``: Slurm
    ends the job); a refusal (SlurmError) at once.  A try that timed out may still have
    queued the job (slurmctld took it, then answered late): before each try again and
    after one gets through, ``queued()`` (the jobs already queued after this one) is
    asked; the first queued is the next job, any later one is cancelled."""
    aio = asyncio.get_running_loop()

    async def already() -> list[str]:
        try:
            return await aio.run_in_executor(None, queued) if queued is not None else []
        except slurm.SlurmError:
            return []

    tries = 0
    while True:
        tries += 1
        found = await already() if tries > 1 else []
        try:
            new = (
                found[0]
                if found
                else await aio.run_in_executor(None, submit, argv, slurm.submit_timeout(clock(), end))
            )
        except slurm.SlurmUnreachable as e:
            wait = slurm.submit_retry_wait(tries, clock(), end)
            if wait is None or gave_up():
                raise slurm.SlurmUnreachable(f"slurmctld did not answer {tries} sbatch tries ({e})") from None
            say(tries, str(e), wait)
            await sleep(wait)
            continue
        if tries == 1:
            return new
        ids = sorted(set(await already()) | {new}, key=int)  # one next job: the first
        for extra in ids[1:]:
            try:
                await aio.run_in_executor(None, cancel, extra)
            except slurm.SlurmError:
                pass
        return ids[0]
