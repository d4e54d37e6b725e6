"""The agent's side of the zero-code integrations: whether a command runs Python, and the
environment that loads the bootstrap into it.  Pure but for reading a script's first line
(its ``#!``) and asking Python where trainctl's own packages are."""
from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import BOOTSTRAP_DIR, INSTRUMENT_ENV, INTEGRATIONS

PACKAGES = ("trainctl", "trainctl.engine", "trainctl.engine.config", "trainctl.engine.runners",
            "trainctl.engine.instrument")
"""trainctl's packages the integrations import in the trainer (by directory: the user's
interpreter may be another one, whose own site-packages must stay first for torch & co)."""
FALLBACK = ("tomlkit",)
"""Pure-Python modules those packages import, found last (the user's own come first)."""

_PYTHON = re.compile(r"(?:python|pypy)(?:\d+(?:\.\d+)*)?[mtw]?(?:\.exe)?$")
_ENV_ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def is_python(name: str) -> bool:
    """``python``, ``python3``, ``/venv/bin/python3.11``, ``pypy3``: a Python interpreter."""
    return bool(_PYTHON.fullmatch(os.path.basename(name)))


def _shebang_is_python(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return False
    if not first.startswith(b"#!"):
        return False
    words = first[2:].decode("utf-8", "replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-") and not _ENV_ASSIGN.match(w)]
    return bool(words) and is_python(words[0])


def python_command(argv: Sequence[str], cwd: str | os.PathLike[str] = ".") -> bool:
    """Whether ``argv`` starts a Python interpreter: ``python ...``, ``env [VAR=x] python ...``,
    or a script whose ``#!`` names Python (``./train.py``).  Launchers (torchrun, accelerate,
    a shell) are not: what they start is not this process."""
    args = list(argv)
    if args and os.path.basename(args[0]) == "env":
        args = args[1:]
        while args and (args[0].startswith("-") or _ENV_ASSIGN.match(args[0])):
            args = args[1:]
    if not args:
        return False
    if is_python(args[0]):
        return True
    if os.sep in args[0]:   # a path to a script: its #! line
        return _shebang_is_python(Path(cwd) / args[0])
    return False


def package_dirs() -> dict[str, str]:
    """Where this trainctl's packages are (an editable install maps them anywhere)."""
    out = {}
    for name in PACKAGES:
        module = importlib.import_module(name)
        out[name] = str(Path(list(module.__path__)[0]).resolve())
    return out


def fallback_dirs() -> dict[str, str]:
    out = {}
    for name in FALLBACK:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        out[name] = str(Path(list(module.__path__)[0]).resolve())
    return out


def settings(watch: Mapping[str, str] = INTEGRATIONS) -> dict:
    """What the bootstrap reads from ``TRAINCTL_INSTRUMENT``."""
    return {"watch": dict(watch), "packages": package_dirs(), "fallback": fallback_dirs()}


def instrument_env(env: Mapping[str, str], bootstrap: Path = BOOTSTRAP_DIR,
                   config: Mapping | None = None) -> dict[str, str]:
    """``env`` with the bootstrap first on PYTHONPATH (the user's PYTHONPATH after it, as it
    was) and its settings in ``TRAINCTL_INSTRUMENT``."""
    out = dict(env)
    user = out.get("PYTHONPATH", "")
    out["PYTHONPATH"] = str(bootstrap) + (os.pathsep + user if user else "")
    out[INSTRUMENT_ENV] = json.dumps(settings() if config is None else dict(config))
    return out
