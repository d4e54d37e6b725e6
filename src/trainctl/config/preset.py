"""The preset model: what a preset file holds, validated.

A preset (``presets/A.toml``) has ``description``, ``expected_rate``, ``args`` and the
sections ``[dataloader]``, ``[threads]``, ``[train]`` and ``[env]``.  :class:`Preset`
gives the trainer's environment (:meth:`Preset.child_env`) and DataLoader arguments.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainctl.config.validation import ConfigError, Problems, parse_toml, show

MP_CONTEXTS = ("fork", "spawn", "forkserver")
SHARING_STRATEGIES = ("file_descriptor", "file_system")

_DATALOADER_KEYS = (
    "workers",
    "persistent_workers",
    "prefetch_factor",
    "multiprocessing_context",
    "sharing_strategy",
    "pin_memory",
)
_THREADS_KEYS = ("omp_num_threads", "torch_num_threads")
_PRESET_SECTIONS = ("dataloader", "threads", "train", "env")
_PRESET_KEYS = ("description", "expected_rate", "args")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class DataLoaderCfg:
    """``[dataloader]``: None means "leave the trainer's default"."""

    workers: int | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    multiprocessing_context: str | None = None
    sharing_strategy: str | None = None
    pin_memory: bool | None = None


@dataclass(frozen=True)
class ThreadsCfg:
    """``[threads]``: OMP_NUM_THREADS and torch.set_num_threads (None: unchanged)."""

    omp_num_threads: int | None = None
    torch_num_threads: int | None = None


@dataclass(frozen=True)
class Preset:
    """A validated preset; ``name`` is the file's stem."""

    name: str
    path: Path | None = None
    description: str = ""
    dataloader: DataLoaderCfg = field(default_factory=DataLoaderCfg)
    threads: ThreadsCfg = field(default_factory=ThreadsCfg)
    train: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    expected_rate: float | None = None

    def child_env(self) -> dict[str, str]:
        """Variables to add to the training process's environment.

        The preset's ``[env]``, OMP_NUM_THREADS, and ``TRAINCTL_*`` exports (only the
        values that are set) so that a generic PyTorch script can apply the preset.
        """
        dl, th = self.dataloader, self.threads
        env = dict(self.env)
        exports: dict[str, Any] = {
            "OMP_NUM_THREADS": th.omp_num_threads,
            "TRAINCTL_PRESET": self.name,
            "TRAINCTL_PRESET_FILE": self.path,
            "TRAINCTL_WORKERS": dl.workers,
            "TRAINCTL_PERSISTENT_WORKERS": dl.persistent_workers,
            "TRAINCTL_PREFETCH_FACTOR": dl.prefetch_factor,
            "TRAINCTL_MP_CONTEXT": dl.multiprocessing_context,
            "TRAINCTL_SHARING_STRATEGY": dl.sharing_strategy,
            "TRAINCTL_PIN_MEMORY": dl.pin_memory,
            "TRAINCTL_TORCH_THREADS": th.torch_num_threads,
        }
        for name, value in exports.items():
            if value is not None:
                env[name] = str(int(value)) if isinstance(value, bool) else str(value)
        return env

    def dataloader_kwargs(self) -> dict[str, Any]:
        """``torch.utils.data.DataLoader`` keyword arguments for the set values.

        Only combinations PyTorch accepts: the worker options appear only with
        ``num_workers > 0``.  ``sharing_strategy`` is process-wide, not a DataLoader
        argument: apply it with ``torch.multiprocessing.set_sharing_strategy``.
        """
        dl = self.dataloader
        kwargs: dict[str, Any] = {}
        if dl.workers is not None:
            kwargs["num_workers"] = dl.workers
        if dl.pin_memory is not None:
            kwargs["pin_memory"] = dl.pin_memory
        if dl.workers:
            optional = {
                "persistent_workers": dl.persistent_workers,
                "prefetch_factor": dl.prefetch_factor,
                "multiprocessing_context": dl.multiprocessing_context,
            }
            kwargs.update({k: v for k, v in optional.items() if v is not None})
        return kwargs


def check_train_value(p: Problems, sec: str, key: str, value: Any) -> Any:
    """Trainer arguments: scalars; a few well-known ones type-checked."""
    if key == "workers":
        p.add(sec, key, "not allowed here: set DataLoader workers in a preset's [dataloader] workers")
        return None
    if key in ("val", "amp"):
        return p.bool_(sec, key, value)
    if key == "batch":
        ok = type(value) is int and (value >= 1 or value == -1)
        ok = ok or (type(value) is float and 0 < value < 1)
        if not ok:
            p.add(
                sec,
                key,
                "must be an integer >= 1, -1 (auto), or a fraction of GPU memory "
                f"between 0 and 1 (got {show(value)})",
            )
            return None
        return value
    if key in ("epochs", "imgsz"):
        return p.int_(sec, key, value, 1)
    if isinstance(value, (bool, int, float, str)) and not (
        isinstance(value, float) and not math.isfinite(value)
    ):
        return value
    p.add(sec, key, f"must be a string, number or boolean (got {show(value)})")
    return None


def _preset_dataloader(p: Problems, table: Mapping[str, Any]) -> DataLoaderCfg:
    sec = "dataloader"
    p.unknown(sec, table, _DATALOADER_KEYS)

    def opt(key: str, check: Any, *rule: Any) -> Any:
        return check(sec, key, table[key], *rule) if key in table else None

    cfg = DataLoaderCfg(
        workers=opt("workers", p.int_, 0),
        persistent_workers=opt("persistent_workers", p.bool_),
        prefetch_factor=opt("prefetch_factor", p.int_, 1),
        multiprocessing_context=opt("multiprocessing_context", p.choice, MP_CONTEXTS),
        sharing_strategy=opt("sharing_strategy", p.choice, SHARING_STRATEGIES),
        pin_memory=opt("pin_memory", p.bool_),
    )
    if cfg.workers or ("workers" in table and cfg.workers is None):
        return cfg  # workers > 0, or a bad workers value already reported
    have = "workers is not set" if cfg.workers is None else f"got workers = {cfg.workers}"
    worker_only = {
        "persistent_workers": cfg.persistent_workers is True,
        "prefetch_factor": cfg.prefetch_factor is not None,
        "multiprocessing_context": cfg.multiprocessing_context is not None,
    }
    for key in (k for k, is_set in worker_only.items() if is_set):
        p.add(sec, key, f"only allowed with [dataloader] workers > 0 ({have}); remove it or set workers >= 1")
    return cfg


def _preset_threads(p: Problems, table: Mapping[str, Any]) -> ThreadsCfg:
    p.unknown("threads", table, _THREADS_KEYS)
    values = {k: p.int_("threads", k, table[k], 1) for k in _THREADS_KEYS if k in table}
    return ThreadsCfg(**values)


def _string_table(p: Problems, sec: str, table: Mapping[str, Any]) -> dict[str, str]:
    """``[env]``: environment variable names to string values."""
    env: dict[str, str] = {}
    for name, value in table.items():
        if not _ENV_NAME.match(name):
            p.add(
                sec,
                name,
                "not a valid environment variable name: letters, digits and _, not starting with a digit",
            )
        elif name.startswith("TRAINCTL_"):
            p.add(sec, name, "names starting with TRAINCTL_ are set by trainctl; choose another name")
        elif not isinstance(value, str):
            p.add(
                sec,
                name,
                f"must be a string: quote it, {name} = {json.dumps(show(value))} (got {show(value)})",
            )
        else:
            env[name] = value
    return env


def _validate_preset(data: Mapping[str, Any], p: Problems, name: str, path: Path | None) -> Preset:
    p.unknown(None, data, _PRESET_KEYS, _PRESET_SECTIONS)
    p.controls(data)
    tables = {sec: p.table(sec, data[sec]) for sec in _PRESET_SECTIONS if sec in data}
    dataloader = _preset_dataloader(p, t) if (t := tables.get("dataloader")) else DataLoaderCfg()
    threads = _preset_threads(p, t) if (t := tables.get("threads")) else ThreadsCfg()
    env = _string_table(p, "env", t) if (t := tables.get("env")) else {}
    train = {k: check_train_value(p, "train", k, v) for k, v in (tables.get("train") or {}).items()}
    if "OMP_NUM_THREADS" in env and threads.omp_num_threads is not None:
        p.add("env", "OMP_NUM_THREADS", "also set by [threads] omp_num_threads; keep only one")
    description = p.str_(None, "description", data["description"]) if "description" in data else ""
    rate = (
        p.number(None, "expected_rate", data["expected_rate"], positive=True)
        if "expected_rate" in data
        else None
    )
    args = p.str_list(None, "args", data["args"]) if "args" in data else ()
    return Preset(
        name=name,
        path=path,
        description=description or "",
        dataloader=dataloader,
        threads=threads,
        train=train,
        env=env,
        args=args or (),
        expected_rate=rate,
    )


def preset_problems(text: str | Mapping[str, Any], file: str | os.PathLike[str]) -> list[ConfigError]:
    """Every problem in a preset's TOML text (or parsed table); ``[]`` when it is fine."""
    file = str(file)
    try:
        data = parse_toml(text, file) if isinstance(text, str) else text
    except ConfigError as exc:
        return [exc]
    p = Problems(file, text if isinstance(text, str) else None)
    _validate_preset(data, p, Path(file).stem, None)
    return p.sorted()


def preset_from_text(text: str, file: str | os.PathLike[str], name: str | None = None) -> Preset:
    """Parse and validate preset text; raises :class:`ConfigError` listing every problem."""
    file_s = str(file)
    data = parse_toml(text, file_s)
    p = Problems(file_s, text)
    preset = _validate_preset(data, p, name or Path(file_s).stem, Path(file_s))
    p.raise_if_any()
    return preset


def keys_without_effect(preset: Preset, kind: str, python: bool, integration: str | None = None) -> list[str]:
    """Why keys of ``preset`` cannot act on a job (one line each; [] when all can): ``kind``
    the job's, ``python`` whether its command is a Python script trainctl instruments,
    ``integration`` the library integration that attached (None: not known yet).
    ``[train]`` keys are trainer arguments: only Ultralytics takes them (its kind, or its
    integration), and a plain script's ``compile = false`` (src/trainctl/inside/plain_torch.py)."""
    if kind == "ultralytics" or integration == "ultralytics":
        return []
    out = []
    for key in preset.train:
        if key == "compile" and python and kind == "command":
            continue
        if key == "compile":
            why = "turns torch.compile off only in a Python script trainctl instruments (not --no-instrument)"
        elif integration is None and python:
            continue  # an Ultralytics script may still attach
        else:
            why = "trainer arguments reach only Ultralytics; a command gets the preset's args"
        out.append(f"preset {preset.name}: [train] {key}: {why}")
    return out
