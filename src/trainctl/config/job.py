"""Job files (``trainctl.toml``): what to run, its presets, deadline, budget and restarts.

A job file names what to run (``kind``: its own keys and section are in
:data:`.kinds.JOB_TABLES`), the presets, the deadline and budget, and the restart policy.
:func:`load_job` validates it, its presets included.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainctl.config.kinds import JOB_TABLES, JobTable
from trainctl.config.ladder import LadderCfg, job_ladder
from trainctl.config.preset import Preset
from trainctl.config.slurm import job_slurm, slurm_nodes_problems
from trainctl.config.store import is_path_ref, load_preset
from trainctl.config.validation import SAFE_NAME, ConfigError, Problems, choices, parse_toml, read_text, show
from trainctl.core.names import MAX_NAME, BadNameError, check_name
from trainctl.core.user_pattern import PatternError, compile_user_pattern

JOB_KINDS = tuple(JOB_TABLES)  # as shipped; the checks below read JOB_TABLES itself
JOB_FILE_NAME = "trainctl.toml"

_SHARED_KEYS = (
    "preset",
    "fallback",
    "deadline",
    "cost_per_hour",
    "budget",
    "currency",
    "run_dir",
    "max_restarts",
    "ladder",
    "spare",
    "trust_checkpoints",
)
_SHARED_SECTIONS = ("stall", "host", "progress", "alerts", "slurm")
_STALL_KEYS = ("startup_timeout", "train_timeout", "val_timeout", "startup_idle", "silence_floor")
_HOST_KEYS = ("destination", "workdir", "trainctl", "setup")
_PROGRESS_KEYS = ("pattern", "losses")
_ALERTS_KEYS = ("use", "urls", "on")
ALERT_KINDS = (
    "stall",
    "restart",
    "fallback",
    "ladder",
    "failed",
    "finished",
    "deadline.at_risk",
    "budget.at_risk",
    "fatal_warning",
)
"""What ``[alerts] on = [...]`` chooses among (default: all); the at-risk ones are the
projection's warning ids."""


@dataclass(frozen=True)
class Job:
    """A validated job file (``trainctl.toml``)."""

    name: str
    kind: str  # a key of JOB_TABLES: "ultralytics" | "command" | "torchrun"
    path: Path | None = None
    command: tuple[str, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)  # its kind's validated [section]
    preset: str | None = None  # a preset name, or an absolute path
    fallback: str | None = None  # likewise
    deadline: float | None = None
    cost_per_hour: float | None = None
    budget: float | None = None
    currency: str = "$"
    run_dir: Path | None = None
    resume_args: tuple[str, ...] = ()
    max_restarts: int = 3
    stall: dict[str, float] = field(default_factory=dict)
    host: dict[str, str] | None = None
    description: str = ""
    # [progress]: the trainer's own progress line, {"pattern": regex, "losses": [group names]}
    progress: dict[str, Any] | None = None
    checkpoint_every: float = 600.0  # seconds between mid-epoch saves (0: off); ultralytics, or
    #                                   a command whose Ultralytics script an integration runs
    checkpoint_auto: bool = False  # checkpoint_every = "auto": Young's interval, re-decided in the run
    instrument: bool = True  # kind command: zero-code integrations in a Python command
    checkpoints: tuple[
        str, ...
    ] = ()  # command, torchrun: the script's own checkpoints (globs); (): the default
    spare: bool = True  # a warm spare interpreter for the next attempt (a Python trainer)
    # [alerts]: {"use": [names in alerts.toml], "urls": [apprise URLs], "on": [ALERT_KINDS]}
    alerts: dict[str, tuple[str, ...]] | None = None
    # [slurm]: partition, time, nodes, gpus, gres, cpus, mem, warn, options, setup (config/slurm.py)
    slurm: dict[str, Any] | None = None
    ladder: LadderCfg | None = None  # ``ladder`` / ``[ladder]`` (config/ladder.py)
    # checkpoint files unpickled even where the checkpoint gate refuses them (resolved)
    trust_checkpoints: tuple[Path, ...] = ()

    @property
    def ultralytics(self) -> dict[str, Any]:
        """``[ultralytics]``: the arguments of ``YOLO(model).train(...)`` (``{}`` for other kinds)."""
        return self.settings if self.kind == "ultralytics" else {}

    @property
    def dir(self) -> Path:
        """The job file's directory (relative names resolve against it)."""
        return self.path.parent if self.path is not None else Path(".")

    @property
    def preset_dirs(self) -> list[Path]:
        """``search_dirs`` for this job's preset names (``<job dir>/presets``)."""
        return [self.dir / "presets"]

    def load_preset(self, ref: str | os.PathLike[str] | None = None) -> Preset | None:
        """The preset ``ref`` (default: the job's own), resolved from the job's directory."""
        ref = self.preset if ref is None else ref
        return None if ref is None else _load_job_preset(ref, self.dir)

    def load_fallback(self) -> Preset | None:
        """The fallback preset, or None."""
        return None if self.fallback is None else _load_job_preset(self.fallback, self.dir)


def _load_job_preset(ref: str | os.PathLike[str], job_dir: Path) -> Preset:
    if is_path_ref(ref):
        ref = job_dir / Path(ref).expanduser()
    return load_preset(ref, [job_dir / "presets"])


def parse_deadline(value: str | dt.datetime | dt.date) -> float:
    """An ISO 8601 date/time (string or datetime) as unix seconds; naive means local time.

    A bare date means midnight at its start.  Raises ValueError with what is allowed.
    """
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(
                "must be an ISO 8601 date and time, e.g. 2025-11-28T18:00 (local) or "
                f"2025-11-28T18:00+01:00 (got {show(value)})"
            ) from None
    if isinstance(value, dt.datetime):
        return value.timestamp()
    if isinstance(value, dt.date):
        return dt.datetime.combine(value, dt.time()).timestamp()
    raise ValueError(f"must be an ISO 8601 date and time, e.g. 2025-11-28T18:00 (got {show(value)})")


def expand_resume_args(args: Sequence[str], checkpoint: str | os.PathLike[str] | None) -> tuple[str, ...]:
    """``resume_args`` with ``{checkpoint}`` filled in.

    Returns ``()`` when an argument needs a checkpoint and there is none: the restart
    is then a fresh start.
    """
    needs = any("{checkpoint" in a for a in args)
    if needs and checkpoint is None:
        return ()
    return tuple(a.format(checkpoint=str(checkpoint)) for a in args)


def _job_name(p: Problems, data: Mapping[str, Any], path: Path) -> str:
    if "name" in data:
        name = p.str_(None, "name", data["name"], nonempty=True)
        if name is not None and not SAFE_NAME.match(name):
            p.add(
                None,
                "name",
                "must contain only letters, digits, '.', '_' and '-' (it names "
                f"tmux sessions and run directories) (got {show(name)})",
            )
            return "job"
        if name is not None:
            try:
                check_name(name, "name")
            except BadNameError as e:
                p.add(
                    None,
                    "name",
                    f"{e} (it names tmux sessions, run directories and the job's directory on a box)",
                )
                return "job"
        return name or "job"
    stem = path.stem if path.stem != Path(JOB_FILE_NAME).stem else path.resolve().parent.name
    stem = re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9._-]+", "-", stem))
    return stem.lstrip(".-").rstrip("-")[:MAX_NAME] or "job"


def _validate_job(data: Mapping[str, Any], p: Problems, path: Path) -> Job:
    job_dir = path.parent
    kinds = tuple(JOB_TABLES)
    sections = (*(t.section for t in JOB_TABLES.values() if t.section), *_SHARED_SECTIONS)
    p.unknown(None, data, ("name", "kind", "description", *_kind_keys(), *_SHARED_KEYS), sections)
    p.controls(data)
    tables = {sec: p.table(sec, data[sec]) for sec in sections if sec in data}
    name = _job_name(p, data, path)

    kind = None
    if "kind" not in data:
        p.add(None, "kind", f"required: one of {choices(kinds)}")
    else:
        kind = p.choice(None, "kind", data["kind"], kinds)

    by_kind = _kind_fields(p, data, JOB_TABLES[kind], tables, job_dir) if kind is not None else {}

    presets: dict[str, str | None] = {}
    for key in ("preset", "fallback"):
        ref = p.str_(None, key, data[key], nonempty=True) if key in data else None
        if ref is not None:
            _check_job_preset(p, key, ref, job_dir)
            if is_path_ref(ref):
                ref = str((job_dir / Path(ref).expanduser()).resolve())
        presets[key] = ref

    ladder = None
    if "ladder" in data:
        ladder = job_ladder(
            p, data["ladder"], presets["preset"], lambda key, ref: _check_job_preset(p, key, ref, job_dir)
        )
        if ladder is not None and presets["preset"] and presets["preset"] not in ladder.rungs:
            if not any(r.startswith(f"{presets['preset']}.w") for r in ladder.rungs):
                p.add(
                    None,
                    "preset",
                    f"must be one of the ladder's rungs ({', '.join(ladder.rungs)}): it starts there",
                )

    deadline = None
    if "deadline" in data:
        try:
            deadline = parse_deadline(data["deadline"])
        except ValueError as exc:
            p.add(None, "deadline", str(exc))

    def opt_number(key: str) -> float | None:
        return p.number(None, key, data[key], positive=False) if key in data else None

    currency = p.str_(None, "currency", data["currency"], nonempty=True) if "currency" in data else "$"
    run_dir = None
    if "run_dir" in data and p.str_(None, "run_dir", data["run_dir"], nonempty=True):
        run_dir = (job_dir / Path(data["run_dir"]).expanduser()).resolve()

    max_restarts = p.int_(None, "max_restarts", data["max_restarts"], 0) if "max_restarts" in data else 3
    spare = p.bool_(None, "spare", data["spare"]) is not False if "spare" in data else True
    trust = (
        p.str_list(None, "trust_checkpoints", data["trust_checkpoints"])
        if "trust_checkpoints" in data
        else ()
    )
    stall = _job_stall(p, t) if (t := tables.get("stall")) is not None else {}
    host = _job_host(p, t) if (t := tables.get("host")) is not None else None
    progress = _job_progress(p, t) if (t := tables.get("progress")) is not None else None
    description = p.str_(None, "description", data["description"]) if "description" in data else ""
    alerts = _job_alerts(p, t) if (t := tables.get("alerts")) is not None else None
    slurm = job_slurm(p, t) if (t := tables.get("slurm")) is not None else None
    if slurm is not None:
        slurm_nodes_problems(p, slurm, kind, tables.get("torchrun"))
    if slurm is not None and host is not None:
        p.add("slurm", None, "give [slurm] or [host], not both (run from the login node)")

    return Job(
        name=name,
        kind=kind or "command",
        path=path,
        preset=presets["preset"],
        fallback=presets["fallback"],
        deadline=deadline,
        cost_per_hour=opt_number("cost_per_hour"),
        budget=opt_number("budget"),
        currency=currency or "$",
        run_dir=run_dir,
        max_restarts=3 if max_restarts is None else max_restarts,
        spare=spare,
        stall=stall,
        host=host,
        description=description or "",
        progress=progress,
        alerts=alerts,
        slurm=slurm,
        ladder=ladder,
        trust_checkpoints=tuple((job_dir / Path(t).expanduser()).resolve() for t in trust or ()),
        **by_kind,
    )


def _kind_keys() -> tuple[str, ...]:
    """The top-level keys that belong to runner kinds (``command``, ``resume_args``, ...)."""
    return tuple(dict.fromkeys(k for t in JOB_TABLES.values() for k in t.keys))


def _kind_fields(
    p: Problems,
    data: Mapping[str, Any],
    own: JobTable,
    tables: Mapping[str, Mapping[str, Any] | None],
    job_dir: Path,
) -> dict[str, Any]:
    """The Job fields of the job's kind; other kinds' keys and sections are refused."""
    for key in _kind_keys():
        if key in data and key not in own.keys:
            owners = " or ".join(f'"{k}"' for k, t in JOB_TABLES.items() if key in t.keys)
            p.add(None, key, f"only for kind = {owners}{own.hints.get(key, '')}")
    for kind, table in JOB_TABLES.items():
        if table.section and table.section != own.section and table.section in data:
            p.add(table.section, None, f'only for kind = "{kind}"')
    return own.parse(p, data, tables.get(own.section) if own.section else None, job_dir)


def _job_stall(p: Problems, table: Mapping[str, Any]) -> dict[str, float]:
    """``[stall]``: phase timeouts in seconds, each > 0; ``startup_idle``: how long a tree
    with no output, CPU or I/O before its first batch is a deadlock (90); ``silence_floor``:
    the least output silence allowed a trainer whose progress format is unknown (60)."""
    p.unknown("stall", table, _STALL_KEYS)
    values = {k: p.number("stall", k, table[k], positive=True) for k in _STALL_KEYS if k in table}
    return {k: v for k, v in values.items() if v is not None}


def _job_progress(p: Problems, table: Mapping[str, Any]) -> dict[str, Any] | None:
    """``[progress]``: a regex with named groups epoch/epochs/batch/batches and loss groups
    (named in ``losses``, or called ``loss`` / ``loss_*``), tried before the built-in formats."""
    p.unknown("progress", table, _PROGRESS_KEYS)
    if "pattern" not in table:
        p.add(
            "progress",
            "pattern",
            "required: a regular expression with named groups, e.g. "
            "pattern = 'it (?P<batch>\\d+)/(?P<batches>\\d+) L=(?P<loss>[\\d.]+)'",
        )
        return None
    pattern = p.str_("progress", "pattern", table["pattern"], nonempty=True)
    losses = p.str_list("progress", "losses", table["losses"]) if "losses" in table else ()
    if pattern is None or losses is None:
        return None
    try:
        compile_user_pattern(pattern, losses)
    except PatternError as exc:
        p.add("progress", exc.key, str(exc))
        return None
    return {"pattern": pattern, "losses": list(losses)}


def _check_job_preset(p: Problems, key: str, ref: str, job_dir: Path) -> None:
    """Report a preset that cannot be found (under the job's key) or is invalid (its own file)."""
    if is_path_ref(ref) and not (job_dir / Path(ref).expanduser()).is_file():
        p.add(None, key, f"no such preset file: {job_dir / ref}")
        return
    try:
        _load_job_preset(ref, job_dir)
    except ConfigError as exc:
        if exc.file:
            p.items.extend(exc.problems)
        else:
            p.add(None, key, exc.message)


def _job_alerts(p: Problems, table: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """``[alerts]``: ``use`` (names from alerts.toml), ``urls`` (apprise URLs), ``on`` (which
    of :data:`ALERT_KINDS`; default all).  A URL is never echoed in a message: it may hold
    a token."""
    p.unknown("alerts", table, _ALERTS_KEYS)
    out: dict[str, tuple[str, ...]] = {}
    for key in ("use", "urls"):
        if key in table:
            value = table[key]
            if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
                p.add(
                    "alerts",
                    key,
                    "must be a list of non-empty strings"
                    + (
                        " (alert names from alerts.toml)"
                        if key == "use"
                        else ' (apprise URLs, e.g. "ntfys://ntfy.sh/my-topic")'
                    ),
                )
                continue
            if key == "urls" and (bad := [i for i, v in enumerate(value) if "://" not in v]):
                p.add("alerts", key, f"item {bad[0] + 1} is not a URL (SCHEME://...)")
                continue
            out[key] = tuple(value)
    if "on" in table:
        on = p.str_list("alerts", "on", table["on"])
        if on is not None:
            wrong = [k for k in on if k not in ALERT_KINDS]
            if wrong:
                p.add("alerts", "on", f"unknown {show(wrong[0])}: choose among {choices(ALERT_KINDS)}")
            else:
                out["on"] = on
    return out


def _job_host(p: Problems, table: Mapping[str, Any]) -> dict[str, str]:
    p.unknown("host", table, _HOST_KEYS)
    if "destination" not in table:
        p.add("host", "destination", 'required: an ssh destination, e.g. destination = "user@gpu-box"')
    return {
        k: v
        for k in _HOST_KEYS
        if k in table and (v := p.str_("host", k, table[k], nonempty=True)) is not None
    }


def job_problems(text: str, path: str | os.PathLike[str]) -> list[ConfigError]:
    """Every problem in a job file's text; ``[]`` when it is fine."""
    path = Path(path)
    try:
        data = parse_toml(text, str(path))
    except ConfigError as exc:
        return [exc]
    p = Problems(str(path), text)
    _validate_job(data, p, path)
    return p.sorted()


def load_job(path: str | os.PathLike[str]) -> Job:
    """Load and validate a job file (a directory means its ``trainctl.toml``).

    Its presets are loaded too, so a bad preset is refused before anything runs.
    """
    path = Path(path)
    if path.is_dir():
        path = path / JOB_FILE_NAME
    text = read_text(path, str(path))
    data = parse_toml(text, str(path))
    p = Problems(str(path), text)
    job = _validate_job(data, p, path)
    p.raise_if_any()
    return job
