"""A Slurm job of several nodes (``[slurm] nodes > 1``, a torchrun job): one agent per node.

The batch script starts ``srun --nodes=N --ntasks=N --ntasks-per-node=1`` of ``trainctl agent
RUN --slurm``; each agent learns its place here (:func:`place`): its node rank
(SLURM_NODEID), the number of nodes (SLURM_JOB_NUM_NODES), and the rendezvous endpoint on
the allocation's first node: that node's address as Slurm knows it (its NodeAddr: a node's
name need not resolve), and the port the batch script found free there
(``TRAINCTL_RDZV_PORT``).  The rendezvous id is the job's (``slurm-<job id>``): every node of
one job, and every restart inside it, meets the same one.

Node 0 is the lead: the run directory is its own, with the run's journal, slurm.json and
the jobs it submits.  Node N > 0 supervises its ranks in its own run directory inside the
lead's, ``<run_dir>/node<N>`` (job name ``JOB-node<N>``: its own locks and socket), the same
one in every job of the run.  The nodes learn of each other's end through each other's
journals (:func:`last_state`), on the storage they share.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainctl.hosts.slurm import queue as slurm
from trainctl.store.paths import RunFiles, copy_private, make_private_dir
from trainctl.store.spec import RunSpec

PORT_ENV = slurm.PORT_ENV
_NODE_DIR = re.compile(r"node(\d+)\Z")
_TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class NodePlace:
    """Where this agent's node sits in its job."""

    node_rank: int
    nnodes: int
    job_id: str
    endpoint: str  # HOST:PORT of the rendezvous, on the allocation's first node
    local_addr: str  # this node's address (its NodeAddr)
    lead_dir: Path  # the run directory (node 0's)

    @property
    def lead(self) -> bool:
        return self.node_rank == 0

    @property
    def rdzv_id(self) -> str:
        return f"slurm-{self.job_id}"

    @property
    def run_dir(self) -> Path:
        return self.lead_dir if self.lead else node_dir(self.lead_dir, self.node_rank)


def node_dir(lead_dir: Path, rank: int) -> Path:
    return Path(lead_dir) / f"node{rank}"


def node_dirs(lead_dir: Path) -> list[tuple[int, Path]]:
    """The other nodes' run directories of a run, by node rank."""
    out = []
    try:
        for p in Path(lead_dir).iterdir():
            m = _NODE_DIR.match(p.name)
            if m and (p / "spec.json").is_file():
                out.append((int(m.group(1)), p))
    except OSError:
        pass
    return sorted(out)


def first_host(hostnames: str) -> str:
    """The first name `scontrol show hostnames NODELIST` prints: the allocation's first node
    (the batch script's, where the rendezvous is)."""
    for line in hostnames.splitlines():
        if line.strip():
            return line.strip()
    raise ValueError("scontrol show hostnames printed no node")


def node_addr(show_node: str, name: str) -> str:
    """A node's address from `scontrol -o show node NAME`: its NodeAddr (what slurmctld
    reaches it by), else its name."""
    m = re.search(r"(?:^|\s)NodeAddr=(\S+)", show_node)
    return m.group(1) if m and m.group(1) not in ("(null)", "") else name


def _scontrol(*args: str) -> str:
    r = slurm._run(["scontrol", *args])
    if r.returncode != 0:
        raise slurm._why(r, "scontrol " + " ".join(args))
    return r.stdout


def place(lead_dir: Path, env: Mapping[str, str] | None = None) -> NodePlace | None:
    """This agent's place in a job of several nodes (None for a job of one node).
    SlurmError (one line) when Slurm cannot say, or the batch script set no port."""
    env = os.environ if env is None else env
    try:
        nnodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)
    except ValueError:
        nnodes = 1
    if nnodes <= 1:
        return None
    job_id = env.get("SLURM_JOB_ID", "")
    rank, port = env.get("SLURM_NODEID", ""), env.get(PORT_ENV, "")
    if not rank.isdigit() or not port.isdigit() or not job_id:
        raise slurm.SlurmError(
            f"a job of {nnodes} nodes needs SLURM_JOB_ID, SLURM_NODEID and "
            f"{PORT_ENV} (set by the run's batch script, under its srun)"
        )
    first = first_host(_scontrol("show", "hostnames", env.get("SLURM_JOB_NODELIST", "")))
    here = env.get("SLURMD_NODENAME") or first
    first_addr = node_addr(_scontrol("-o", "show", "node", first), first)
    local = first_addr if here == first else node_addr(_scontrol("-o", "show", "node", here), here)
    return NodePlace(int(rank), nnodes, job_id, f"{first_addr}:{port}", local, Path(lead_dir))


def prepare_node_dir(lead_dir: Path, rank: int) -> tuple[Path, RunSpec]:
    """Node ``rank``'s run directory and spec: made from the lead's on the first job (its
    presets copied: a fallback switches there too), kept as it is in the next ones."""
    lead, path = RunFiles(lead_dir), node_dir(lead_dir, rank)
    files = RunFiles(path)
    make_private_dir(path)
    if files.spec.is_file():
        return path, RunSpec.load(files.spec)
    spec = RunSpec.load(lead.spec)
    spec.job_name = f"{spec.job_name}-node{rank}"
    make_private_dir(files.presets)
    for p in lead.presets.glob("*.toml"):
        if not (files.presets / p.name).exists():
            copy_private(p, files.presets / p.name)
    if lead.job.is_file() and not files.job.exists():
        copy_private(lead.job, files.job)
    spec.save(files.spec)
    return path, spec


def other_states(node: NodePlace, lead_dir: Path, since: float) -> dict[int, str]:
    """The other nodes' states written since ``since`` (their journals' ends): the lead's
    for a node, every node's for the lead."""
    dirs = [(0, lead_dir)] if not node.lead else node_dirs(lead_dir)
    out = {}
    for rank, path in dirs:
        last = last_state(path)
        if last is not None and last[1] >= since:
            out[rank] = last[0]
    return out


def last_state(run_dir: Path) -> tuple[str, float] | None:
    """The last state in a run's journal and when it was written, read from its end (a
    node's agent asks every few seconds: never the whole journal); None without one."""
    import json

    try:
        with open(Path(run_dir) / "events.jsonl", "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _TAIL_BYTES))
            tail = f.read()
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        if b'"state"' not in line:
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict) and ev.get("type") == "state" and isinstance(ev.get("state"), str):
            return ev["state"], float(ev.get("ts") or 0.0)
    return None
