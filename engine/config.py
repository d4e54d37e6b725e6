"""Presets and job files: typed, validated configuration.

Read with :mod:`tomllib`; written with :mod:`tomlkit` so comments and order survive.
Every problem is a :class:`ConfigError` that names the file, the key and what is allowed::

    presets/A.toml: [dataloader] workers: must be an integer >= 0 (got -1)

A preset (``presets/A.toml``) has ``description``, ``expected_rate``, ``args`` and the
sections ``[dataloader]``, ``[threads]``, ``[train]`` and ``[env]``.  A job file
(``trainctl.toml``) names what to run (``kind = "ultralytics"`` or ``"command"``), the
presets, the deadline and budget, and the restart policy.
"""
from __future__ import annotations

import datetime as dt
import difflib
import json
import math
import os
import re
import shlex
import string
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError

__all__ = [
    "ConfigError", "DataLoaderCfg", "ThreadsCfg", "Preset", "Job",
    "preset_problems", "preset_from_text", "load_preset", "list_presets",
    "preset_search_dirs", "user_config_dir", "save_preset_text", "update_preset_text",
    "update_preset_values", "diff_text", "new_preset_from", "load_job", "job_problems",
    "parse_deadline", "expand_resume_args",
]

MP_CONTEXTS = ("fork", "spawn", "forkserver")
SHARING_STRATEGIES = ("file_descriptor", "file_system")
JOB_KINDS = ("ultralytics", "command")
JOB_FILE_NAME = "trainctl.toml"

_DATALOADER_KEYS = ("workers", "persistent_workers", "prefetch_factor",
                    "multiprocessing_context", "sharing_strategy")
_THREADS_KEYS = ("omp_num_threads", "torch_num_threads")
_PRESET_SECTIONS = ("dataloader", "threads", "train", "env")
_PRESET_KEYS = ("description", "expected_rate", "args")
_JOB_KEYS = ("name", "kind", "description", "command", "preset", "fallback", "deadline",
             "cost_per_hour", "budget", "currency", "run_dir", "resume_args", "max_restarts")
_JOB_SECTIONS = ("ultralytics", "stall", "host")
_STALL_KEYS = ("startup_timeout", "train_timeout", "val_timeout")
_HOST_KEYS = ("destination", "workdir", "trainctl")
_RESUME_FIELDS = ("checkpoint",)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+\Z")
_TOML_POS = re.compile(r"at line (\d+), column (\d+)")


# --------------------------------------------------------------------------- errors

class ConfigError(Exception):
    """A problem in a config file: ``str()`` reads ``FILE: KEY: MESSAGE``.

    ``key`` is a label such as ``[dataloader] workers``, ``[env]`` or ``args`` (empty
    when the whole file is at fault); ``line`` is 1-based when known.  When several
    problems were found, ``problems`` holds them all and ``str()`` lists one per line.
    """

    def __init__(self, file: str | os.PathLike[str], key: str, message: str,
                 line: int | None = None) -> None:
        super().__init__(str(file), key, message)
        self.file = str(file)
        self.key = key
        self.message = message
        self.line = line
        self.problems: tuple[ConfigError, ...] = (self,)

    def describe(self) -> str:
        """This one problem on one line (without the others in ``problems``)."""
        return ": ".join(part for part in (self.file, self.key, self.message) if part)

    def __str__(self) -> str:
        return "\n".join(p.describe() for p in self.problems)

    @classmethod
    def joined(cls, problems: Sequence[ConfigError]) -> ConfigError:
        """One error carrying all ``problems`` (its own fields are the first one's)."""
        first = problems[0]
        err = cls(first.file, first.key, first.message, first.line)
        err.problems = tuple(problems)
        return err


def _show(value: Any) -> str:
    """A value as it would be written in TOML, for messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def _choices(options: Sequence[str]) -> str:
    return ", ".join(_show(o) for o in options)


def _label(section: str | None, key: str | None) -> str:
    if section is None:
        return key or ""
    return f"[{section}] {key}" if key else f"[{section}]"


def _find_line(text: str | None, section: str | None, key: str | None) -> int | None:
    """Best-effort 1-based line of ``key`` in ``[section]`` (or of the header)."""
    if not text:
        return None
    header = re.compile(r"\s*\[\s*([^\]]+?)\s*\]")
    key_re = re.compile(r"\s*[\"']?" + re.escape(key) + r"[\"']?\s*=") if key else None
    current: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        match = header.match(line)
        if match and not line.lstrip().startswith("[["):
            current = match.group(1).strip("\"'")
            if key is None and current == section:
                return number
            continue
        if key_re is not None and current == section and key_re.match(line):
            return number
    return None


class _Problems:
    """Collects the problems of one file."""

    def __init__(self, file: str, text: str | None = None) -> None:
        self.file = file
        self.text = text
        self.items: list[ConfigError] = []

    def add(self, section: str | None, key: str | None, message: str) -> None:
        line = _find_line(self.text, section, key)
        self.items.append(ConfigError(self.file, _label(section, key), message, line))

    def sorted(self) -> list[ConfigError]:
        """The problems in file order (without a line, or in other files, last)."""
        return sorted(self.items, key=lambda e: (e.file != self.file, e.line is None, e.line or 0))

    def raise_if_any(self) -> None:
        if self.items:
            raise ConfigError.joined(self.sorted())

    # Checkers: each returns the value, or None after recording a problem.
    def int_(self, sec: str | None, key: str, value: Any, minimum: int) -> int | None:
        if type(value) is not int or value < minimum:
            self.add(sec, key, f"must be an integer >= {minimum} (got {_show(value)})")
            return None
        return value

    def number(self, sec: str | None, key: str, value: Any, *, positive: bool) -> float | None:
        ok = type(value) in (int, float) and math.isfinite(value)
        ok = ok and (value > 0 if positive else value >= 0)
        if not ok:
            rule = "> 0" if positive else ">= 0"
            self.add(sec, key, f"must be a number {rule} (got {_show(value)})")
            return None
        return float(value)

    def bool_(self, sec: str | None, key: str, value: Any) -> bool | None:
        if type(value) is not bool:
            hint = " (a TOML boolean: no quotes)" if isinstance(value, str) else ""
            self.add(sec, key, f"must be true or false{hint} (got {_show(value)})")
            return None
        return value

    def str_(self, sec: str | None, key: str, value: Any, *, nonempty: bool = False) -> str | None:
        if not isinstance(value, str) or (nonempty and not value.strip()):
            what = "a non-empty string" if nonempty else "a string"
            self.add(sec, key, f"must be {what} (got {_show(value)})")
            return None
        return value

    def choice(self, sec: str | None, key: str, value: Any, options: Sequence[str]) -> str | None:
        if value not in options or not isinstance(value, str):
            self.add(sec, key, f"must be one of {_choices(options)} (got {_show(value)})")
            return None
        return value

    def str_list(self, sec: str | None, key: str, value: Any) -> tuple[str, ...] | None:
        if not isinstance(value, list):
            self.add(sec, key, f"must be a list of strings, e.g. [\"--flag\", \"value\"] (got {_show(value)})")
            return None
        bad = [i for i, item in enumerate(value) if not isinstance(item, str)]
        if bad:
            self.add(sec, key, f"must be a list of strings (item {bad[0] + 1} is {_show(value[bad[0]])}; "
                                "quote it)")
            return None
        return tuple(value)

    def table(self, sec: str, value: Any) -> Mapping[str, Any] | None:
        if not isinstance(value, Mapping):
            self.add(None, sec, f"must be a table: write it as a [{sec}] section (got {_show(value)})")
            return None
        return value

    def unknown(self, sec: str | None, data: Mapping[str, Any], keys: Sequence[str],
                sections: Sequence[str] = ()) -> None:
        for name, value in data.items():
            if name in keys or name in sections:
                continue
            close = difflib.get_close_matches(name, [*keys, *sections], n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            if sec is None and isinstance(value, Mapping):
                allowed = ", ".join(f"[{s}]" for s in sections)
                self.add(name, None, f"unknown section; allowed sections: {allowed}{hint}")
            else:
                allowed = ", ".join(keys) if keys else "none"
                if sections:
                    allowed += "; sections: " + ", ".join(f"[{s}]" for s in sections)
                self.add(sec, name, f"unknown key; allowed keys: {allowed}{hint}")


def _parse_toml(text: str, file: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = _TOML_POS.search(str(exc))
        line = int(match.group(1)) if match else None
        raise ConfigError(file, "", f"invalid TOML: {exc}", line) from None


def _read_text(path: Path, file: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(file, "", "no such file") from None
    except IsADirectoryError:
        raise ConfigError(file, "", "is a directory, not a TOML file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(file, "", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(file, "", f"cannot read: {exc.strerror}") from None


# --------------------------------------------------------------------------- presets

@dataclass(frozen=True)
class DataLoaderCfg:
    """``[dataloader]``: None means "leave the trainer's default"."""

    workers: int | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    multiprocessing_context: str | None = None
    sharing_strategy: str | None = None


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
        if dl.workers:
            optional = {"persistent_workers": dl.persistent_workers,
                        "prefetch_factor": dl.prefetch_factor,
                        "multiprocessing_context": dl.multiprocessing_context}
            kwargs.update({k: v for k, v in optional.items() if v is not None})
        return kwargs


def _check_train_value(p: _Problems, sec: str, key: str, value: Any) -> Any:
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
            p.add(sec, key, "must be an integer >= 1, -1 (auto), or a fraction of GPU memory "
                            f"between 0 and 1 (got {_show(value)})")
            return None
        return value
    if key in ("epochs", "imgsz"):
        return p.int_(sec, key, value, 1)
    if isinstance(value, bool | int | float | str) and not (
            isinstance(value, float) and not math.isfinite(value)):
        return value
    p.add(sec, key, f"must be a string, number or boolean (got {_show(value)})")
    return None


def _preset_dataloader(p: _Problems, table: Mapping[str, Any]) -> DataLoaderCfg:
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
    )
    if cfg.workers or ("workers" in table and cfg.workers is None):
        return cfg  # workers > 0, or a bad workers value already reported
    have = "workers is not set" if cfg.workers is None else f"got workers = {cfg.workers}"
    worker_only = {"persistent_workers": cfg.persistent_workers is True,
                   "prefetch_factor": cfg.prefetch_factor is not None,
                   "multiprocessing_context": cfg.multiprocessing_context is not None}
    for key in (k for k, is_set in worker_only.items() if is_set):
        p.add(sec, key, f"only allowed with [dataloader] workers > 0 ({have}); "
                        "remove it or set workers >= 1")
    return cfg


def _preset_threads(p: _Problems, table: Mapping[str, Any]) -> ThreadsCfg:
    p.unknown("threads", table, _THREADS_KEYS)
    values = {k: p.int_("threads", k, table[k], 1) for k in _THREADS_KEYS if k in table}
    return ThreadsCfg(**values)


def _string_table(p: _Problems, sec: str, table: Mapping[str, Any]) -> dict[str, str]:
    """``[env]``: environment variable names to string values."""
    env: dict[str, str] = {}
    for name, value in table.items():
        if not _ENV_NAME.match(name):
            p.add(sec, name, "not a valid environment variable name: letters, digits and _, "
                             "not starting with a digit")
        elif name.startswith("TRAINCTL_"):
            p.add(sec, name, "names starting with TRAINCTL_ are set by trainctl; choose another name")
        elif not isinstance(value, str):
            p.add(sec, name, f"must be a string: quote it, {name} = {json.dumps(_show(value))} "
                             f"(got {_show(value)})")
        else:
            env[name] = value
    return env


def _validate_preset(data: Mapping[str, Any], p: _Problems, name: str,
                     path: Path | None) -> Preset:
    p.unknown(None, data, _PRESET_KEYS, _PRESET_SECTIONS)
    tables = {sec: p.table(sec, data[sec]) for sec in _PRESET_SECTIONS if sec in data}
    dataloader = _preset_dataloader(p, tables["dataloader"]) if tables.get("dataloader") else DataLoaderCfg()
    threads = _preset_threads(p, tables["threads"]) if tables.get("threads") else ThreadsCfg()
    env = _string_table(p, "env", tables["env"]) if tables.get("env") else {}
    train = {k: _check_train_value(p, "train", k, v) for k, v in (tables.get("train") or {}).items()}
    if "OMP_NUM_THREADS" in env and threads.omp_num_threads is not None:
        p.add("env", "OMP_NUM_THREADS", "also set by [threads] omp_num_threads; keep only one")
    description = p.str_(None, "description", data["description"]) if "description" in data else ""
    rate = p.number(None, "expected_rate", data["expected_rate"], positive=True) \
        if "expected_rate" in data else None
    args = p.str_list(None, "args", data["args"]) if "args" in data else ()
    return Preset(name=name, path=path, description=description or "", dataloader=dataloader,
                  threads=threads, train=train, env=env, args=args or (), expected_rate=rate)


def preset_problems(text: str | Mapping[str, Any], file: str | os.PathLike[str]) -> list[ConfigError]:
    """Every problem in a preset's TOML text (or parsed table); ``[]`` when it is fine."""
    file = str(file)
    try:
        data = _parse_toml(text, file) if isinstance(text, str) else text
    except ConfigError as exc:
        return [exc]
    p = _Problems(file, text if isinstance(text, str) else None)
    _validate_preset(data, p, Path(file).stem, None)
    return p.sorted()


def preset_from_text(text: str, file: str | os.PathLike[str], name: str | None = None) -> Preset:
    """Parse and validate preset text; raises :class:`ConfigError` listing every problem."""
    file_s = str(file)
    data = _parse_toml(text, file_s)
    p = _Problems(file_s, text)
    preset = _validate_preset(data, p, name or Path(file_s).stem, Path(file_s))
    p.raise_if_any()
    return preset


def user_config_dir() -> Path:
    """``$TRAINCTL_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/trainctl`` or ``~/.config/trainctl``."""
    if os.environ.get("TRAINCTL_CONFIG_DIR"):
        return Path(os.environ["TRAINCTL_CONFIG_DIR"])
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "trainctl"


def _packaged_presets_dir() -> Path | None:
    try:
        return Path(str(resources.files("trainctl.presets")))
    except (ModuleNotFoundError, TypeError):
        return None


def preset_search_dirs(search_dirs: Sequence[Path] | None = None) -> list[Path]:
    """Where preset names are looked up, first match wins: ``search_dirs``, ``./presets``,
    the user's ``<config dir>/presets``, then the presets shipped with trainctl."""
    dirs = [Path(d) for d in search_dirs or ()]
    dirs += [Path("presets"), user_config_dir() / "presets"]
    packaged = _packaged_presets_dir()
    if packaged is not None:
        dirs.append(packaged)
    unique: list[Path] = []
    for d in dirs:
        if not any(_same_dir(d, u) for u in unique):
            unique.append(d)
    return unique


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return a == b


def list_presets(search_dirs: Sequence[Path] | None = None) -> list[Path]:
    """The preset file each name resolves to (earlier directories shadow later), by name."""
    found: dict[str, Path] = {}
    for directory in preset_search_dirs(search_dirs):
        if directory.is_dir():
            for path in sorted(directory.glob("*.toml")):
                found.setdefault(path.stem, path)
    return [found[name] for name in sorted(found)]


def _is_path_ref(ref: str | os.PathLike[str]) -> bool:
    if isinstance(ref, os.PathLike):
        return True
    return "/" in ref or os.sep in ref or ref.endswith(".toml")


def load_preset(ref: str | os.PathLike[str], search_dirs: Sequence[Path] | None = None) -> Preset:
    """Load a preset by path (``ref`` contains ``/`` or ends with ``.toml``) or by name.

    Names are looked up in :func:`preset_search_dirs`; an unknown name raises
    :class:`ConfigError` listing the names that exist.
    """
    if _is_path_ref(ref):
        path = Path(ref)
    else:
        if not ref:
            raise ConfigError("", "preset", "empty preset name")
        matches = [d / f"{ref}.toml" for d in preset_search_dirs(search_dirs)]
        path = next((m for m in matches if m.is_file()), None)
        if path is None:
            names = ", ".join(p.stem for p in list_presets(search_dirs)) or "none"
            where = ", ".join(str(d) for d in preset_search_dirs(search_dirs))
            raise ConfigError("", "preset", f"no preset named {_show(ref)}; available: {names} "
                                            f"(looked in {where})")
    return preset_from_text(_read_text(path, str(path)), path)


def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_preset_text(path: str | os.PathLike[str], text: str) -> Preset:
    """Validate ``text`` (refused with :class:`ConfigError`), then write it atomically."""
    path = Path(path)
    preset = preset_from_text(text, path)
    _atomic_write(path, text)
    return preset


def update_preset_text(text: str, changes: Mapping[str, Any], file: str | os.PathLike[str] = "") -> str:
    """Apply ``changes`` to preset text, keeping comments and order (tomlkit).

    ``changes`` maps a section name to ``{key: value}`` or a top-level key to a value;
    ``None`` removes a key.  Returns the new text; nothing is validated or written.
    """
    try:
        doc = tomlkit.parse(text)
    except TOMLKitError as exc:
        line = getattr(exc, "line", None)
        raise ConfigError(str(file), "", f"invalid TOML: {exc}", line) from None
    for key, value in changes.items():
        if isinstance(value, Mapping):
            table = doc.get(key)
            if table is None:
                if all(v is None for v in value.values()):
                    continue
                table = tomlkit.table()
                doc[key] = table
            for sub, sub_value in value.items():
                if sub_value is None:
                    table.pop(sub, None)
                else:
                    table[sub] = sub_value
        elif value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    return tomlkit.dumps(doc)


def update_preset_values(path: str | os.PathLike[str], changes: Mapping[str, Any]) -> str:
    """:func:`update_preset_text` on the file at ``path``; returns the new text (not written)."""
    path = Path(path)
    return update_preset_text(_read_text(path, str(path)), changes, path)


def diff_text(old: str, new: str, path: str | os.PathLike[str]) -> str:
    """A unified diff from the saved ``old`` text to the edited ``new`` text."""
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile=f"{path} (saved)", tofile=f"{path} (edited)")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                   for line in lines)


def new_preset_from(src_path: str | os.PathLike[str], new_path: str | os.PathLike[str],
                    name: str | None = None) -> Preset:
    """Copy a preset, comments and all, to a new file; never overwrites.

    ``new_path`` is the new file, or an existing directory to hold ``<name>.toml``.
    The source is validated first; the copy starts with a "Copied from" comment.
    """
    src, dest = Path(src_path), Path(new_path)
    if dest.is_dir():
        if not name or not _SAFE_NAME.match(name):
            raise ConfigError(str(dest), "name", "a new preset needs a name of letters, digits, "
                                                 f"'.', '_' or '-' (got {_show(name)})")
        dest = dest / f"{name}.toml"
    if dest.exists():
        raise ConfigError(str(dest), "", "already exists; choose another name")
    text = _read_text(src, str(src))
    preset_from_text(text, src)
    header = f"# Copied from {src.name}.\n"
    return save_preset_text(dest, header + text)


# --------------------------------------------------------------------------- jobs

@dataclass(frozen=True)
class Job:
    """A validated job file (``trainctl.toml``)."""

    name: str
    kind: str  # "ultralytics" | "command"
    path: Path | None = None
    command: tuple[str, ...] = ()
    ultralytics: dict[str, Any] = field(default_factory=dict)
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
    if _is_path_ref(ref):
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
            raise ValueError("must be an ISO 8601 date and time, e.g. 2025-11-28T18:00 (local) or "
                             f"2025-11-28T18:00+01:00 (got {_show(value)})") from None
    if isinstance(value, dt.datetime):
        return value.timestamp()
    if isinstance(value, dt.date):
        return dt.datetime.combine(value, dt.time()).timestamp()
    raise ValueError(f"must be an ISO 8601 date and time, e.g. 2025-11-28T18:00 (got {_show(value)})")


def expand_resume_args(args: Sequence[str], checkpoint: str | os.PathLike[str] | None) -> tuple[str, ...]:
    """``resume_args`` with ``{checkpoint}`` filled in.

    Returns ``()`` when an argument needs a checkpoint and there is none: the restart
    is then a fresh start.
    """
    needs = any("{checkpoint" in a for a in args)
    if needs and checkpoint is None:
        return ()
    return tuple(a.format(checkpoint=str(checkpoint)) for a in args)


def _placeholders(arg: str) -> list[str] | None:
    try:
        return [f for _, f, _, _ in string.Formatter().parse(arg) if f is not None]
    except ValueError:
        return None


def _job_ultralytics(p: _Problems, table: Mapping[str, Any], job_dir: Path) -> dict[str, Any]:
    sec = "ultralytics"
    out: dict[str, Any] = {}
    for key in ("model", "data"):
        if key not in table:
            example = "yolov8n.pt" if key == "model" else "data.yaml"
            p.add(sec, key, f"required: a string, e.g. {key} = {_show(example)}")
    for key, value in table.items():
        if key in ("model", "data", "project"):
            value = p.str_(sec, key, value, nonempty=True)
            if value is not None:
                value = _resolve_job_path(key, value, job_dir)
        elif key == "device":
            if type(value) is not int and not isinstance(value, str):
                p.add(sec, key, f"must be a string or an integer, e.g. \"0\", \"0,1\" or \"cpu\" "
                                f"(got {_show(value)})")
                value = None
        elif key == "workers":
            p.add(sec, key, "not allowed here: set DataLoader workers in the preset's [dataloader] workers")
            value = None
        elif key == "resume":
            p.add(sec, key, "set by trainctl: it resumes from the last good checkpoint itself; remove it")
            value = None
        else:
            value = _check_train_value(p, sec, key, value)
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


def _job_name(p: _Problems, data: Mapping[str, Any], path: Path) -> str:
    if "name" in data:
        name = p.str_(None, "name", data["name"], nonempty=True)
        if name is not None and not _SAFE_NAME.match(name):
            p.add(None, "name", "must contain only letters, digits, '.', '_' and '-' (it names "
                                f"tmux sessions and run directories) (got {_show(name)})")
        return name or "job"
    stem = path.stem if path.stem != Path(JOB_FILE_NAME).stem else path.resolve().parent.name
    return re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-") or "job"


def _job_command(p: _Problems, data: Mapping[str, Any]) -> tuple[str, ...]:
    """``command`` of a kind = "command" job: a non-empty list of strings."""
    example = 'e.g. command = ["python", "train.py"]'
    if "ultralytics" in data:
        p.add("ultralytics", None, "only for kind = \"ultralytics\"")
    if "command" not in data:
        p.add(None, "command", f"required for kind = \"command\": a list of strings, {example}")
        return ()
    value = data["command"]
    if isinstance(value, str):
        try:
            example = f"command = {_show(shlex.split(value))}"
        except ValueError:
            pass
        p.add(None, "command", f"must be a list of strings: {example}")
        return ()
    if value == []:
        p.add(None, "command", f"must not be empty: {example}")
        return ()
    return p.str_list(None, "command", value) or ()


def _validate_job(data: Mapping[str, Any], p: _Problems, path: Path) -> Job:
    job_dir = path.parent
    p.unknown(None, data, _JOB_KEYS, _JOB_SECTIONS)
    tables = {sec: p.table(sec, data[sec]) for sec in _JOB_SECTIONS if sec in data}
    name = _job_name(p, data, path)

    kind = None
    if "kind" not in data:
        p.add(None, "kind", f"required: one of {_choices(JOB_KINDS)}")
    else:
        kind = p.choice(None, "kind", data["kind"], JOB_KINDS)

    command = _job_command(p, data) if kind == "command" else ()
    if kind == "ultralytics":
        if "command" in data:
            p.add(None, "command", "only for kind = \"command\"; use [ultralytics] model and data")
        if "resume_args" in data:
            p.add(None, "resume_args", "only for kind = \"command\" (Ultralytics runs resume natively)")
        if "ultralytics" not in data:
            p.add("ultralytics", None, "required for kind = \"ultralytics\": a section with "
                                       "model = \"...\" and data = \"...\"")
    ultralytics = _job_ultralytics(p, tables["ultralytics"], job_dir) \
        if tables.get("ultralytics") is not None and kind == "ultralytics" else {}

    presets: dict[str, str | None] = {}
    for key in ("preset", "fallback"):
        ref = p.str_(None, key, data[key], nonempty=True) if key in data else None
        if ref is not None:
            _check_job_preset(p, key, ref, job_dir)
            if _is_path_ref(ref):
                ref = str((job_dir / Path(ref).expanduser()).resolve())
        presets[key] = ref

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

    resume_args = _job_resume_args(p, data["resume_args"]) \
        if "resume_args" in data and kind != "ultralytics" else ()
    max_restarts = p.int_(None, "max_restarts", data["max_restarts"], 0) if "max_restarts" in data else 3
    stall = _job_stall(p, tables["stall"]) if tables.get("stall") is not None else {}
    host = _job_host(p, tables["host"]) if tables.get("host") is not None else None
    description = p.str_(None, "description", data["description"]) if "description" in data else ""

    return Job(name=name, kind=kind or "command", path=path, command=command,
               ultralytics=ultralytics, preset=presets["preset"], fallback=presets["fallback"],
               deadline=deadline, cost_per_hour=opt_number("cost_per_hour"),
               budget=opt_number("budget"), currency=currency or "$", run_dir=run_dir,
               resume_args=resume_args, max_restarts=3 if max_restarts is None else max_restarts,
               stall=stall, host=host, description=description or "")


def _job_resume_args(p: _Problems, value: Any) -> tuple[str, ...]:
    """``resume_args``: strings whose only placeholder is ``{checkpoint}``."""
    args = p.str_list(None, "resume_args", value) or ()
    for arg in args:
        fields = _placeholders(arg)
        if fields is None or any(f not in _RESUME_FIELDS for f in fields):
            p.add(None, "resume_args", "the only placeholder allowed is {checkpoint} "
                                       f"(write {{{{ and }}}} for braces) (got {_show(arg)})")
            return ()
    return args


def _job_stall(p: _Problems, table: Mapping[str, Any]) -> dict[str, float]:
    """``[stall]``: phase timeouts in seconds, each > 0."""
    p.unknown("stall", table, _STALL_KEYS)
    values = {k: p.number("stall", k, table[k], positive=True) for k in _STALL_KEYS if k in table}
    return {k: v for k, v in values.items() if v is not None}


def _check_job_preset(p: _Problems, key: str, ref: str, job_dir: Path) -> None:
    """Report a preset that cannot be found (under the job's key) or is invalid (its own file)."""
    if _is_path_ref(ref) and not (job_dir / Path(ref).expanduser()).is_file():
        p.add(None, key, f"no such preset file: {job_dir / ref}")
        return
    try:
        _load_job_preset(ref, job_dir)
    except ConfigError as exc:
        if exc.file:
            p.items.extend(exc.problems)
        else:
            p.add(None, key, exc.message)


def _job_host(p: _Problems, table: Mapping[str, Any]) -> dict[str, str]:
    p.unknown("host", table, _HOST_KEYS)
    if "destination" not in table:
        p.add("host", "destination", "required: an ssh destination, e.g. destination = \"user@gpu-box\"")
    return {k: v for k in _HOST_KEYS if k in table
            and (v := p.str_("host", k, table[k], nonempty=True)) is not None}


def job_problems(text: str, path: str | os.PathLike[str]) -> list[ConfigError]:
    """Every problem in a job file's text; ``[]`` when it is fine."""
    path = Path(path)
    try:
        data = _parse_toml(text, str(path))
    except ConfigError as exc:
        return [exc]
    p = _Problems(str(path), text)
    _validate_job(data, p, path)
    return p.sorted()


def load_job(path: str | os.PathLike[str]) -> Job:
    """Load and validate a job file (a directory means its ``trainctl.toml``).

    Its presets are loaded too, so a bad preset is refused before anything runs.
    """
    path = Path(path)
    if path.is_dir():
        path = path / JOB_FILE_NAME
    text = _read_text(path, str(path))
    data = _parse_toml(text, str(path))
    p = _Problems(str(path), text)
    job = _validate_job(data, p, path)
    p.raise_if_any()
    return job
