"""What the agent runs: everything decided before the first attempt, saved as spec.json."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import cast


@dataclass
class RunSpec:
    job_name: str
    kind: str  # "ultralytics" | "command" | "torchrun"
    command: list[str] = field(default_factory=list)  # kind=command
    job_file: str | None = None  # kind=ultralytics: the job as run (run_dir/job.toml)
    preset: str | None = None  # preset names; files live in run_dir/presets/
    fallback: str | None = None
    resume_args: list[str] = field(default_factory=list)
    resume_from: str | None = None  # the first attempt starts from this checkpoint
    trusted_checkpoints: list[str] = field(default_factory=list)  # --trust-checkpoint: ungated
    checkpoints: list[str] = field(
        default_factory=list
    )  # the script's own checkpoints (globs); []: the default
    stall: dict[str, float] = field(
        default_factory=dict
    )  # train_timeout, startup_timeout, val_timeout, save_timeout
    max_restarts: int = 3
    auto_recover: bool = True
    deadline: float | None = None
    cost_per_hour: float | None = None
    budget: float | None = None
    currency: str = "$"
    host: str = ""
    cwd: str = "."
    kill_grace_s: float = 10.0
    save_wait_s: float = 120.0
    rescue_wait_s: float = 30.0  # a stalled trainer's rescue save, at most
    planned_wait_s: float = 60.0  # a planned restart's save, at most
    backoff_base_s: float = 1.0
    no_progress_limit: int = 2
    kernel_log: bool = True
    progress: dict | None = None  # the job's [progress]: {"pattern", "losses"}
    setup: str = ""  # shell lines run before the trainer ([host] setup)
    remote: bool = False  # started on this box by `trainctl run --host`
    instrument: bool = True  # a Python command gets the zero-code integrations
    spare: bool = True  # a warm spare interpreter for the next attempt (agent/spare.py)
    checkpoint_every: float | None = None  # kind=command, an integration's mid-epoch saves (s)
    checkpoint_auto: bool = False  # checkpoint_every = "auto" (src/trainctl/agent/checkpoint_auto.py)
    slurm: dict | None = None  # the job's [slurm] (`trainctl run --slurm`)
    ladder: list[str] = field(default_factory=list)  # the job's ladder: rungs, fastest first
    ladder_stable_s: float | None = None  # its [ladder] stable (None: the policy's default)

    def save(self, path: Path) -> None:
        from trainctl.store.paths import write_private

        write_private(path, json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> RunSpec:
        """Read a run's spec.json: the user's own file (not a link, not writable by others),
        a JSON object whose fields have their types.  SpecError (a ValueError; one line:
        which field, what it must be) otherwise; OSError when it cannot be read."""
        from trainctl.store.paths import read_private

        return cls.from_dict(_decode(read_private(path), path), path)

    @classmethod
    def from_dict(cls, data: object, where: object = "spec.json") -> RunSpec:
        if not isinstance(data, dict):
            raise SpecError(f"{where}: not a run spec (a JSON object), got {type(data).__name__}")
        fields = cls.__dataclass_fields__
        for k, v in data.items():
            if k not in fields:
                continue
            kind = cast(str, fields[k].type)  # the annotation's text (PEP 563)
            if not _CHECKS[kind](v):
                raise SpecError(f"{where}: {k}: must be {_WHAT[kind]} (got {_short(v)})")
        missing = [k for k in ("job_name", "kind") if k not in data]
        if missing:
            raise SpecError(f"{where}: {', '.join(missing)}: missing")
        return cls(**{k: v for k, v in data.items() if k in fields})


class SpecError(ValueError):
    """A spec.json that is not a run spec; ``str()`` is one line."""


def _decode(text: str, where: object) -> object:
    try:
        return json.loads(text)
    except ValueError as e:
        raise SpecError(f"{where}: not JSON ({e})") from None


def _short(v: object) -> str:
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _num(v: object) -> bool:
    return type(v) in (int, float)


def _strs(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


_CHECKS = {
    "str": lambda v: isinstance(v, str),
    "str | None": lambda v: v is None or isinstance(v, str),
    "list[str]": _strs,
    "dict[str, float]": lambda v: isinstance(v, dict) and all(_num(x) for x in v.values()),
    "int": lambda v: type(v) is int,
    "bool": lambda v: type(v) is bool,
    "float": _num,
    "float | None": lambda v: v is None or _num(v),
    "dict | None": lambda v: v is None or isinstance(v, dict),
}
_WHAT = {
    "str": "a string",
    "str | None": "a string or null",
    "list[str]": "a list of strings",
    "dict[str, float]": "an object of numbers",
    "int": "an integer",
    "bool": "true or false",
    "float": "a number",
    "float | None": "a number or null",
    "dict | None": "an object or null",
}
