"""`trainctl agent RUN_DIR` (hidden): the agent of one run, in this process; what `run`
starts in tmux or detached, and a Slurm batch job runs on its nodes."""

from __future__ import annotations

import contextlib
import os
import subprocess

from trainctl.cli.common import UsageError, printer
from trainctl.hosts.detached import run_agent


def cmd_agent(args) -> int:
    from trainctl.store.paths import RunFiles, trusted_run_dir
    from trainctl.store.spec import RunSpec

    if getattr(args, "env_from", None):  # before anything reads a directory from the env
        _take_callers_env(args.env_from)
    try:  # the agent runs what spec.json says: only from a directory of the user's own
        files = RunFiles(trusted_run_dir(args.run_dir))
        spec = RunSpec.load(files.spec)
    except (OSError, ValueError) as e:
        raise UsageError(f"{args.run_dir}: {e}") from None
    plug = None  # what the host adds to the agent (src/trainctl/agent/plug.py)
    if getattr(args, "slurm", False):
        from trainctl.hosts.slurm.agent_part import SlurmPart

        node, files, spec = _slurm_node(files, spec)
        plug = SlurmPart(node)
    print(
        f"trainctl agent for {spec.job_name} — run directory {files.dir}\n"
        f"dashboard: trainctl attach {files.dir}",
        flush=True,
    )
    code = run_agent(files.dir, spec, printer(args.json), adopt=getattr(args, "adopt", False), plug=plug)
    if code in RUN_ENDED_CODES:
        _close_own_pane()
    return code


def _take_callers_env(fifo: str) -> None:
    """The environment of the shell that ran `trainctl run` (or the `attach` that started
    this agent), handed over a FIFO: this agent's, and so its trainers'."""
    from pathlib import Path

    from trainctl.hosts import env_handover

    try:
        env_handover.take(env_handover.receive(Path(fifo)))
    except (OSError, env_handover.HandoverError) as e:
        raise UsageError(f"the caller's environment: {e}") from None


RUN_ENDED_CODES = (0, 1, 130)
"""The agent's exit codes of a run that ended (FINISHED, FAILED, STOPPED): its journal says
all; any other (refused, supervision lost) keeps its tmux pane for reading."""


def _close_own_pane() -> None:
    """The agent in tmux (`trainctl run`), its run ended: its pane goes with it, not kept
    dead (remain-on-exit), so ended runs' sessions do not pile up."""
    pane = os.environ.get("TMUX_PANE")
    if not (os.environ.get("TRAINCTL_TMUX_SESSION") and os.environ.get("TMUX") and pane):
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):  # $TMUX names the server
        subprocess.run(
            ["tmux", "set-option", "-w", "-t", pane, "remain-on-exit", "off"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=10,
            check=False,
        )


def _slurm_node(files, spec):
    """A Slurm job of several nodes: this agent's place (src/trainctl/hosts/slurm/nodes.py); node N > 0
    supervises in its own run directory, <run_dir>/node<N>; every node's torchrun joins the
    job's rendezvous.  (None, files, spec) for a job of one node."""
    from trainctl.core.torchrun import across_nodes, is_torchrun
    from trainctl.hosts.slurm import nodes as slurm_nodes
    from trainctl.hosts.slurm import queue as slurm
    from trainctl.store.paths import RunFiles

    try:
        node = slurm_nodes.place(files.dir)
        if node is None:
            return None, files, spec
        if not is_torchrun(spec.command):
            raise UsageError(
                f"a Slurm job of {node.nnodes} nodes runs a torchrun command on each "
                '(kind = "torchrun"); this run\'s command is not one'
            )
        if not node.lead:
            path, spec = slurm_nodes.prepare_node_dir(files.dir, node.node_rank)
            files = RunFiles(path)
    except (slurm.SlurmError, OSError, ValueError) as e:
        raise UsageError(f"Slurm node {os.environ.get('SLURM_NODEID', '?')}: {e}") from None
    spec.command = across_nodes(
        spec.command, node.nnodes, node.node_rank, node.endpoint, node.rdzv_id, node.local_addr
    )
    return node, files, spec
