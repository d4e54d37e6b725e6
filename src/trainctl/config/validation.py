"""The validation kit of config files: :class:`ConfigError` and the field checkers.

Every problem names the file, the key and what is allowed::

    presets/A.toml: [dataloader] workers: must be an integer >= 0 (got -1)

:class:`Problems` collects them for one file (with best-effort line numbers); its
checkers (``int_``, ``number``, ``bool_``, ``str_``, ``choice``, ``str_list``, ``table``,
``unknown``) return the value, or None after recording what is wrong.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainctl.core.statefile import UnsafePathError, read_regular

SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+\Z")
_TOML_POS = re.compile(r"at line (\d+),? col(?:umn)? (\d+)")  # tomllib's and tomlkit's words


class ConfigError(Exception):
    """A problem in a config file: ``str()`` reads ``FILE: KEY: MESSAGE``.

    ``key`` is a label such as ``[dataloader] workers``, ``[env]`` or ``args`` (empty
    when the whole file is at fault); ``line`` is 1-based when known.  When several
    problems were found, ``problems`` holds them all and ``str()`` lists one per line.
    """

    def __init__(self, file: str | os.PathLike[str], key: str, message: str, line: int | None = None) -> None:
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


def show(value: Any) -> str:
    """A value as it would be written in TOML, for messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list):
        return "[" + ", ".join(show(v) for v in value) + "]"
    return str(value)


def choices(options: Sequence[str]) -> str:
    return ", ".join(show(o) for o in options)


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


class Problems:
    """Collects the problems of one file."""

    def __init__(self, file: str, text: str | None = None) -> None:
        self.file = file
        self.text = text
        self.items: list[ConfigError] = []

    def add(self, section: str | None, key: str | None, message: str) -> None:
        line = _find_line(self.text, section, key)
        section, key = (
            _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], x) if x else x for x in (section, key)
        )  # a message never carries a control character
        self.items.append(ConfigError(self.file, _label(section, key), message, line))

    def sorted(self) -> list[ConfigError]:
        """The problems in file order (without a line, or in other files, last)."""
        return sorted(self.items, key=lambda e: (e.file != self.file, e.line is None, e.line or 0))

    def raise_if_any(self) -> None:
        if self.items:
            raise ConfigError.joined(self.sorted())

    def controls(self, data: Any, sec: str | None = None, key: str | None = None) -> None:
        """Record every string (a key or a value, at any depth) holding NUL or another
        control character (:data:`_CONTROL`): an environment or argv cannot carry a NUL, and
        a terminal obeys escapes."""
        if isinstance(data, Mapping):
            for k, v in data.items():
                here_sec, here_key = (
                    (k, None)
                    if sec is None and isinstance(v, Mapping)
                    else (sec, k if key is None else f"{key}.{k}")
                )
                bad = _control_char(str(k))
                if bad:
                    self.add(sec, str(k), f"the name holds a control character ({bad})")
                    continue
                self.controls(v, here_sec, here_key)
        elif isinstance(data, list):
            for i, v in enumerate(data):
                self.controls(v, sec, f"{key}[{i}]" if key else f"[{i}]")
        elif isinstance(data, str):
            bad = _control_char(data)
            if bad:
                self.add(sec, key, f"holds a control character ({bad}): not allowed in a value")

    # Checkers: each returns the value, or None after recording a problem.
    def int_(self, sec: str | None, key: str, value: Any, minimum: int) -> int | None:
        if type(value) is not int or value < minimum:
            self.add(sec, key, f"must be an integer >= {minimum} (got {show(value)})")
            return None
        return value

    def number(self, sec: str | None, key: str, value: Any, *, positive: bool) -> float | None:
        ok = type(value) in (int, float) and math.isfinite(value)
        ok = ok and (value > 0 if positive else value >= 0)
        if not ok:
            rule = "> 0" if positive else ">= 0"
            self.add(sec, key, f"must be a number {rule} (got {show(value)})")
            return None
        return float(value)

    def bool_(self, sec: str | None, key: str, value: Any) -> bool | None:
        if type(value) is not bool:
            hint = " (a TOML boolean: no quotes)" if isinstance(value, str) else ""
            self.add(sec, key, f"must be true or false{hint} (got {show(value)})")
            return None
        return value

    def str_(self, sec: str | None, key: str, value: Any, *, nonempty: bool = False) -> str | None:
        if not isinstance(value, str) or (nonempty and not value.strip()):
            what = "a non-empty string" if nonempty else "a string"
            self.add(sec, key, f"must be {what} (got {show(value)})")
            return None
        return value

    def choice(self, sec: str | None, key: str, value: Any, options: Sequence[str]) -> str | None:
        if value not in options or not isinstance(value, str):
            self.add(sec, key, f"must be one of {choices(options)} (got {show(value)})")
            return None
        return value

    def str_list(self, sec: str | None, key: str, value: Any) -> tuple[str, ...] | None:
        if not isinstance(value, list):
            self.add(sec, key, f'must be a list of strings, e.g. ["--flag", "value"] (got {show(value)})')
            return None
        bad = [i for i, item in enumerate(value) if not isinstance(item, str)]
        if bad:
            self.add(
                sec, key, f"must be a list of strings (item {bad[0] + 1} is {show(value[bad[0]])}; quote it)"
            )
            return None
        return tuple(value)

    def table(self, sec: str, value: Any) -> Mapping[str, Any] | None:
        if not isinstance(value, Mapping):
            self.add(None, sec, f"must be a table: write it as a [{sec}] section (got {show(value)})")
            return None
        return value

    def unknown(
        self, sec: str | None, data: Mapping[str, Any], keys: Sequence[str], sections: Sequence[str] = ()
    ) -> None:
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


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
"""Control characters (NUL, ESC, CR, C1...): a tab and a newline are text (a multi-line
description or environment value is passed on literally)."""
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # escaped in a message


def _control_char(text: str) -> str | None:
    """The first control character of ``text`` as U+XXXX, or None."""
    m = _CONTROL.search(text)
    return f"U+{ord(m.group()):04X}" if m else None


if sys.version_info >= (3, 11):
    import tomllib

    def _loads(text: str) -> dict[str, Any]:
        return tomllib.loads(text)

else:  # Python 3.8-3.10: the trainer's interpreter, where trainctl.inside reads the preset

    def _loads(text: str) -> dict[str, Any]:
        """tomli's reading (tomllib's own code, in most environments: pip, pytest and black
        need it before 3.11), else tomlkit's as plain values (trainctl's dependency, and the
        bootstrap's fallback where the trainer's interpreter has none of its own).  An
        ImportError that says so when neither imports (a tomlkit too new for this Python):
        :func:`parse_toml` makes it the file's ConfigError, which every reader of a preset
        inside the trainer says once."""
        try:
            import tomli

            return tomli.loads(text)
        except ImportError:
            pass
        try:
            import tomlkit
        except Exception as exc:  # noqa: BLE001 - a tomlkit too new for this Python fails in its body
            raise ImportError(
                f"reading TOML on Python {sys.version.split()[0]} needs tomli or tomlkit "
                f"({type(exc).__name__}: {exc}); pip install tomli"
            ) from None
        return tomlkit.parse(text).unwrap()


def parse_toml(text: str, file: str) -> dict[str, Any]:
    try:
        return _loads(text)
    except ImportError as exc:  # Python 3.8-3.10 with neither tomli nor a tomlkit for it
        raise ConfigError(file, "", str(exc)) from None
    except ValueError as exc:  # tomllib.TOMLDecodeError, tomlkit's ParseError
        match = _TOML_POS.search(str(exc))
        line = int(match.group(1)) if match else None
        raise ConfigError(file, "", f"invalid TOML: {exc}", line) from None


MAX_CONFIG_FILE = 16 << 20  # a job file or a preset: a few KB


def read_text(path: Path, file: str) -> str:
    """A job file or a preset, as the user named it (links followed, any owner): a regular
    file only (a FIFO or a device is refused at once, never waited on), at most
    :data:`MAX_CONFIG_FILE` bytes; ConfigError saying why otherwise."""
    try:
        return read_regular(path, MAX_CONFIG_FILE, named=True).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(file, "", "no such file") from None
    except IsADirectoryError:
        raise ConfigError(file, "", "is a directory, not a TOML file") from None
    except UnsafePathError as exc:
        why, prefix = str(exc), f"{path}: "  # (no str.removeprefix: Python 3.8 runs this)
        raise ConfigError(file, "", why[len(prefix) :] if why.startswith(prefix) else why) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(file, "", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(file, "", f"cannot read: {exc.strerror}") from None
