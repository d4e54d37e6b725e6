"""Where trainctl keeps things: the one seam tests patch (through environment variables)."""
from __future__ import annotations

import os
import time
from pathlib import Path


def _env_dir(var: str, default: Path) -> Path:
    value = os.environ.get(var)
    return Path(value).expanduser() if value else default


def config_dir() -> Path:
    """User config (presets, keymap): $TRAINCTL_CONFIG_DIR or ~/.config/trainctl."""
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return _env_dir("TRAINCTL_CONFIG_DIR", base / "trainctl")


def cache_dir() -> Path:
    """Demo data and other rebuildable things: $TRAINCTL_CACHE_DIR or ~/.cache/trainctl."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return _env_dir("TRAINCTL_CACHE_DIR", base / "trainctl")


def runs_dir() -> Path:
    """Default parent of run directories: $TRAINCTL_RUNS_DIR or ~/.local/share/trainctl/runs."""
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return _env_dir("TRAINCTL_RUNS_DIR", base / "trainctl" / "runs")


def new_run_dir(job_name: str, now: float | None = None) -> Path:
    """Create a new, empty run directory for ``job_name`` (private) and return it."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    root = runs_dir()
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{job_name}-{stamp}"
    n = 1
    while True:
        try:
            path.mkdir(mode=0o700)   # made, not only named: a run started at the same second
            return path              # by another process takes the next name
        except FileExistsError:
            n += 1
            path = root / f"{job_name}-{stamp}-{n}"


def latest_link() -> Path:
    return runs_dir() / "latest"


def make_private_dir(path: Path) -> Path:
    """Create a directory only its owner can enter (GPU boxes are shared)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


class RunFiles:
    """The files of one run directory."""

    def __init__(self, run_dir: Path | str):
        self.dir = Path(run_dir).expanduser().resolve()

    events = property(lambda self: self.dir / "events.jsonl")
    log = property(lambda self: self.dir / "train.log")
    sock = property(lambda self: self.dir / "agent.sock")
    info = property(lambda self: self.dir / "agent.json")
    spec = property(lambda self: self.dir / "spec.json")
    stacks = property(lambda self: self.dir / "stacks")
    presets = property(lambda self: self.dir / "presets")
    checkpoints = property(lambda self: self.dir / "checkpoints")
    job = property(lambda self: self.dir / "job.toml")
