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

from trainctl.inside import BOOTSTRAP_DIR, INSTRUMENT_ENV, INTEGRATIONS, LOADER_OVERRIDE_ENV

FALLBACK = ("tomlkit",)
"""Pure-Python modules trainctl's trainer-side code imports: linked last on the trainer's
sys.path (the user's own come first)."""
LIB_DIR = "instrument"  # in the run directory: lib/trainctl (links), fallback/<module> (links)

_PYTHON = re.compile(r"(?:python|pypy)(?:\d+(?:\.\d+)*)?[mtw]?(?:\.exe)?$")
_ENV_ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
# Launchers that are Python scripts themselves (a console script whose #! names Python, as
# torch's own torchrun is in a venv's bin or Debian's /usr/bin): what they start is not them.
LAUNCHERS = frozenset({"torchrun", "accelerate", "deepspeed", "horovodrun", "mpirun", "srun"})


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


def python_command(argv: Sequence[str], cwd: str | os.PathLike[str] = ".", path: str | None = None) -> bool:
    """Whether ``argv`` starts a Python interpreter: ``python ...``, ``env [VAR=x] python ...``,
    or a script whose ``#!`` names Python (``./train.py``, or a command found on ``path``,
    the trainer's PATH, such as Ultralytics' ``yolo``).  Launchers (torchrun, accelerate, a
    shell) are not: what they start is not this process."""
    args = list(argv)
    if args and os.path.basename(args[0]) == "env":
        args = args[1:]
        while args and (args[0].startswith("-") or _ENV_ASSIGN.match(args[0])):
            args = args[1:]
    if not args or os.path.basename(args[0]) in LAUNCHERS:
        return False
    if is_python(args[0]):
        return True
    if os.sep in args[0]:  # a path to a script: its #! line
        return _shebang_is_python(Path(cwd) / args[0])
    import shutil

    found = shutil.which(args[0], path=path)
    return found is not None and _shebang_is_python(Path(found))


def _link(target: Path, link: Path) -> None:
    link.symlink_to(target, target_is_directory=target.is_dir())


def build_lib(dest: Path) -> tuple[Path, Path]:
    """``dest/lib/trainctl``: a link to this trainctl's package folder, and
    ``dest/fallback/<module>`` for :data:`FALLBACK`; built afresh in a temporary folder, then
    renamed over the old one.  Returns (lib, fallback)."""
    import shutil
    import tempfile

    import trainctl

    pkg = Path(list(trainctl.__path__)[0]).resolve()
    dest.mkdir(mode=0o700, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=dest))
    try:
        root = tmp / "lib" / "trainctl"
        root.parent.mkdir(mode=0o700)
        _link(pkg, root)
        (tmp / "fallback").mkdir(mode=0o700)
        for name in FALLBACK:
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            where = Path(list(getattr(module, "__path__", [module.__file__]))[0]).resolve()
            _link(where, tmp / "fallback" / where.name)
        for part in ("lib", "fallback"):
            old = dest / part
            if old.is_symlink() or old.is_file():
                old.unlink()
            elif old.exists():
                shutil.rmtree(old)
            os.replace(tmp / part, old)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest / "lib", dest / "fallback"


def settings(lib: Path, fallback: Path, watch: Mapping[str, str] = INTEGRATIONS) -> dict:
    """What the bootstrap reads from ``TRAINCTL_INSTRUMENT``."""
    return {"watch": dict(watch), "path": str(lib), "fallback": str(fallback)}


def instrument_env(
    env: Mapping[str, str], run_dir: str | os.PathLike[str], bootstrap: Path = BOOTSTRAP_DIR
) -> dict[str, str]:
    """``env`` with the bootstrap first on PYTHONPATH (the user's PYTHONPATH after it, as it
    was) and its settings in ``TRAINCTL_INSTRUMENT``; trainctl's links built in
    ``<run_dir>/instrument``."""
    lib, fallback = build_lib(Path(run_dir) / LIB_DIR)
    out = dict(env)
    user = out.get("PYTHONPATH", "")
    out["PYTHONPATH"] = str(bootstrap) + (os.pathsep + user if user else "")
    watch = dict(INTEGRATIONS)
    if out.get(LOADER_OVERRIDE_ENV, "").strip().lower() == "off":  # the script's own DataLoaders
        watch = {k: v for k, v in watch.items() if v != "plain_torch"}
    out[INSTRUMENT_ENV] = json.dumps(settings(lib, fallback, watch))
    return out
