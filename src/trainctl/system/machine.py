"""This machine, as an agent says where it runs (agent.json): its Slurm node name and job,
its hostname and the kernel's boot id (what says "this machine": a Unix socket can be
connected from the same kernel only).  src/trainctl/hosts/where.py decides from it how a
client reaches an agent."""

from __future__ import annotations

import os
import socket
from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def where_i_run() -> dict:
    """What an agent writes in agent.json about its machine."""
    return {
        "node": os.environ.get("SLURMD_NODENAME", ""),
        "slurm_job": os.environ.get("SLURM_JOB_ID", ""),
        "hostname": socket.gethostname(),
        "boot_id": boot_id(),
        "tmux_socket": tmux_socket(),
    }


def tmux_socket() -> str:
    """The socket path of the tmux server this process runs in ($TMUX: path,pid,session),
    else ""."""
    return os.environ.get("TMUX", "").rpartition(",")[0].rpartition(",")[0]


def machine_id(gpu_name: str | None = None) -> str:
    """A stable name for this machine in the preset history: its hostname, and the GPU model
    when there is one (a node of a cluster is the same machine when its GPU is)."""
    host = socket.gethostname() or "localhost"
    return f"{host} ({gpu_name})" if gpu_name else host
