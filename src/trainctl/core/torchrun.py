"""torchrun command lines: recognise one, read its options, and rewrite it the way trainctl
supervises it.  Pure (no process, no file is touched).

trainctl runs ``torchrun`` (``python -m torch.distributed.run``) with one restart policy,
its own: ``--max-restarts 0``, so a failed rank ends the launcher and trainctl decides.
Each rank's output goes to its own files (``--redirects 3 --log-dir D``, nothing on the
launcher's console, where two ranks' lines would run together), laid out by torchrun as
``D/<run id>_<random>/attempt_0/<local rank>/{stdout,stderr}.log``; the agent tails them
with the rank known (:func:`rank_files`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SETUP_MARK = "trainctl-setup"  # src/trainctl/agent/attempt.py's with_setup: $0 of the setup shell
LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
# torchrun's options that take no value (every other one takes one, unless written --x=v)
_FLAGS = frozenset(
    {
        "--standalone",
        "--no-python",
        "--no_python",
        "-m",
        "--module",
        "--run-path",
        "--run_path",
        "--virtual-local-rank",
        "--virtual_local_rank",
    }
)
# the options trainctl sets itself: the user's are dropped
_OWN = frozenset(
    {
        "--max-restarts",
        "--max_restarts",
        "--redirects",
        "-r",
        "--tee",
        "-t",
        "--log-dir",
        "--log_dir",
        "--local-ranks-filter",
        "--local_ranks_filter",
    }
)


def launcher_end(argv: list[str] | tuple[str, ...]) -> int | None:
    """The index just after the launcher (``torchrun``, or ``-m torch.distributed.run``),
    where its options begin; None when ``argv`` runs no torchrun.  A command run after the
    job's setup (``bash -c SETUP trainctl-setup ARGV``) is looked for in ARGV."""
    first = argv.index(SETUP_MARK) + 1 if SETUP_MARK in argv else 0
    for i in range(first, len(argv)):
        a = argv[i]
        if a.rsplit("/", 1)[-1] == "torchrun":
            return i + 1
        if a == "-m" and i + 1 < len(argv) and argv[i + 1] in LAUNCHERS[1:]:
            return i + 2
        if not a.startswith("-") and i > first and not argv[i - 1].startswith("-"):
            return None  # past the interpreter and its options: a script, no launcher
    return None


def is_torchrun(argv: list[str] | tuple[str, ...]) -> bool:
    return launcher_end(argv) is not None


def options(argv: list[str] | tuple[str, ...]) -> tuple[dict[str, str | None], int]:
    """torchrun's options (``--nproc_per_node`` read as ``--nproc-per-node``; a flag's value
    is None) and the index of the script (``len(argv)`` when there is none)."""
    start = launcher_end(argv)
    if start is None:
        return {}, len(argv)
    out: dict[str, str | None] = {}
    i = start
    while i < len(argv):
        a = argv[i]
        if not a.startswith("-") or a == "--":
            return out, i + (a == "--")
        name, eq, value = a.partition("=")
        key = _key(name)
        if eq:
            out[key] = value
        elif name in _FLAGS or i + 1 >= len(argv):
            out[key] = None
        else:
            out[key] = argv[i + 1]
            i += 1
        i += 1
    return out, i


def _key(name: str) -> str:
    return "--" + name.lstrip("-").replace("_", "-") if name.startswith("--") else name


def supervised(argv: list[str] | tuple[str, ...], log_dir: str | Path) -> list[str]:
    """``argv`` with trainctl's own options: ``--max-restarts 0 --redirects 3 --log-dir
    log_dir`` (the user's restart, redirect, tee and log-dir options are dropped)."""
    start = launcher_end(argv)
    if start is None:
        return list(argv)
    kept, script = _launcher_options_without(argv, start, _OWN)
    return [
        *argv[:start],
        "--max-restarts",
        "0",
        "--redirects",
        "3",
        "--log-dir",
        str(log_dir),
        *kept,
        *argv[script:],
    ]


def _launcher_options_without(
    argv: list[str] | tuple[str, ...], start: int, names: frozenset[str]
) -> tuple[list[str], int]:
    """The launcher's options in ``argv`` (from ``start``) less those in ``names`` (with
    their values), and the index of the script."""
    _, script = options(argv)
    kept: list[str] = []
    i = start
    while i < script:
        a = argv[i]
        name, eq, _ = a.partition("=")
        takes = not eq and name not in _FLAGS and a != "--"
        if name in names:
            i += 1 + (1 if takes else 0)
            continue
        kept.append(a)
        if takes and i + 1 < script:
            kept.append(argv[i + 1])
            i += 1
        i += 1
    return kept, script


@dataclass(frozen=True)
class Layout:
    """Where a supervised torchrun writes its ranks' output, and how local ranks number."""

    log_dir: Path
    nproc: int | None  # ranks on this node (None: "auto", "gpu", ...: not known here)
    nnodes_max: int
    node_rank: int

    def global_rank(self, local_rank: int) -> int:
        """The global rank of a local one as a static layout numbers it (node_rank × nproc +
        local); a c10d rendezvous of several nodes may number them otherwise: the agent
        reads the ranks' own RANK first."""
        return self.node_rank * (self.nproc or 0) + local_rank if self.nproc else local_rank


def layout(argv: list[str] | tuple[str, ...]) -> Layout | None:
    """The rank layout of a supervised torchrun ``argv`` (None without ``--log-dir``)."""
    opts, _ = options(argv)
    log_dir = opts.get("--log-dir")
    if not log_dir:
        return None
    nproc = _int(opts.get("--nproc-per-node"))
    nnodes = opts.get("--nnodes") or "1"
    return Layout(Path(log_dir), nproc, _int(nnodes.split(":")[-1]) or 1, _int(opts.get("--node-rank")) or 0)


def layout_options(argv: list[str] | tuple[str, ...]) -> tuple[int, int]:
    """(the most nodes, this node's rank) a torchrun command asks for; (1, 0) for any other
    command."""
    if not is_torchrun(argv):
        return 1, 0
    opts, _ = options(argv)
    nnodes = opts.get("--nnodes") or "1"
    return _int(nnodes.split(":")[-1]) or 1, _int(opts.get("--node-rank")) or 0


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


_RANK_FILE = re.compile(r"attempt_\d+/(\d+)/(stdout|stderr)\.log$")


def rank_files(paths: list[str]) -> dict[str, int]:
    """The per-rank output files among ``paths`` (relative to the log dir), each with its
    local rank."""
    out = {}
    for p in paths:
        m = _RANK_FILE.search(p.replace("\\", "/"))
        if m:
            out[p] = int(m.group(1))
    return out


def rendezvous_wait(argv: list[str] | tuple[str, ...]) -> str | None:
    """Why a still tree before the first batch may be a rank waiting for other nodes at a
    torchrun rendezvous (``--nnodes`` above 1, or a range), so not a deadlock; None when
    the command is no multi-node torchrun.  Read from the command, not the stacks: the
    rendezvous waits in C++ (TCPStore), where the Python frames say little."""
    if not any(a.rsplit("/", 1)[-1] in LAUNCHERS for a in argv):
        return None
    for i, a in enumerate(argv):
        value = (
            a.split("=", 1)[1]
            if a.startswith("--nnodes=")
            else (argv[i + 1] if a == "--nnodes" and i + 1 < len(argv) else None)
        )
        if value is None:
            continue
        try:
            most = int(value.split(":")[-1])
        except ValueError:
            return None
        return f"torchrun --nnodes {value}" if most > 1 else None
    return None


#: the options :func:`across_nodes` sets (the command's own are dropped)
_NODE_OPTIONS = frozenset(
    {
        "--standalone",
        "--nnodes",
        "--node-rank",
        "--node_rank",
        "--rdzv-backend",
        "--rdzv_backend",
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        "--rdzv-id",
        "--rdzv_id",
        "--local-addr",
        "--local_addr",
        "--master-addr",
        "--master_addr",
        "--master-port",
        "--master_port",
    }
)


def across_nodes(
    argv: list[str] | tuple[str, ...],
    nnodes: int,
    node_rank: int,
    endpoint: str,
    rdzv_id: str,
    local_addr: str | None = None,
) -> list[str]:
    """A torchrun ``argv`` as one node of ``nnodes`` (a Slurm allocation's): its
    ``--standalone``, node and rendezvous options replaced by ``--nnodes N --node-rank R
    --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID`` and ``--local-addr`` (the
    address the other nodes reach this one by; a node's name may not resolve).  Any other
    command is returned as it is."""
    start = launcher_end(argv)
    if start is None:
        return list(argv)
    kept, script = _launcher_options_without(argv, start, _NODE_OPTIONS)
    own = [
        "--nnodes",
        str(nnodes),
        "--node-rank",
        str(node_rank),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        rdzv_id,
    ]
    if local_addr:
        own += ["--local-addr", local_addr]
    return [*argv[:start], *own, *kept, *argv[script:]]
