"""The job-file tables of each runner kind: :data:`JOB_TABLES`, kind -> :class:`JobTable`.

A job file's ``kind`` picks one entry; :func:`~.job.load_job` checks the shared keys
itself and hands the rest to the entry.  A new runner kind is one more entry here (and its
runner, which reads the :class:`~.job.Job` it gets).
"""

from __future__ import annotations

import math
import re
import shlex
import string
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainctl.config.preset import check_train_value
from trainctl.config.validation import Problems, show

_RESUME_FIELDS = ("checkpoint",)
CHECKPOINT_EVERY_S = 600.0  # default of ``checkpoint_every``: a mid-epoch save every 10 minutes
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


# An entry's parser: (problems, the job file's top-level table, its own [section] when that
# is a table, the job's directory) -> the Job fields it sets ("command", "resume_args",
# "settings", "checkpoint_every").
# (typing's generics: an alias is evaluated, and this runs on Python 3.8 inside the trainer)
KindParser = typing.Callable[
    [Problems, typing.Mapping[str, Any], typing.Optional[typing.Mapping[str, Any]], Path],
    typing.Dict[str, Any],
]


@dataclass(frozen=True)
class JobTable:
    """What one runner kind adds to a job file.

    ``keys``: top-level keys of this kind (a job of a kind without them is told they are
    "only for kind = ..."); ``section``: its own ``[section]``, whose validated values
    become ``Job.settings``; ``parse``: see :data:`KindParser`; ``hints``: what to add when
    a job of this kind has another kind's key.
    """

    parse: KindParser
    keys: tuple[str, ...] = ()
    section: str | None = None
    hints: Mapping[str, str] = field(default_factory=dict)


def _ultralytics(
    p: Problems, data: Mapping[str, Any], table: Mapping[str, Any] | None, job_dir: Path
) -> dict[str, Any]:
    """``[ultralytics]``: the arguments of ``YOLO(model).train(...)``."""
    if "ultralytics" not in data:
        p.add(
            "ultralytics",
            None,
            'required for kind = "ultralytics": a section with model = "..." and data = "..."',
        )
    return {
        "settings": _ultralytics_table(p, table, job_dir) if table is not None else {},
        "checkpoint_every": CHECKPOINT_EVERY_S,
        **_checkpoint_fields(p, data),
    }


def _checkpoint_fields(p: Problems, data: Mapping[str, Any]) -> dict[str, Any]:
    """``checkpoint_every`` as Job fields: the seconds, and ``checkpoint_auto`` for "auto"
    (Young's interval, decided during the run by src/trainctl/agent/checkpoint_auto.py; it
    starts at the default)."""
    if "checkpoint_every" not in data:
        return {}
    if data["checkpoint_every"] == "auto":
        return {"checkpoint_every": CHECKPOINT_EVERY_S, "checkpoint_auto": True}
    every = _checkpoint_every(p, data["checkpoint_every"])
    return {"checkpoint_every": CHECKPOINT_EVERY_S if every is None else every}


def _checkpoint_every(p: Problems, value: Any) -> float | None:
    """``checkpoint_every``: seconds between mid-epoch saves, a number or "90s" / "10m" /
    "1h"; 0 turns them off ("auto": :func:`_checkpoint_fields`)."""
    allowed = 'seconds (a number >= 0, 0 = off), a string such as "15s", "10m", "1h", or "auto"'
    seconds: float | None = None
    if type(value) in (int, float):
        seconds = float(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smh]?)\s*", value)
        if m:
            seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        p.add(None, "checkpoint_every", f"must be {allowed} (got {show(value)})")
        return None
    return seconds


def _ultralytics_table(p: Problems, table: Mapping[str, Any], job_dir: Path) -> dict[str, Any]:
    sec = "ultralytics"
    out: dict[str, Any] = {}
    for key in ("model", "data"):
        if key not in table:
            example = "yolov8n.pt" if key == "model" else "data.yaml"
            p.add(sec, key, f"required: a string, e.g. {key} = {show(example)}")
    for key, value in table.items():
        if key in ("model", "data", "project"):
            value = p.str_(sec, key, value, nonempty=True)
            if value is not None:
                value = _resolve_job_path(key, value, job_dir)
        elif key == "device":
            if type(value) is not int and not isinstance(value, str):
                p.add(
                    sec, key, f'must be a string or an integer, e.g. "0", "0,1" or "cpu" (got {show(value)})'
                )
                value = None
        elif key == "workers":
            p.add(sec, key, "not allowed here: set DataLoader workers in the preset's [dataloader] workers")
            value = None
        elif key == "resume":
            p.add(sec, key, "set by trainctl: it resumes from the last good checkpoint itself; remove it")
            value = None
        else:
            value = check_train_value(p, sec, key, value)
        if value is not None:
            out[key] = value
    return out


def _resolve_job_path(key: str, value: str, job_dir: Path) -> str:
    """Relative paths resolve against the job's directory; bare names that are not
    files there (``yolov8n.pt``, ``coco8.yaml``) are left for Ultralytics to find."""
    path = Path(value).expanduser()
    if path.is_absolute():
        return str(path)
    local = job_dir / path
    if key == "project" or "/" in value or local.exists():
        return str(local.resolve())
    return value


def _command(
    p: Problems, data: Mapping[str, Any], table: Mapping[str, Any] | None, job_dir: Path
) -> dict[str, Any]:
    """``command`` (required) and ``resume_args``: any program, resumed by its arguments."""
    command = _command_argv(p, data)
    resume_args = _resume_args(p, data["resume_args"]) if "resume_args" in data else ()
    out: dict[str, Any] = {"command": command, "resume_args": resume_args}
    if "instrument" in data:  # false: no zero-code integration in a Python command
        out["instrument"] = p.bool_(None, "instrument", data["instrument"]) is not False
    out.update(_checkpoint_fields(p, data))  # an integration's mid-epoch saves (Ultralytics)
    out.update(_script_checkpoints(p, data))
    return out


def _script_checkpoints(p: Problems, data: Mapping[str, Any]) -> dict[str, Any]:
    """``checkpoints``: globs, from the run's working directory, of the files and folders
    the script saves its own checkpoints as (``["out/*.pt", "output/checkpoint-*"]``);
    absent: the ones that look like checkpoints (agent/script_checkpoints.py)."""
    if "checkpoints" not in data:
        return {}
    globs = p.str_list(None, "checkpoints", data["checkpoints"]) or ()
    for glob in globs:
        if (why := checkpoint_glob_problem(glob)) is not None:
            p.add(None, "checkpoints", why)
            return {}
    return {"checkpoints": tuple(globs)}


def checkpoint_glob_problem(glob: str) -> str | None:
    """Why ``glob`` is no glob of checkpoints below the run's working directory, or None."""
    if glob.strip() and not glob.startswith(("/", "~")) and ".." not in glob.split("/"):
        return None
    return f'each must be a glob below the run\'s working directory, e.g. "out/*.pt" (got {show(glob)})'


def _command_argv(p: Problems, data: Mapping[str, Any]) -> tuple[str, ...]:
    """``command`` of a kind = "command" job: a non-empty list of strings."""
    example = 'e.g. command = ["python", "train.py"]'
    if "command" not in data:
        p.add(None, "command", f'required for kind = "command": a list of strings, {example}')
        return ()
    value = data["command"]
    if isinstance(value, str):
        try:
            example = f"command = {show(shlex.split(value))}"
        except ValueError:
            pass
        p.add(None, "command", f"must be a list of strings: {example}")
        return ()
    if value == []:
        p.add(None, "command", f"must not be empty: {example}")
        return ()
    return p.str_list(None, "command", value) or ()


def _resume_args(p: Problems, value: Any) -> tuple[str, ...]:
    """``resume_args``: strings whose only placeholder is ``{checkpoint}``."""
    args = p.str_list(None, "resume_args", value) or ()
    for arg in args:
        fields = _placeholders(arg)
        if fields is None or any(f not in _RESUME_FIELDS for f in fields):
            p.add(
                None,
                "resume_args",
                "the only placeholder allowed is {checkpoint} "
                f"(write {{{{ and }}}} for braces) (got {show(arg)})",
            )
            return ()
    return args


def _placeholders(arg: str) -> list[str] | None:
    try:
        return [f for _, f, _, _ in string.Formatter().parse(arg) if f is not None]
    except ValueError:
        return None


_TORCHRUN_KEYS = (
    "script",
    "args",
    "python",
    "nproc_per_node",
    "nnodes",
    "node_rank",
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_id",
)


def _torchrun(
    p: Problems, data: Mapping[str, Any], table: Mapping[str, Any] | None, job_dir: Path
) -> dict[str, Any]:
    """``[torchrun]``: the script and its ``args``, ``nproc_per_node``, ``nnodes``,
    ``node_rank`` (this node's; ``trainctl run --node-rank`` overrides it), the rendezvous
    (``rdzv_backend``, ``rdzv_endpoint``: required for several nodes, ``rdzv_id``) and the
    ``python`` that runs ``-m torch.distributed.run``; ``resume_args`` as for a command."""
    resume_args = _resume_args(p, data["resume_args"]) if "resume_args" in data else ()
    found = _script_checkpoints(p, data)
    if table is None:
        if "torchrun" not in data:
            p.add(
                "torchrun",
                None,
                'required for kind = "torchrun": a section with script = "train.py" and nproc_per_node = N',
            )
        return {"resume_args": resume_args, **found}
    sec = "torchrun"
    p.unknown(sec, table, _TORCHRUN_KEYS)
    out: dict[str, Any] = {
        "python": "python",
        "args": [],
        "nproc_per_node": 1,
        "nnodes": 1,
        "node_rank": 0,
        "rdzv_backend": "c10d",
    }
    if "script" not in table:
        p.add(sec, "script", 'required: the training script, e.g. script = "train.py"')
    for key, value in table.items():
        if key in ("script", "python", "rdzv_backend", "rdzv_endpoint", "rdzv_id"):
            value = p.str_(sec, key, value, nonempty=True)
        elif key == "args":
            value = p.str_list(sec, key, value)
            value = list(value) if value is not None else None
        elif key in ("nproc_per_node", "nnodes"):
            value = p.int_(sec, key, value, 1)
        elif key == "node_rank":
            value = p.int_(sec, key, value, 0)
        if value is not None:
            out[key] = value
    if out["node_rank"] >= out["nnodes"]:
        p.add(sec, "node_rank", f"must be below nnodes ({out['nnodes']}) (got {out['node_rank']})")
    if out["nnodes"] > 1 and "rdzv_endpoint" not in out:
        p.add(
            sec,
            "rdzv_endpoint",
            "required when nnodes > 1: the rendezvous host:port every "
            'node reaches, e.g. rdzv_endpoint = "10.0.0.1:29400"',
        )
    ready = "script" in out and (out["nnodes"] == 1 or "rdzv_endpoint" in out)
    command = torchrun_command(out) if ready else ()
    return {"command": command, "resume_args": resume_args, "settings": out, **found}


def torchrun_command(settings: Mapping[str, Any], node_rank: int | None = None) -> tuple[str, ...]:
    """The torchrun command line of a ``[torchrun]`` table (``node_rank`` overrides its own).
    One node without an endpoint: ``--standalone``."""
    rank = settings.get("node_rank", 0) if node_rank is None else node_rank
    argv = [
        settings.get("python", "python"),
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(settings.get("nproc_per_node", 1)),
        "--nnodes",
        str(settings.get("nnodes", 1)),
    ]
    if settings.get("nnodes", 1) == 1 and not settings.get("rdzv_endpoint"):
        argv.append("--standalone")
    else:
        argv += [
            "--node-rank",
            str(rank),
            "--rdzv-backend",
            settings.get("rdzv_backend", "c10d"),
            "--rdzv-endpoint",
            settings["rdzv_endpoint"],
            "--rdzv-id",
            settings.get("rdzv_id") or "trainctl",
        ]
    return (*argv, settings["script"], *settings.get("args", ()))


JOB_TABLES: dict[str, JobTable] = {
    "ultralytics": JobTable(
        _ultralytics,
        keys=("checkpoint_every",),
        section="ultralytics",
        hints={
            "command": "; use [ultralytics] model and data",
            "resume_args": " (Ultralytics runs resume natively)",
            "checkpoints": " (the Ultralytics runner keeps its own checkpoints)",
        },
    ),
    "command": JobTable(
        _command, keys=("command", "resume_args", "instrument", "checkpoint_every", "checkpoints")
    ),
    "torchrun": JobTable(
        _torchrun,
        keys=("resume_args", "checkpoints"),
        section="torchrun",
        hints={"command": "; use [torchrun] script and args"},
    ),
}
