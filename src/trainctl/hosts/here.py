"""This machine as a command names it: the run directory a command acts on (checked before
anything in it is read), and how to type this trainctl again.  The hosts whose run
directories are here (src/trainctl/hosts/local.py, hosts/slurm/host.py) locate runs with it."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

from trainctl.core.usage import UsageError
from trainctl.store.paths import trusted_run_dir


def self_command() -> str:
    """How to type this trainctl again: `trainctl` when that name on PATH is this one, else
    its path (`.venv/bin/trainctl` run by `make demo` before the venv is activated)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if Path(argv0).name != "trainctl":  # `python -m trainctl`: no script of ours to name
        return "trainctl"
    mine = Path(argv0).absolute()
    found = shutil.which("trainctl")
    try:
        if found and os.path.samefile(found, mine):
            return "trainctl"
    except OSError:
        pass
    return shlex.quote(str(mine))


def resolve_run_dir(ref: str | None) -> Path:
    """The run directory a command acts on: it and every directory above it must be the
    user's (or root's) and not writable by others; else one line says why (UsageError) and
    nothing in it is read, run or stopped."""
    from trainctl.store.paths import UnsafePathError, latest_link

    if ref:
        path = Path(ref).expanduser()
    else:
        path = latest_link()
        if not path.exists():
            raise UsageError(f"no run given and no latest run at {path}")
    try:
        path = trusted_run_dir(path)
    except UnsafePathError as e:
        raise UsageError(f"{e}; not acting on it") from None
    if not (path / "events.jsonl").exists() and not (path / "spec.json").exists():
        raise UsageError(f"{path}: not a trainctl run directory (no events.jsonl)")
    return path
