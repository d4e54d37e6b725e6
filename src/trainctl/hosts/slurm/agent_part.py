"""The agent's Slurm part, when it runs as a run's batch job (`trainctl agent RUN --slurm`).

- It says where it runs: the job, its node and partition, its time limit, and when the
  trainer will be asked to save before it.
- ``warn`` seconds before the job's end (its own timer, from the end Slurm gives; and the
  time-limit warning, sbatch ``--signal=B:USR1@N``, to this agent only: it is the batch
  shell, in case the end moves) the attempt ends as a ``suspend``: a planned save (the save-on-request
  protocol), the trainer stopped, then the next job is submitted ``--dependency=afterany``
  on this one, and the run is PENDING until that job's agent goes on from the save.
- At a SIGTERM from Slurm it asks Slurm why: a cancel by trainctl (``s`` on a pending run:
  the mark file) or by someone else (STOPPED, saying so), the time limit or a preemption
  (the next job is submitted, from the last good checkpoint).
- In a job of several nodes (src/trainctl/hosts/slurm/nodes.py) each node's agent does all of the above
  for its own ranks, but only the lead (node 0) submits the next job and writes slurm.json;
  each watches the others' journals: a node that ends the run (the lead FAILED or STOPPED,
  another node giving up or stopped) ends every node; the lead FINISHED ends the others
  once they had :data:`NODE_GRACE_S` to finish themselves.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import time
from collections.abc import Callable

from trainctl.agent.context import RunContext
from trainctl.agent.plug import AgentPlug, Attempts
from trainctl.core import events as E
from trainctl.core.recovery import FINAL_STATES, RunState
from trainctl.hosts.slurm import nodes as slurm_nodes
from trainctl.hosts.slurm import queue as slurm
from trainctl.hosts.slurm.next_job import gap_step, journal_gaps, submit_retrying  # (tests import them here)

WHY_TIMEOUT_S = 10.0
INFO_RETRY_S, INFO_RETRIES = 15.0, 40  # the job's time limit asked again for 10 min
NODE_WATCH_S = 2.0  # how often a node reads the other nodes' journals
NODE_GRACE_S = 30.0  # a node still running this long after the lead FINISHED is stopped
# a job started again after its node failed: how long the dead node's processes may still
# hold the run's locks (frozen or ending; a lock on shared storage until the server's lease ends)
TAKEOVER_WAIT_S = 120.0


class SlurmPart(AgentPlug):
    """The agent's plug (src/trainctl/agent/plug.py) in a Slurm batch job."""

    name = "slurm"
    takes_over_begun = True  # a next job's agent goes on with the run an earlier job began
    takeover_wait_s = TAKEOVER_WAIT_S  # a requeued job's node may have died holding them

    def __init__(self, node: slurm_nodes.NodePlace | None = None) -> None:
        self.node = node  # its place in a job of several nodes
        self.job_id = os.environ.get("SLURM_JOB_ID") or None
        self._why: asyncio.Future | None = None
        self._warned: asyncio.Future | None = None
        self.planned_end: float | None = None  # start + time limit, from Slurm at the start
        self.restarts = 0  # Slurm's requeue count at the start
        self.requeued = False  # Slurm requeues this job: no next job to submit
        self.preempted = False  # chosen for preemption: saved, awaiting the requeue
        self._preempt_watch: asyncio.Task | None = None
        self._info_retry: asyncio.Task | None = None  # the time limit asked again (kept: a task)
        self._node_watch: asyncio.Task | None = None
        self._gaps: list[float] = []  # measured gaps between the run's jobs
        self._pending_ts: float | None = None

    def attach(self, ctx: RunContext, attempts: Attempts) -> None:
        self.ctx, self.attempts = ctx, attempts
        self.lead_dir = self.node.lead_dir if self.node else ctx.files.dir  # the run's own directory
        self.started = ctx.clock()
        self.cfg = dict(ctx.spec.slurm or {})

    def signals(self) -> dict[int, Callable[[], None]]:
        """Slurm's time-limit warning (SIGUSR1), and its SIGTERM: asked why (:meth:`on_term`)."""
        return {signal.SIGUSR1: self.on_time_warning, signal.SIGTERM: self.on_term}

    async def begin(self) -> None:
        await self.describe()

    async def suspend(self) -> int | None:
        return await self.submit_next()

    def restarted(self) -> str:
        return os.environ.get("SLURM_RESTART_COUNT", "0")

    def killed_before(self) -> str | None:
        """In a Slurm job: the agent before this one in the same job was killed and its
        keeper (slurm-agent.sh) started this one, which adopts its trainer: said, and how."""
        value = os.environ.get(slurm.RESTARTED_ENV, "")
        try:
            count, sig, pid = (int(v) for v in value.split(":"))
        except ValueError:
            return None
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        said = (
            f"the agent before this one (pid {pid}) was killed ({name}); its keeper started "
            f"this one ({count} of {slurm.AGENT_RESTARTS} in Slurm job {self.job_id})"
        )
        self.ctx.info(
            said + ": it adopts the trainer, which went on meanwhile (what killed it? "
            "dmesg says when it was the OOM killer)",
            "slurm.agent_killed",
        )
        return said

    async def describe(self) -> None:
        """An info on where this job runs and its time limit (read from Slurm)."""
        if self.job_id is None:
            self.ctx.info(
                "started with --slurm outside a Slurm job (no SLURM_JOB_ID): no time-limit warning will come",
                "slurm.job",
            )
            return
        lead = self.node is None or self.node.lead  # a follower node's dir has no slurm.json
        if lead and self.job_id not in slurm.read_jobs(self.ctx.files.dir):  # submitted by hand
            slurm.add_job(self.ctx.files.dir, self.job_id)
        if self.node is not None:  # the nodes watch each other whatever Slurm says
            self._describe_nodes()
        aio = asyncio.get_running_loop()
        try:
            info = await aio.run_in_executor(None, slurm.job_info, self.job_id)
        except slurm.SlurmError as e:
            self.ctx.info(
                f"Slurm job {self.job_id}: {e}; asking again every {INFO_RETRY_S:.0f} s for its time limit",
                "slurm.job",
            )
            self._info_retry = asyncio.ensure_future(self._describe_later(self.job_id))
            return
        await self._take_info(info)

    async def _describe_later(self, job_id: str) -> None:
        """slurmctld did not answer at the start: the job's end (the save before it) is
        asked again in the background until it answers (the run goes on meanwhile)."""
        ctx = self.ctx
        for _ in range(INFO_RETRIES):
            await asyncio.sleep(INFO_RETRY_S)
            if ctx.requests.over:
                return
            try:
                info = await asyncio.get_running_loop().run_in_executor(None, slurm.job_info, job_id)
            except slurm.SlurmError:
                continue
            await self._take_info(info)
            return

    async def _take_info(self, info: slurm.JobInfo | None) -> None:
        limit = info.time_limit_s if info else None
        self.planned_end = info.end_ts if info else None
        self.restarts = info.restarts if info else 0
        if info is not None and limit and info.end_ts:
            await self._deadline_in_jobs(info, limit)
            if self.cfg.get("warn"):  # our own timer too: Slurm's warning may be a tick late
                due = max(0.0, info.end_ts - float(self.cfg["warn"]) - self.ctx.clock())
                asyncio.get_running_loop().call_later(due, self.save_before_the_end)
        if info is not None and info.partition:
            await self._watch_preemption(info.partition)
        warn = self.cfg.get("warn")
        text = (
            f"Slurm job {self.job_id} on {info.node if info else '?'} (partition "
            f"{info.partition if info else '?'}): time limit "
            + (f"{limit // 60} min {limit % 60} s" if limit else "none")
            + (
                f"; the trainer is asked to save {warn} s before it, and the run goes on in a next job"
                if warn and limit
                else ""
            )
        )
        self.ctx.info(text, "slurm.job")

    def _describe_nodes(self) -> None:
        node, lead = self.node, self.lead_dir
        assert node is not None  # describe() calls this in a job of several nodes only
        if not node.lead:
            others = f"the lead (node 0, which submits the next jobs) is {lead}"
        elif node.nnodes == 2:
            others = f"node 1 supervises its own in {lead}/node1"
        else:
            others = f"nodes 1-{node.nnodes - 1} supervise theirs in {lead}/node<N>"
        self.ctx.info(
            f"node {node.node_rank} of {node.nnodes} ({node.local_addr}): its ranks "
            f"here; rendezvous {node.endpoint}, id {node.rdzv_id}; {others}",
            "slurm.nodes",
        )
        self._node_watch = asyncio.ensure_future(self._watch_nodes())

    async def _watch_nodes(self) -> None:
        """Every :data:`NODE_WATCH_S`: the other nodes' last states since this agent began
        (their journals, read off the loop); a run ended on one node ends it here (see the
        module's doc)."""
        ctx, aio = self.ctx, asyncio.get_running_loop()
        finished_at: float | None = None
        while not ctx.requests.stop_requested.is_set():
            await asyncio.sleep(NODE_WATCH_S)
            if ctx.sm.state in (RunState.PENDING, *FINAL_STATES) or ctx.requests.ending is not None:
                return
            states = await aio.run_in_executor(None, self._node_states)
            why = None
            for rank, state in states.items():
                if state == "FINISHED" and rank == 0:
                    finished_at = finished_at or ctx.clock()
                    if ctx.clock() - finished_at >= NODE_GRACE_S:
                        why = f"the lead node finished the run {NODE_GRACE_S:.0f} s ago"
                elif state in ("FAILED", "STOPPED"):
                    why = f"node {rank} ended {state}"
            if why is not None:
                reason = f"{why}: every node of Slurm job {self.job_id} stops"
                ctx.info(reason, "slurm.nodes")
                ctx.requests.stop(reason)
                return

    def _node_states(self, since: float | None = None) -> dict[int, str]:
        """The other nodes' states written since ``since`` (default: this agent's start)."""
        assert self.node is not None  # only a job of several nodes watches the others
        return slurm_nodes.other_states(self.node, self.lead_dir, self.started if since is None else since)

    async def lead_goes_on(self) -> str | None:
        """A node whose own journal ended (STOPPED by a SIGTERM it could not explain, say)
        goes on while the lead's run does: the lead's state then, else None."""
        if self.node is None or self.node.lead:
            return None
        last = await asyncio.get_running_loop().run_in_executor(None, slurm_nodes.last_state, self.lead_dir)
        return last[0] if last is not None and last[0] not in FINAL_STATES else None

    async def _deadline_in_jobs(self, info: slurm.JobInfo, limit: int) -> None:
        """The projection: this job's work ends ``warn`` s before its end; each next job
        gives limit - warn s of work after the gap measured between the run's jobs (a
        PENDING state to the next job's first progress), else this job's own queue wait.
        The gaps so far are read from the journal off the loop (a long run's is big)."""
        warn = float(self.cfg.get("warn") or 0)

        gaps, self._pending_ts = await asyncio.get_running_loop().run_in_executor(
            None, journal_gaps, self.ctx.files.events
        )
        self._gaps = gaps + self._gaps
        proj = self.ctx.projector
        assert info.end_ts is not None  # _take_info calls this for a job with an end only
        proj.job_end = info.end_ts - warn
        proj.job_span_s = max(1.0, limit - warn)
        proj.job_gap_s = statistics.median(self._gaps) if self._gaps else (info.queued_s or 0.0)
        proj.job_gap_measured = bool(self._gaps)
        self.ctx.bus.on_journaled.append(self._gap_on)  # this job's first batch closes a gap

    def _gap_on(self, ev: E.Event) -> None:
        """A gap between jobs: from a PENDING state to the next job's first progress."""
        gap, self._pending_ts = gap_step(ev, self._pending_ts)
        if gap is not None:
            self._gaps.append(gap)
            self.ctx.projector.job_gap_s = statistics.median(self._gaps)
            self.ctx.projector.job_gap_measured = True

    def _say_retry(self, tries: int, error: str, wait: float) -> None:
        end = (
            time.strftime(" (the job ends at %H:%M:%S)", time.localtime(self.planned_end))
            if self.planned_end
            else ""
        )
        self.ctx.info(
            f"sbatch of the run's next job, try {tries}: {error}; trying again in {wait:.0f} s{end}",
            "slurm.submit_retry",
        )

    # ------------------------------------------------------------------ preemption
    async def _watch_preemption(self, partition: str) -> None:
        """A partition with a preemption GraceTime: Slurm sends nothing to a batch job when it
        chooses it (SIGTERM comes at the grace's end, to every process at once), so the
        agent looks every third of the grace (2 to 30 s) whether the job was chosen."""
        try:
            grace = await asyncio.get_running_loop().run_in_executor(None, slurm.grace_time_s, partition)
        except slurm.SlurmError:
            return
        if grace > 0:
            period = max(2.0, min(30.0, grace / 3))
            self._preempt_watch = asyncio.ensure_future(self._look_for_preemption(period, grace))

    async def _look_for_preemption(self, period: float, grace: int) -> None:
        ctx = self.ctx
        while not ctx.requests.over:
            await asyncio.sleep(period)
            info = await self._ask()
            if info is None or info.preempt_ts is None or info.state.split()[0] != "RUNNING":
                continue
            self.preempted = True
            end = info.end_ts or info.preempt_ts + grace
            at = time.strftime("%H:%M:%S", time.localtime(end))
            ctx.info(
                f"Slurm preempts job {self.job_id} (its partition's grace time: {grace} s, "
                f"until {at}): saving now; Slurm requeues the job and the run goes on there "
                "from this save",
                "slurm.preempted",
            )
            ctx.requests.suspend()
            return

    async def _await_requeue(self) -> None:
        """Preempted and saved: the job is requeued at the grace's end (a SIGTERM, whose why
        is asked); this agent waits for it (exiting first would end the job, not requeue it)."""
        info = await self._ask()
        wait = (info.end_ts - self.ctx.clock() if info and info.end_ts else 0.0) + 30.0
        deadline = self.ctx.clock() + max(30.0, wait)
        while self._why is None and self.ctx.clock() < deadline:
            await asyncio.sleep(0.5)
        if self._why is not None:
            await asyncio.wait({self._why}, timeout=WHY_TIMEOUT_S * 3)

    # ------------------------------------------------------------------ signals
    def on_time_warning(self) -> None:
        if self._warned is None:
            self._warned = asyncio.ensure_future(self._save_near_the_end())

    def save_before_the_end(self) -> None:
        """The agent's own timer, ``warn`` s before the end read at the start: the save now,
        without asking Slurm again (slurmctld may not answer just then; a warning that came
        early may be waiting on scontrol)."""
        ctx = self.ctx
        if ctx.requests.over:
            return
        ctx.info(
            f"Slurm job {self.job_id}'s time limit is near: saving, then the run goes on in a next job",
            "slurm.time_limit",
        )
        ctx.requests.suspend()

    async def _save_near_the_end(self) -> None:
        """Slurm's timer ticks every 30 s, so its warning comes early or late by up to that:
        the save is asked ``warn`` seconds before the job's end time (read from scontrol; the
        agent's own timer fires then too), not at once; at once when the end cannot be read."""
        ctx = self.ctx
        warn = float(self.cfg.get("warn") or 0)
        try:
            info = (
                await asyncio.wait_for(
                    asyncio.get_running_loop().run_in_executor(None, slurm.job_info, self.job_id),
                    WHY_TIMEOUT_S,
                )
                if self.job_id
                else None
            )
        except (TimeoutError, slurm.SlurmError):
            info = None
        if info is not None and info.preempt_ts is not None:  # preempt_send_user_signal
            self.preempted = True  # Slurm requeues it: no next job, the save at once
            info = None
        wait = (info.end_ts - warn - ctx.clock()) if info and info.end_ts else 0.0
        if wait > 1:
            at = time.strftime("%H:%M:%S", time.localtime(ctx.clock() + wait))
            ctx.info(
                f"Slurm's time-limit warning for job {self.job_id} came {wait:.0f} s early "
                f"(its timer ticks every 30 s): the save is asked at {at}",
                "slurm.time_limit",
            )
            stop = asyncio.ensure_future(ctx.requests.stop_requested.wait())
            await asyncio.wait({stop}, timeout=wait)
            stop.cancel()
        self.save_before_the_end()

    def on_term(self) -> None:
        """Slurm ends the job (scancel, the time limit, a preemption): first hold every
        restart (the trainer got the same SIGTERM), then ask Slurm why."""
        if self._why is None:
            self._why = asyncio.ensure_future(self._find_why())
        self.ctx.requests.hold(self._why)

    async def _ask(self) -> slurm.JobInfo | None:
        if self.job_id is None:
            return None
        try:
            return await asyncio.wait_for(
                asyncio.get_running_loop().run_in_executor(None, slurm.job_info, self.job_id), WHY_TIMEOUT_S
            )
        except (TimeoutError, slurm.SlurmError):
            return None

    async def _find_why(self) -> None:
        ctx = self.ctx
        info = await self._ask()
        for _ in range(4):  # a requeue shows COMPLETING for a moment, then PENDING
            if info is None or info.state.split()[0] != "COMPLETING" or info.restarts > self.restarts:
                break
            await asyncio.sleep(0.5)
            info = await self._ask()
        state = info.state.split()[0] if info else "?"
        if info is None and self.node is not None and not self.node.lead:
            state = await self._lead_says(ctx.clock())
        if (
            state == "REQUEUED"
            or info is not None
            and (
                info.restarts > self.restarts
                or state in ("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "PREEMPTED", "NODE_FAIL")
            )
        ):
            ctx.info(
                f"Slurm requeues job {self.job_id} (a preemption, a node failure or `scontrol "
                "requeue`): the run goes on when it starts again, from its last good "
                "checkpoint",
                "slurm.requeued",
            )
            self.requeued = True
            ctx.requests.ends_suspended()
            return
        if state == "COMPLETING":
            # scontrol says COMPLETING while the job's processes (this agent) end: before the
            # end its time limit set (read when it started) that is a scancel, after it the limit
            past = self.planned_end is not None and ctx.clock() >= self.planned_end - 5
            state = "TIMEOUT" if past else "CANCELLED"
        if state in ("TIMEOUT", "DEADLINE") and not ctx.requests.stop_requested.is_set():
            ctx.info(
                f"Slurm ends job {self.job_id} ({state}) before a save: the run goes on in a "
                "next job from its last good checkpoint",
                "slurm.ended",
            )
            ctx.requests.ends_suspended()
            return
        if self.job_id and slurm.cancel_was_ours(self.lead_dir, self.job_id):
            reason = f"stopped by the user (Slurm job {self.job_id} cancelled by trainctl)"
        elif state == "CANCELLED":
            reason = (
                f"Slurm job {self.job_id} was cancelled outside trainctl (scancel by "
                "someone else, or an administrator)"
            )
        elif state in FINAL_STATES:  # a node's: the lead's end, which Slurm did not say
            reason = f"Slurm ends job {self.job_id}; its lead (node 0) ended {state}"
        else:
            reason = f"the agent got SIGTERM (Slurm job {self.job_id} is {state}); stopped"
        ctx.info(reason, "slurm.cancelled" if state == "CANCELLED" else "slurm.ended")
        ctx.requests.ends_stopped(reason)

    async def _lead_says(self, since: float) -> str:
        """Slurm did not say why it ends this node's part of the job (seen in a requeue: the
        job between two states): what the lead (which asked too) made of it, within
        :data:`WHY_TIMEOUT_S` -- REQUEUED when the run goes on (PENDING), its final state when
        it ends, else "?"."""
        aio = asyncio.get_running_loop()
        end = self.ctx.clock() + WHY_TIMEOUT_S
        while self.ctx.clock() < end:
            state = (await aio.run_in_executor(None, self._node_states, since - 1.0)).get(0)
            if state == "PENDING":
                return "REQUEUED"
            if state in FINAL_STATES:
                return state
            await asyncio.sleep(0.5)
        return "?"

    # ------------------------------------------------------------------ the next job
    async def submit_next(self) -> int:
        """The run goes on in a next job, queued after this one: PENDING, exit 0 (this job
        ends cleanly).  An unreachable slurmctld is tried again until the job's end is near,
        then the run stays PENDING saying the sbatch to run by hand; a refusal ends it FAILED."""
        ctx = self.ctx
        ctx.save_detector_state()
        if self.preempted and not self.requeued:
            await self._await_requeue()
            if ctx.requests.stop_requested.is_set():  # cancelled instead (PreemptMode=CANCEL, scancel)
                return self.attempts.stopped(ctx.requests.stop_reason or "stopped")
        if self.requeued:  # the same job starts again: nothing to submit
            ctx.set_state(
                RunState.PENDING, f"Slurm job {self.job_id} is requeued; the run goes on when it starts again"
            )
            return 0
        if self.node is not None and not self.node.lead:  # the lead submits it, for every node
            ctx.set_state(
                RunState.PENDING,
                f"node {self.node.node_rank} saved; the lead (node 0) "
                "submits the next Slurm job, where this node goes on",
            )
            return 0
        name = slurm.job_name(ctx.spec.job_name)
        argv = slurm.sbatch_argv(self.cfg, ctx.files.dir, name, self.cfg.get("warn"), dependency=self.job_id)
        try:
            next_id = await submit_retrying(
                argv,
                ctx.clock,
                self.planned_end,
                self._say_retry,
                gave_up=lambda: self._why is not None,
                queued=(lambda: slurm.queued_after(self.job_id, name)) if self.job_id else None,
            )
        except slurm.SlurmUnreachable as e:
            by_hand = slurm.sbatch_by_hand(self.cfg, ctx.files.dir, name)
            ctx.set_state(
                RunState.PENDING,
                (
                    f"no next Slurm job: {e}, until job {self.job_id} ended; nothing is lost (the run "
                    f"goes on from its last good checkpoint): submit its next job with `{by_hand}`"
                ),
            )
            return 0
        except slurm.SlurmError as e:
            ctx.set_state(RunState.FAILED, f"could not submit the run's next Slurm job: {e}")
            return 1
        slurm.add_job(ctx.files.dir, next_id)
        ctx.info(
            f"submitted Slurm job {next_id} (after job {self.job_id}): it goes on from the "
            f"last good checkpoint",
            "slurm.next",
        )
        ctx.set_state(RunState.PENDING, f"Slurm job {next_id} is queued; the run goes on there")
        return 0
