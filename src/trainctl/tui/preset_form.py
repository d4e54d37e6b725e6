"""The preset editor's form model (no Textual): text ↔ field strings ↔ new text.

Every field is edited as a string.  :func:`build_text` turns the form back into TOML by
changing only what differs, over the original text with tomlkit
(``update_preset_text``), so comments and order survive.  A value that does not parse
(``workers = two``) is written as a string, so ``preset_problems`` reports it with the
key's name, exactly as the engine would.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import dataclass
from typing import Any

from trainctl.config import MP_CONTEXTS, SHARING_STRATEGIES, ConfigError, preset_problems, update_preset_text

TABLE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")
LABEL = re.compile(r"\[(\w+)\]\s*(\S*)")


@dataclass(frozen=True)
class Field:
    """One form field: ``section`` None for top-level keys; kind decides the widget."""

    section: str | None
    key: str
    kind: str  # text | int | float | bool | choice | table | env | args
    help: str = ""
    choices: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.section}-{self.key}" if self.section and self.key else (self.section or self.key)

    @property
    def label(self) -> str:
        return f"[{self.section}] {self.key}".strip() if self.section else self.key


FIELDS: tuple[Field, ...] = (
    Field(None, "description", "text", "one line shown in preset lists"),
    Field(None, "expected_rate", "float", "declared batches/s: used until measured"),
    Field("dataloader", "workers", "int", "DataLoader worker processes (0: none)"),
    Field("dataloader", "persistent_workers", "bool", "keep workers between epochs"),
    Field("dataloader", "prefetch_factor", "int", "batches queued per worker"),
    Field("dataloader", "multiprocessing_context", "choice", "how workers start", MP_CONTEXTS),
    Field("dataloader", "sharing_strategy", "choice", "tensor sharing between processes", SHARING_STRATEGIES),
    Field("dataloader", "pin_memory", "bool", "page-locked batches (faster copies to the GPU)"),
    Field("threads", "omp_num_threads", "int", "OMP_NUM_THREADS"),
    Field("threads", "torch_num_threads", "int", "torch.set_num_threads()"),
    Field("train", "", "table", "trainer arguments: key = TOML value, one a line"),
    Field("env", "", "env", "environment: NAME=value, one a line"),
    Field(None, "args", "args", "appended to a generic command (shell words)"),
)
BY_ID = {f.id: f for f in FIELDS}


def _show(value: Any) -> str:
    """A value as the user would type it (TOML for booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _toml_value(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return _show(value)


def parse_data(text: str) -> dict[str, Any]:
    """The preset as plain data; {} when the text is not valid TOML."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return {}


def form_values(text: str) -> dict[str, str]:
    """The string each field starts with, from the preset's text."""
    data = parse_data(text)
    values: dict[str, str] = {}
    for f in FIELDS:
        if f.kind == "table":
            assert f.section is not None  # a table field is a whole section
            table = data.get(f.section) or {}
            values[f.id] = "\n".join(f"{k} = {_toml_value(v)}" for k, v in table.items())
        elif f.kind == "env":
            assert f.section is not None  # so is the environment
            table = data.get(f.section) or {}
            values[f.id] = "\n".join(f"{k}={v}" for k, v in table.items())
        elif f.kind == "args":
            args = data.get("args")
            values[f.id] = (
                shlex.join(args)
                if isinstance(args, list) and all(isinstance(a, str) for a in args)
                else _show(args)
            )
        else:
            source = data.get(f.section) or {} if f.section else data
            values[f.id] = _show(source.get(f.key)) if isinstance(source, dict) else ""
    return values


def _scalar(kind: str, raw: str) -> Any:
    """A typed value for a scalar field; the raw string when it does not parse."""
    raw = raw.strip()
    if raw == "":
        return None
    if kind == "int":
        try:
            return int(raw)
        except ValueError:
            return raw
    if kind == "float":
        try:
            return float(raw) if not raw.lstrip("-").isdigit() else int(raw)
        except ValueError:
            return raw
    if kind == "bool":
        return {"true": True, "false": False}.get(raw.lower(), raw)
    return raw


def _table_lines(f: Field, raw: str, file: str, problems: list[ConfigError]) -> dict[str, Any]:
    """``key = value`` lines (train: TOML values, bare words as strings; env: strings)."""
    out: dict[str, Any] = {}
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            example = "batch = 16" if f.kind == "table" else "NAME=value"
            problems.append(
                ConfigError(
                    file, f"[{f.section}]", f"line {number}: expected {example}, got {line.strip()!r}"
                )
            )
            continue
        if f.kind == "table" and not TABLE_KEY.match(key):
            problems.append(
                ConfigError(file, f"[{f.section}] {key}", "a key is letters, digits, _ and - only")
            )
            continue
        try:
            parsed = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            parsed = value
        out[key] = str(parsed) if f.kind == "env" and not isinstance(parsed, str) else parsed
    return out


def _args(raw: str, file: str, problems: list[ConfigError]) -> list[str] | None:
    if not raw.strip():
        return None
    try:
        return shlex.split(raw)
    except ValueError as exc:
        problems.append(ConfigError(file, "args", f"cannot split into words: {exc}"))
        return None


def build_text(original: str, values: dict[str, str], file: str) -> tuple[str, list[ConfigError]]:
    """The new preset text and every problem (the form's own, then the engine's)."""
    problems: list[ConfigError] = []
    data = parse_data(original)
    changes: dict[str, Any] = {}
    for f in FIELDS:
        raw = values.get(f.id, "")
        if f.kind in ("table", "env"):
            assert f.section is not None  # a table or env field is a whole section
            got = data.get(f.section)
            old_table: dict[str, Any] = got if isinstance(got, dict) else {}
            new = _table_lines(f, raw, file, problems)
            section = {
                k: v
                for k, v in new.items()
                if old_table.get(k, object()) != v or type(old_table.get(k)) is not type(v)
            }
            section.update({k: None for k in old_table if k not in new})
            if section:
                changes[f.section] = section
            continue
        value = _args(raw, file, problems) if f.kind == "args" else _scalar(f.kind, raw)
        old_source = data.get(f.section) if f.section else data
        old = old_source.get(f.key) if isinstance(old_source, dict) else None
        if value == old and type(value) is type(old):
            continue
        if f.section:
            changes.setdefault(f.section, {})[f.key] = value
        else:
            changes[f.key] = value
    try:
        text = update_preset_text(original, changes, file) if changes else original
    except ConfigError as exc:
        return original, [*problems, exc]
    return text, [*problems, *preset_problems(text, file)]


def field_for(problem: ConfigError) -> str | None:
    """The id of the form field a problem is about, or None (whole file, unknown key)."""
    label = problem.key
    if label in BY_ID:
        return label
    match = LABEL.match(label)
    if not match:
        return None
    section, key = match.groups()
    if section in ("train", "env"):
        return section
    field_id = f"{section}-{key}"
    return field_id if field_id in BY_ID else None
