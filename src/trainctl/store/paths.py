"""Where trainctl keeps things: the one seam tests patch (through environment variables)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from trainctl.core.names import MAX_NAME, BadNameError, check_name  # noqa: F401  (re-exported)
from trainctl.core.statefile import UnsafePathError, private_group, read_text, trusted_uid, write_atomic

RUN_MARKERS = ("events.jsonl", "agent.json", "spec.json")
"""Files that make a directory a trainctl run (any one, owned by the user)."""


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


def data_dir() -> Path:
    """What trainctl learns across runs (the preset history): $TRAINCTL_DATA_DIR or
    ~/.local/share/trainctl."""
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return _env_dir("TRAINCTL_DATA_DIR", base / "trainctl")


def runs_dir() -> Path:
    """Default parent of run directories: $TRAINCTL_RUNS_DIR or ~/.local/share/trainctl/runs."""
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return _env_dir("TRAINCTL_RUNS_DIR", base / "trainctl" / "runs")


def new_run_dir(job_name: str, now: float | None = None) -> Path:
    """Create a new, empty run directory for ``job_name`` (private) and return it.
    The caller checks ``job_name`` with :func:`check_name` first."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    root = make_private_dir(runs_dir())  # others see no job name nor path of ours
    path = root / f"{job_name}-{stamp}"
    n = 1
    while True:
        try:
            path.mkdir(mode=0o700)  # made, not only named: a run started at the same second
            return path  # by another process takes the next name
        except FileExistsError:
            n += 1
            path = root / f"{job_name}-{stamp}-{n}"


def latest_link() -> Path:
    return runs_dir() / "latest"


def make_private_dir(path: Path) -> Path:
    """A directory only its owner can enter (GPU boxes are shared): created 0700 when
    missing; an existing one is never chmodded (trainctl did not make it) and must be a real
    directory of this user that others cannot write (:class:`UnsafePathError` otherwise)."""
    path = Path(os.path.abspath(Path(path).expanduser()))
    make_trusted_parents(path)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        _check_own_dir(path)
        return path
    os.chmod(path, 0o700)  # made here, just now: ours (mkdir's mode is cut by the umask)
    return path


def create_run_dir(path: Path | str) -> Path:
    """Make ``path`` a new, private (0700) run directory: it must not exist (O_EXCL
    semantics; never reused silently).  Its parents are created as needed."""
    path = Path(os.path.abspath(Path(path).expanduser()))
    make_trusted_parents(path)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        raise UnsafePathError(
            f"{path}: already exists; give a new directory or one check_run_dir accepts"
        ) from None
    os.chmod(path, 0o700)
    return path


def check_run_dir(path: Path | str) -> Path:
    """Accept an existing directory as a run directory, or raise :class:`UnsafePathError`.

    Accepted: a real directory (not a symlink) owned by this user, not writable by group or
    others, and either empty or a trainctl run of this user (it holds one of
    :data:`RUN_MARKERS`, a regular file owned by the user).  Nothing is changed.
    """
    path = Path(os.path.abspath(Path(path).expanduser()))
    check_trusted_parents(path)
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
            if stat.S_ISREG(st.st_mode) and _trusted_uid(st.st_uid):
                return path
    raise UnsafePathError(
        f"{path}: not empty and not a trainctl run of yours (no "
        f"{' / '.join(RUN_MARKERS)} of yours in it); give an empty "
        "directory or a new path"
    )


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
    if not _trusted_uid(st.st_uid):
        raise UnsafePathError(
            f"{path}: owned by uid {st.st_uid}, not by you (uid "
            f"{os.geteuid()}) nor root; use a directory of your own"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePathError(
            f"{path}: writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):o}); use a private directory "
            "(trainctl does not chmod a directory it did not make)"
        )


def open_private(path: Path | str, flags: int, mode: int = 0o600) -> int:
    """Open a file of a run directory without following a symlink; return the fd.

    With ``os.O_CREAT``: the file is created (O_EXCL|O_NOFOLLOW, ``mode``); when it already
    exists and O_EXCL was not asked for, it is reopened (an adopting agent appends to its
    run's journal and log) with O_NOFOLLOW and checked: a regular file owned by this user,
    not writable by group or others.  Without O_CREAT the same check applies.  A symlink,
    another user's file or a shared-writable one raise :class:`UnsafePathError`.
    """
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO put there never blocks the open
    if flags & os.O_CREAT:
        try:
            return os.open(path, flags | os.O_EXCL, mode)
        except FileExistsError:
            if flags & os.O_EXCL:
                raise
        flags &= ~os.O_CREAT
    try:
        fd = os.open(path, flags)
    except OSError:
        if os.path.islink(path):
            raise UnsafePathError(
                f"{path}: is a symbolic link; trainctl does not follow links in a run directory"
            ) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(f"{path}: not a regular file")
        if not _trusted_uid(st.st_uid):
            raise UnsafePathError(f"{path}: owned by uid {st.st_uid}, not by you nor root")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UnsafePathError(f"{path}: writable by group or others (mode {stat.S_IMODE(st.st_mode):o})")
        os.set_blocking(fd, True)  # a regular file: as it was asked for
    except BaseException:
        os.close(fd)
        raise
    return fd


# ---------------------------------------------------------------------- the trust boundary
MAX_LINK_HOPS = 40


def _absolute(path: Path) -> Path:
    return path if path.is_absolute() else Path.cwd() / path


_trusted_uid = trusted_uid


def _walk(path: Path, create: bool) -> Path:
    """Walk ``path`` from / as the kernel resolves it, checking every directory on the way
    and every symbolic link followed: owned by the user or root, and not writable by group
    or others (a sticky directory such as /tmp is fine: nobody else can replace what is
    ours in it).  The last component is not checked (the caller does, its own way).  With
    ``create``: missing directories above it are made, 0700.  The real path of the parent
    is returned.  :class:`UnsafePathError` says which directory or link is not trusted."""
    path = _absolute(Path(path))  # not normalised: '..' after a link is the kernel's
    todo = list(path.parts[1:-1])
    cur, hops = Path("/"), 0
    _check_parent_dir(cur, os.lstat(cur))
    while todo:
        name = todo.pop(0)
        if name in ("", "."):
            continue
        nxt = cur.parent if name == ".." else cur / name
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            if not create:
                raise UnsafePathError(f"{nxt}: no such directory") from None
            try:
                nxt.mkdir(mode=0o700)
                os.chmod(nxt, 0o700)
            except FileExistsError:  # made at the same time by another run of ours: look again
                todo.insert(0, name)
                continue
            cur = nxt
            continue
        if stat.S_ISLNK(st.st_mode):
            if not _trusted_uid(st.st_uid):
                raise UnsafePathError(
                    f"{nxt}: a symbolic link of uid {st.st_uid} (not you nor "
                    "root); trainctl does not follow another user's link"
                )
            hops += 1
            if hops > MAX_LINK_HOPS:
                raise UnsafePathError(f"{path}: too many levels of symbolic links")
            target = Path(os.readlink(nxt))
            if target.is_absolute():
                cur, todo = Path("/"), [*target.parts[1:], *todo]
            else:
                todo = [*target.parts, *todo]
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafePathError(f"{nxt}: not a directory")
        _check_parent_dir(nxt, st)
        cur = nxt
    return cur


def _check_parent_dir(path: Path, st: os.stat_result) -> None:
    if not _trusted_uid(st.st_uid):
        raise UnsafePathError(
            f"{path}: owned by uid {st.st_uid}, not by you nor root: another "
            "user could change what is under it; use a directory of your own"
        )
    shared = stat.S_IWOTH | (0 if private_group(st.st_gid) else stat.S_IWGRP)
    if st.st_mode & shared and not st.st_mode & stat.S_ISVTX:
        raise UnsafePathError(
            f"{path}: writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):o}): another user could swap what is "
            f"under it; `chmod go-w {path}`, or use a private directory"
        )


def check_trusted_parents(path: Path | str) -> Path:
    """Every directory above ``path`` (and every link followed to it) is trusted (see
    :func:`_walk`); the real path of its parent."""
    return _walk(Path(path), create=False)


def make_trusted_parents(path: Path | str) -> Path:
    """As :func:`check_trusted_parents`, making the missing directories above ``path``
    (0700, as trainctl makes every directory)."""
    return _walk(Path(path), create=True)


def trusted_run_dir(path: Path | str) -> Path:
    """A run directory trainctl may act on (read its agent.json, slurm.json, spec.json,
    snapshot; reach or stop its agent): it and every directory above it are the user's or
    root's and not writable by others.  Returns its real path; :class:`UnsafePathError`
    (one line: which directory, and why) otherwise."""
    path = _absolute(Path(path).expanduser())
    parent = check_trusted_parents(path)
    real = parent / path.name
    for _ in range(MAX_LINK_HOPS):  # the run directory itself may be a link of ours (latest)
        try:
            st = os.lstat(real)
        except FileNotFoundError:
            raise UnsafePathError(f"{path}: no such directory") from None
        if not stat.S_ISLNK(st.st_mode):
            break
        if not _trusted_uid(st.st_uid):
            raise UnsafePathError(
                f"{real}: a symbolic link of uid {st.st_uid} (not you nor "
                "root); trainctl does not follow another user's link"
            )
        real = real.parent / os.readlink(real)
        real = check_trusted_parents(real) / real.name
    _check_own_dir(real)
    return real


def write_private(path: Path | str, data: str | bytes, mode: int = 0o600) -> None:
    """Write a file of a run directory whole (:func:`~trainctl.core.statefile.write_atomic`:
    a temporary file of a random name, then renamed over it): 0600 (``mode``) whatever the
    umask, never through a link."""
    write_atomic(path, data, mode, durable=False)


def copy_private(src: Path | str, dst: Path | str) -> None:
    """Copy ``src`` (a preset, the job file) into a run directory, 0600."""
    write_private(dst, Path(src).read_bytes())


def read_private(path: Path | str, limit: int = 64 << 20) -> str:
    """The text of a file of a run directory that trainctl acts on: not a link, a regular
    file of the user's (or root's), not writable by group or others, never waited on (a FIFO);
    at most ``limit`` bytes (:func:`~trainctl.core.statefile.read_regular`).  OSError
    (UnsafePathError among them) otherwise."""
    return read_text(path, limit)


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
