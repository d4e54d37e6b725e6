"""This machine: the runs whose run directory is here (the runs directory, the ones started
elsewhere with `--run-dir`, the Slurm queue's: their run directories are here too), summed
up with their agent's liveness (its lock), reached through the run directory's socket
(hosts/where.py; a Slurm run's agent is the Slurm host's, hosts/slurm/host.py)."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from trainctl.core.recovery import FINAL_STATES
from trainctl.core.usage import UsageError
from trainctl.hosts.base import Launched, LaunchRequest
from trainctl.hosts.here import resolve_run_dir, self_command
from trainctl.store.paths import trusted_run_dir
from trainctl.store.spec import RunSpec

if TYPE_CHECKING:
    from trainctl.store.listing import JournalFold


class LocalHost:
    """Runs whose agent runs on this machine."""

    where = "local"

    def launch(self, request: LaunchRequest) -> Launched:
        """Prepare the run here (the CLI's spec builder) and start its agent: in this
        process when the run is followed in the foreground (`--json`, `--headless`: the
        CLI runs ``run_here``), else detached, in tmux when there (hosts/detached.py).  A
        run refused before it began leaves no run directory it made."""
        from trainctl.agent.prepare import link_latest
        from trainctl.hosts.detached import agent_answers, never_began, run_agent, start_detached_agent

        if request.prepare is None:
            raise UsageError("a run here is prepared on this machine: no spec builder given")
        run_dir, spec, created = request.prepare()
        if request.foreground:

            def run_here(printer) -> int:
                # `latest` names the run once the job is its own: a refused run never touches it.
                code = run_agent(run_dir, spec, printer, on_locked=lambda: link_latest(run_dir))
                if code == 2 and created and never_began(run_dir):  # another run won: no trace
                    shutil.rmtree(run_dir, ignore_errors=True)
                return code

            return Launched(str(run_dir), f"trainctl: run directory {run_dir}", run_here=run_here)
        try:
            where = start_detached_agent(run_dir, spec, use_tmux=request.use_tmux)
        except UsageError:
            if created and never_began(run_dir):  # refused before it began: leave no trace
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
        link_latest(run_dir)
        # said after the dashboard: while it ran the line was hidden, and for a run that
        # has ended it is no longer true
        return Launched(
            str(run_dir),
            "",
            detached=f"trainctl: {where}\ntrainctl: run directory {run_dir}",
            after=lambda: f"trainctl: {where}" if agent_answers(run_dir) else "",
        )

    def locate(self, target: str | None) -> str:
        return str(resolve_run_dir(target))

    def adopt(self, run_dir: str, say) -> bool:
        from trainctl.hosts.detached import adopt_if_orphaned

        return adopt_if_orphaned(Path(run_dir), say)

    def client_factory(self, run_dir: str):
        from trainctl.client.connection import AgentClient
        from trainctl.hosts.where import transport_for

        return lambda: AgentClient(transport_for(run_dir))

    def runs(self, folds: dict | None = None, ended_slurm: bool = True) -> list[dict]:
        from trainctl.hosts.slurm.host import queued_slurm_runs
        from trainctl.store.listing import run_dirs

        return [
            dict(summarize(d, folds=folds, ended_slurm=ended_slurm), where="local")
            for d in run_dirs(queued_slurm_runs())
        ]

    def waits_in_queue(self, run_dir: str) -> bool:
        return False  # a run here starts at once (its agent answers, or adoption takes it)

    def cancel_waiting(self, run_dir: str) -> str:
        raise UsageError(f"{run_dir}: no Slurm job of this run is waiting")

    def queue_status(self, run_dir: str) -> dict | None:
        return None  # a run here waits in no queue

    def node_status(self, run_dir: str) -> list[dict]:
        return []

    def between_agents(self, run_dir: str, say):
        """Wait while an agent adopts the run (hosts/detached.py's Adopting)."""
        from trainctl.hosts.detached import Adopting

        return Adopting(Path(run_dir))

    def url(self, run_dir: str) -> str:
        return str(run_dir)

    def attach_hint(self, run_dir: str) -> str:
        return f"{self_command()} attach {shlex.quote(str(run_dir))}"


def claim(target: str) -> LocalHost | None:
    """A run directory (a path), ``local:`` (`trainctl run` here): this machine's, the
    last host asked."""
    return None if "://" in target else LocalHost()


def summarize(
    run_dir: Path,
    with_slurm: bool = True,
    folds: dict[str, JournalFold] | None = None,
    ended_slurm: bool = True,
) -> dict:
    """One run as `trainctl ls` shows it: ``run_dir``, ``job``, ``state`` (and its
    ``reason``), ``live``, ``host``, ``started``, ``progress`` ({epoch, epochs, batch,
    batches}), ``eta`` (and the deadline's ``buffer_s``), ``incident`` ({ts, text}), and for
    a Slurm run ``slurm`` ({job, state, reason, partition}).  ``folds`` (run directory -> JournalFold), kept by a caller that asks
    again (the dashboard, every few seconds): only the journal lines written since are read.
    ``ended_slurm=False``: no scontrol for a Slurm run whose journal has ended (its job's
    state and partition left out), for a caller that asks every few seconds."""
    from trainctl.agent.adopt import agent_running  # not on `trainctl run`'s path
    from trainctl.hosts.slurm import queue as slurm
    from trainctl.store.listing import LIVE, UNREADABLE, JournalFold

    run_dir = Path(run_dir)
    out: dict = {
        "run_dir": str(run_dir),
        "job": run_dir.name,
        "state": "UNKNOWN",
        "live": False,
        "host": "",
        "started": None,
        "progress": None,
        "eta": None,
        "incident": None,
        "reason": "",
        "buffer_s": None,
    }
    try:  # another user's directory, or a spec that is not one: listed, never read further
        trusted_run_dir(run_dir)
        spec = RunSpec.load(run_dir / "spec.json")
        out.update(
            job=spec.job_name, host=spec.host, started=(run_dir / "spec.json").stat().st_mtime
        )  # a queued run's: submitted
    except FileNotFoundError:
        pass  # its journal alone says what it is
    except (OSError, ValueError) as e:
        return {
            **out,
            "state": UNREADABLE,
            "reason": " ".join(str(e).split()),
            "incident": {"ts": None, "text": f"unreadable: {' '.join(str(e).split())}"},
        }
    fold = folds.setdefault(str(run_dir), JournalFold()) if folds is not None else JournalFold()
    out.update(fold.advance(run_dir / "events.jsonl"))
    out["live"] = agent_running(run_dir)
    if not out["live"] and out["state"] in LIVE:  # its agent gone: does its trainer run on?
        from trainctl.holder.handle import live_trainer

        if (st := live_trainer(run_dir)) is not None:
            out["trainer_pid"], out["unsupervised"] = st["pid"], not st["holder_alive"]
    if with_slurm and slurm.read_jobs(run_dir):
        job = slurm.current_job(run_dir)
        assert job is not None  # read_jobs() just gave some
        sl: dict = {"job": job, "jobs": slurm.read_jobs(run_dir)}
        info = None
        if ended_slurm or out["state"] not in FINAL_STATES:
            try:
                info = slurm.job_info(job)
            except slurm.SlurmError as e:
                sl["error"] = str(e)
        if info is not None:
            sl.update(state=info.state, reason=info.reason, partition=info.partition, node=info.node)
            if info.state == "PENDING" and out["state"] not in FINAL_STATES:
                out["state"] = "PENDING"
            if info.state.split()[0] == "RUNNING" and not out["live"]:
                # its agent runs on a node whose agent.lock this machine may not see
                from trainctl.hosts.where import agent_info

                out["live"] = agent_info(run_dir).get("slurm_job") == job
        out["slurm"] = sl
    return out
