"""The status builder: one run's status as a dict (what `trainctl status --json` prints): the
agent's own reply when it answers, else assembled from the run directory (its snapshot and
journal, a trainer living on under its holder, its queued job as its host says); and for a
Slurm job of several nodes, the other nodes' agents and their ranks (the host's
``queue_status`` and ``node_status``).  `trainctl status`
(src/trainctl/cli/status.py) prints it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunStatus:
    status: dict  # what `status --json` prints
    code: int  # 0, else the exit code of an agent there that did not answer (4)
    agent: str  # the agent, in words ("agent live", "agent not running", ...)
    error: Exception | None  # why that agent did not answer; None when it did, or none runs


async def one_command(
    run_dir: Path | str, name: str, timeout: float | None = None, client: Callable | None = None, **kw
) -> dict:
    """One command's reply; AgentUnavailable when no agent runs, AgentNotResponding when
    it does not answer the hello (a few seconds) or the command (``timeout``).  ``client``:
    the run's host's client factory (default: the host the registry picks for the run
    directory)."""
    from trainctl.client.connection import COMMAND_TIMEOUT_S
    from trainctl.hosts.registry import client_for

    agent = client() if client is not None else client_for(run_dir)
    try:
        await agent.connect(since=10**12)
        return await agent.command(name, timeout=timeout or COMMAND_TIMEOUT_S, **kw)
    finally:
        await agent.close()


def run_status(run_dir: Path | str, host=None) -> RunStatus:
    """The agent's status, else the run directory's (``code`` 4, after the run directory's,
    when the agent is there but does not answer).  ``host``: the run's (default: the one
    the registry picks for the run directory); it reaches the agent and says what it knows
    of the run besides (a Slurm run's job and other nodes)."""
    from trainctl.client.connection import AgentNotResponding, AgentUnavailable
    from trainctl.hosts.registry import host_for

    host = host or host_for(str(run_dir))
    run_dir = Path(run_dir)
    code, agent, error = 0, "agent live", None
    try:
        reply = asyncio.run(
            one_command(run_dir, "status", timeout=10.0, client=host.client_factory(str(run_dir)))
        )
        status = reply.get("result") or {}
        status["live"] = True
    except (AgentUnavailable, OSError) as e:
        from trainctl.hosts.where import AgentUnreachable

        agent = "agent not running"
        if isinstance(e, (AgentNotResponding, AgentUnreachable)):
            error = e
            code, agent = (
                e.exit_code,
                (
                    "agent not responding"
                    if isinstance(e, AgentNotResponding)
                    else "agent's node not reachable"
                )
                + "; from its journal",
            )
        status, agent = _from_run_dir(run_dir, code, agent, host)
    _add_nodes(host.node_status(str(run_dir)), status)
    return RunStatus(status, code, agent, error)


def _from_run_dir(run_dir: Path, code: int, agent: str, host) -> tuple[dict, str]:
    """(status, the agent in words) from the run directory, with no agent to ask."""
    from trainctl.client.connection import offline_hello, offline_view
    from trainctl.core import events as E

    covered = offline_view(run_dir)  # its snapshot, then the journal after it
    status = offline_hello(run_dir, covered)  # job, preset, attempt and state
    status.pop("op", None)
    status.pop("ok", None)
    view = covered.view
    if view.projection is not None:
        status["projection"] = E.to_dict(view.projection)
    if view.progress is not None:
        status["progress"] = E.to_dict(view.progress)
    status["save_dir"] = view.save_dir
    status["env"] = list(view.env)  # the trainer's variables' names, never their values
    if view.resumed is not None:
        status["resumed"] = view.resumed
    status["goodput"] = view.goodput.totals()  # no agent: up to the journal's last event
    if view.unreadable:
        status["unreadable"] = view.unreadable  # journal lines skipped: not whole, well-typed events
    if view.ranks:
        from trainctl.agent.handlers import rank_status

        status["ranks"] = rank_status(view.rank_rows(), view.stuck_ranks)
    if code:
        status["responding"] = False
    from trainctl.holder.handle import live_trainer

    if code == 0 and (st := live_trainer(run_dir)) is not None:  # agent gone, trainer not
        status["trainer"] = {
            "pid": st["pid"],
            "attempt": st.get("attempt"),
            "holder_alive": st["holder_alive"],
        }
        agent = (
            f"agent not running; its trainer (pid {st['pid']}) runs on "
            f"{'under its holder' if st['holder_alive'] else 'unsupervised, its holder gone too'}: "
            f"`trainctl attach {run_dir}` adopts it, `trainctl ctl {run_dir} stop` stops it"
        )
    from trainctl.core.recovery import FINAL_STATES as _FINAL

    sl = host.queue_status(str(run_dir))
    if sl is not None:
        status["slurm"] = sl
        if status.get("state") not in _FINAL and sl.get("state") == "PENDING":
            status["state"] = "PENDING"
    return status, agent


def _add_nodes(nodes: list[dict], status: dict) -> None:
    if nodes:  # a Slurm job of several nodes: the others' agents, and their ranks in the run's
        status["nodes"] = nodes
        ranks = status.setdefault("ranks", {})
        for node in nodes:
            for r, row in node["ranks"].items():
                ranks.setdefault(r, row)
        status["ranks"] = dict(sorted(ranks.items(), key=lambda kv: int(kv[0])))
