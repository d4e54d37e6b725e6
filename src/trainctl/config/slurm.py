"""``[slurm]`` in a job file: where and how big the Slurm job is (pure: no sbatch here).

The keys become sbatch options (``src/trainctl/hosts/slurm/queue.py`` builds the argv); trainctl adds its own
(``--signal``, ``--dependency``, ``--output``, ...), which ``options`` may not set.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trainctl.config.validation import Problems, show

SLURM_KEYS = ("partition", "time", "nodes", "gpus", "gres", "cpus", "mem", "warn", "options", "setup")

#: sbatch options trainctl sets itself; ``[slurm] options`` may not name them.
OWN_OPTIONS = (
    "--signal",
    "--dependency",
    "-d",
    "--output",
    "-o",
    "--error",
    "-e",
    "--job-name",
    "-J",
    "--parsable",
    "--chdir",
    "-D",
    "--wrap",
    "--array",
    "-a",
    "--open-mode",
    "--requeue",
    "--no-requeue",
    "--kill-on-invalid-dep",
    "--wait",
    "-W",
)

_TIME = re.compile(r"(?:(?P<d>\d+)-)?(?P<rest>\d+(?::\d+){0,2})\Z")


def slurm_time_s(value: str | int) -> int | None:
    """A Slurm time limit in seconds: ``minutes``, ``minutes:seconds``,
    ``hours:minutes:seconds``, ``days-hours``, ``days-hours:minutes``,
    ``days-hours:minutes:seconds`` (sbatch's own forms); an int is minutes.  None for
    ``infinite``/``unlimited``; ValueError for anything else."""
    if isinstance(value, bool):
        raise ValueError("a Slurm time, not a boolean")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("must be > 0 minutes")
        return value * 60
    text = str(value).strip().lower()
    if text in ("infinite", "unlimited"):
        return None
    m = _TIME.match(text)
    if not m:
        raise ValueError(
            f"a Slurm time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (got {show(value)})"
        )
    parts = [int(x) for x in m["rest"].split(":")]
    if m["d"] is not None:  # days-hours[:minutes[:seconds]]
        parts += [0] * (3 - len(parts))
        h, mi, s = parts
        total = int(m["d"]) * 86400 + h * 3600 + mi * 60 + s
    elif len(parts) == 1:
        total = parts[0] * 60
    elif len(parts) == 2:
        total = parts[0] * 60 + parts[1]
    else:
        total = parts[0] * 3600 + parts[1] * 60 + parts[2]
    if total <= 0:
        raise ValueError(f"must be longer than 0 (got {show(value)})")
    return total


#: [torchrun] keys a job of several Slurm nodes may not set: trainctl sets them from the allocation
NODE_KEYS = ("nnodes", "node_rank", "rdzv_backend", "rdzv_endpoint", "rdzv_id")


def slurm_nodes_problems(
    p: Problems, slurm: Mapping[str, Any], kind: str | None, torchrun: Mapping[str, Any] | None
) -> None:
    """``nodes > 1`` runs one agent per node, each a torchrun node of the job's rendezvous:
    only a ``kind = "torchrun"`` job, whose nodes and rendezvous trainctl sets itself."""
    nodes = slurm.get("nodes", 1)
    if nodes > 1 and kind != "torchrun":
        p.add(
            "slurm",
            "nodes",
            f"{nodes} nodes run one torchrun node each: only for kind = "
            '"torchrun" (a command or Ultralytics job runs on one node)',
        )
    for key in NODE_KEYS if nodes > 1 else ("nnodes",):
        value = (torchrun or {}).get(key)
        if value is not None and (nodes > 1 or value != 1):
            p.add(
                "torchrun",
                key,
                "set by trainctl on Slurm (the nodes come from [slurm] nodes, "
                "the rendezvous from the allocation); remove it",
            )


def job_slurm(p: Problems, table: Mapping[str, Any]) -> dict[str, Any]:
    """``[slurm]``: partition, time, nodes, gpus, gres, cpus (per task), mem, warn (seconds
    before the time limit when the trainer is asked to save; default: from the limit),
    options (more sbatch options), setup (shell lines run in the job before the agent)."""
    p.unknown("slurm", table, SLURM_KEYS)
    out: dict[str, Any] = {}
    for key in ("partition", "gres", "mem", "setup"):
        if key in table and (v := p.str_("slurm", key, table[key], nonempty=True)) is not None:
            if key != "setup" and any(c.isspace() or ord(c) < 32 for c in v):
                p.add("slurm", key, f"must not contain spaces or control characters (got {show(v)})")
                continue
            out[key] = v
    if "time" in table:
        value = table["time"]
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            p.add(
                "slurm",
                "time",
                f'a Slurm time such as "1:00:00" or minutes as an integer (got {show(value)})',
            )
        else:
            try:
                slurm_time_s(value)
                out["time"] = str(value)
            except ValueError as e:
                p.add("slurm", "time", str(e))
    if "nodes" in table and (n := p.int_("slurm", "nodes", table["nodes"], 1)) is not None:
        out["nodes"] = n
    if "cpus" in table and (c := p.int_("slurm", "cpus", table["cpus"], 1)) is not None:
        out["cpus"] = c
    if "gpus" in table:
        g = table["gpus"]
        if isinstance(g, int) and not isinstance(g, bool) and g >= 1:
            out["gpus"] = str(g)
        elif isinstance(g, str) and re.fullmatch(r"[A-Za-z0-9_.-]+(:\d+)?", g.strip() or "!"):
            out["gpus"] = g.strip()
        else:
            p.add("slurm", "gpus", f'an integer >= 1 or TYPE:COUNT such as "a100:2" (got {show(g)})')
    if "gpus" in out and "gres" in out:
        p.add("slurm", "gres", "give gpus or gres, not both")
    if "warn" in table and (w := p.number("slurm", "warn", table["warn"], positive=True)) is not None:
        if w > 65535:
            p.add("slurm", "warn", f"at most 65535 seconds (sbatch --signal) (got {show(w)})")
        else:
            out["warn"] = int(w)
    if "options" in table and (opts := p.str_list("slurm", "options", table["options"])) is not None:
        own = [o for o in opts if o.split("=", 1)[0] in OWN_OPTIONS]
        nodes = [o for o in opts if o.split("=", 1)[0] in ("--nodes", "-N") or re.match(r"-N\d", o)]
        if nodes:
            p.add(
                "slurm",
                "options",
                f"{show(nodes[0])}: give nodes = N instead (several nodes "
                "run one agent each, for a torchrun job)",
            )
        elif own:
            p.add(
                "slurm",
                "options",
                f"{show(own[0])} is set by trainctl itself (it needs it to "
                "follow and continue the run); remove it",
            )
        elif any(not o.startswith("-") for o in opts):
            p.add("slurm", "options", 'each item must be one sbatch option such as "--qos=high"')
        else:
            out["options"] = list(opts)
    return out
