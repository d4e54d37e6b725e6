"""Where trainctl keeps things: the one seam tests patch (through environment variables)."""
from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from .names import MAX_NAME, BadNameError, check_name  # noqa: F401  (re-exported)

RUN_MARKERS = ("events.jsonl", "agent.json", "spec.json")
"""Files that make a directory a trainctl run (any one, owned by the user)."""


class UnsafePathError(OSError):
    """A run directory or a file in it is not safe to use; the message says why and what to do."""


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
    """Create a new, empty run directory for ``job_name`` (private) and return it.
    The caller checks ``job_name`` with :func:`check_name` first."""
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
    """A directory only its owner can enter (GPU boxes are shared): created 0700 when
    missing; an existing one is never chmodded (trainctl did not make it) and must be a real
    directory of this user that others cannot write (:class:`UnsafePathError` otherwise)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        _check_own_dir(path)
        return path
    os.chmod(path, 0o700)   # made here, just now: ours (mkdir's mode is cut by the umask)
    return path


def create_run_dir(path: Path | str) -> Path:
    """Make ``path`` a new, private (0700) run directory: it must not exist (O_EXCL
    semantics; never reused silently).  Its parents are created as needed."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        raise UnsafePathError(f"{path}: already exists; give a new directory or one "
                              "check_run_dir accepts") from None
    os.chmod(path, 0o700)
    return path


def check_run_dir(path: Path | str) -> Path:
    """Accept an existing directory as a run directory, or raise :class:`UnsafePathError`.

    Accepted: a real directory (not a symlink) owned by this user, not writable by group or
    others, and either empty or a trainctl run of this user (it holds one of
    :data:`RUN_MARKERS`, a regular file owned by the user).  Nothing is changed.
    """
    path = Path(path).expanduser()
    _check_own_dir(path)
    try:
        names = os.listdir(path)
    except OSError as e:
        raise UnsafePathError(f"{path}: cannot list it: {e.strerror or e}") from None
    if not names:
        return path
    for marker in RUN_MARKERS:
        if marker in names:
            try:
                st = os.lstat(path / marker)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                return path
    raise UnsafePathError(f"{path}: not empty and not a trainctl run of yours (no "
                          f"{' / '.join(RUN_MARKERS)} of yours in it); give an empty "
                          "directory or a new path")


def _check_own_dir(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise UnsafePathError(f"{path}: no such directory") from None
    except OSError as e:
        raise UnsafePathError(f"{path}: {e.strerror or e}") from None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"{path}: is a symbolic link; give the real directory")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{path}: not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafePathError(f"{path}: owned by uid {st.st_uid}, not by you (uid "
                              f"{os.geteuid()}); use a directory of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePathError(f"{path}: writable by group or others (mode "
                              f"{stat.S_IMODE(st.st_mode):o}); use a private directory "
                              "(trainctl does not chmod a directory it did not make)")


def open_private(path: Path | str, flags: int, mode: int = 0o600) -> int:
    """Open a file of a run directory without following a symlink; return the fd.

    With ``os.O_CREAT``: the file is created (O_EXCL|O_NOFOLLOW, ``mode``); when it already
    exists and O_EXCL was not asked for, it is reopened (an adopting agent appends to its
    run's journal and log) with O_NOFOLLOW and checked: a regular file owned by this user,
    not writable by group or others.  Without O_CREAT the same check applies.  A symlink,
    another user's file or a shared-writable one raise :class:`UnsafePathError`.
    """
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    if flags & os.O_CREAT:
        try:
            return os.open(path, flags | os.O_EXCL, mode)
        except FileExistsError:
            if flags & os.O_EXCL:
                raise
        flags &= ~os.O_CREAT
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if os.path.islink(path):
            raise UnsafePathError(f"{path}: is a symbolic link; trainctl does not follow "
                                  "links in a run directory") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(f"{path}: not a regular file")
        if st.st_uid != os.geteuid():
            raise UnsafePathError(f"{path}: owned by uid {st.st_uid}, not by you")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UnsafePathError(f"{path}: writable by group or others (mode "
                                  f"{stat.S_IMODE(st.st_mode):o})")
    except BaseException:
        os.close(fd)
        raise
    return fd


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
