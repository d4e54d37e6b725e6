"""The files trainctl keeps state in: written atomically and never redirected, read
defensively, by one writer and one reader for the whole package.

Writing (:func:`write_atomic`, :func:`atomic_path`, :func:`replace_with_symlink`): a
temporary file of a random name made with ``O_CREAT|O_EXCL`` (``tempfile.mkstemp``) in the
target's own folder, so a link planted at a name guessed in advance is never written through;
the data, ``fsync`` (``durable``), the mode, then ``os.replace`` over the target and an
``fsync`` of the folder.

Reading (:func:`read_regular`): ``O_NOFOLLOW|O_NONBLOCK`` (a link is refused, a FIFO never
blocks), then ``fstat``: a regular file of the user's (or root's), not writable by group or
others (as OpenSSH treats ``~/.ssh``), no larger than its cap.  :func:`check_state_dir` holds
a folder of state files (the data and config directories) to the same rule, and
:func:`bounded` range-checks a number read from one.  :func:`set_aside` moves a damaged file
that trainctl wrote out of the way, with the one line that says so.

Standard library only: the code inside the user's trainer (``trainctl.inside``) uses it.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

DEFAULT_LIMIT = 64 << 20
"""The size cap of :func:`read_regular` unless the caller gives its own."""


class UnsafePathError(OSError):
    """A file or a directory is not safe to use; the message (one line) says why."""


def trusted_uid(uid: int) -> bool:
    """Files and directories trainctl acts on are the user's own, or root's."""
    return uid == os.geteuid() or uid == 0


def private_group(gid: int) -> bool:
    """A group only this user is in: Debian's user private groups, whose umask 002 makes
    group-writable home directories that let nobody else in (as OpenSSH's StrictModes
    judges them).  The user's primary group, named as the user, with no other members."""
    import grp
    import pwd

    try:
        me, group = pwd.getpwuid(os.geteuid()), grp.getgrgid(gid)
    except KeyError:
        return False
    return (
        gid == me.pw_gid
        and group.gr_name == me.pw_name
        and all(member == me.pw_name for member in group.gr_mem)
    )


# --------------------------------------------------------------------------- writing
def fsync_dir(folder: Path | str) -> None:
    """Make a rename in ``folder`` durable (best effort)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_beside(path: Path | str) -> tuple[int, Path]:
    """A new file of a random name in ``path``'s folder (mkstemp: O_EXCL, 0600) and its fd:
    for a writer that checks what it wrote before it renames it (a checkpoint)."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    return fd, Path(name)


def _new_file_mode() -> int:
    umask = os.umask(0o077)  # read back at once (there is no other way to read it)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def _replacing(path: Path, durable: bool) -> Iterator[tuple[int, Path]]:
    """A temporary file beside ``path`` (its fd and path) renamed over ``path`` when the
    block ends without an exception, removed otherwise; the folder fsynced (``durable``)."""
    fd, tmp = temp_beside(path)
    try:
        yield fd, tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def write_atomic(path: Path | str, data: str | bytes, mode: int | None = 0o600, durable: bool = True) -> None:
    """Replace ``path`` whole with ``data``: a reader sees the old file or the new one, never
    half, and the write never goes through a link at a guessable name.  ``mode`` whatever the
    umask (None: what a new file gets, 0666 less the umask: a report the user shares);
    ``durable``: the file and its folder are fsynced.  OSError when it cannot."""
    with _replacing(Path(path), durable) as (fd, _tmp), os.fdopen(fd, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
        f.flush()
        if durable:
            os.fsync(f.fileno())
        os.fchmod(f.fileno(), _new_file_mode() if mode is None else mode)


@contextlib.contextmanager
def atomic_path(path: Path | str, mode: int = 0o600, durable: bool = True) -> Iterator[Path]:
    """For a writer that wants a path, not bytes (``torch.save``, a library's
    ``save_checkpoint``): a fresh temporary file of a random name beside ``path``, already
    made (mkstemp), to write to; renamed over ``path`` when the block ends without an
    exception, removed otherwise."""
    with _replacing(Path(path), durable) as (fd, tmp):
        os.close(fd)
        yield tmp
        if durable:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)


def replace_with_symlink(link: Path | str, target: Path | str) -> None:
    """Point the symbolic link ``link`` at ``target`` atomically (a link of a random name
    beside it, renamed over it)."""
    link = Path(link)
    for _ in range(8):
        tmp = link.with_name(f".{link.name}.{secrets.token_hex(8)}.tmp")
        try:
            os.symlink(target, tmp)  # fails on any name already there: never a planted one
        except FileExistsError:
            continue
        try:
            os.replace(tmp, link)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return
    raise FileExistsError(f"{link}: no free temporary name beside it")


# --------------------------------------------------------------------------- reading
def _check_stat(path: Path | str, st: os.stat_result, what: str) -> None:
    if not trusted_uid(st.st_uid):
        raise UnsafePathError(
            f"{path}: {what} owned by uid {st.st_uid}, not by you (uid {os.geteuid()}) nor root"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePathError(
            f"{path}: {what} writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); `chmod go-w {path}`"
        )


def read_regular(path: Path | str, limit: int = DEFAULT_LIMIT, named: bool = False) -> bytes:
    """The bytes of a state file: not a link, a regular file (a FIFO or a device is refused
    at once, never waited on), the user's or root's, not writable by group or others, at most
    ``limit`` bytes.  ``named``: a file the user named (a job file, a preset): links are
    followed and any owner is read, the rest holds.  FileNotFoundError when it is missing,
    IsADirectoryError for a directory, :class:`UnsafePathError` (one line naming the file)
    when it is not one to read; other OSErrors as they come."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if named else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if not named and os.path.islink(path):
            raise UnsafePathError(f"{path}: is a symbolic link; trainctl does not follow it") from None
        if isinstance(e, (FileNotFoundError, IsADirectoryError)):
            raise
        raise UnsafePathError(f"{path}: cannot open it: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(f"{path}: is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(f"{path}: not a regular file (a FIFO, a device or a socket is never read)")
        if not named:
            _check_stat(path, st, "a file")
        if st.st_size > limit:
            raise UnsafePathError(f"{path}: {st.st_size} bytes, larger than the {limit} a state file may be")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UnsafePathError(f"{path}: larger than the {limit} bytes a state file may be")
    return data


def read_text(path: Path | str, limit: int = DEFAULT_LIMIT) -> str:
    """:func:`read_regular`, decoded as UTF-8 (a bad byte is replaced, never raised)."""
    return read_regular(path, limit).decode("utf-8", errors="replace")


def check_state_dir(path: Path | str) -> Path:
    """A folder state files are read from (the data or the config directory): when it
    exists, a directory of the user's or root's that others cannot write (nor a group but the
    user's own private one), unless sticky (nobody else can then replace what is ours in it),
    as the run directory's parents are held to.  A missing one is fine (nothing is read from
    it).  Returns the path; :class:`UnsafePathError` otherwise."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return path
    except OSError as e:
        raise UnsafePathError(f"{path}: {e.strerror or e}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{path}: not a directory")
    if not trusted_uid(st.st_uid):
        raise UnsafePathError(
            f"{path}: a directory owned by uid {st.st_uid}, not by you (uid {os.geteuid()}) nor root"
        )
    shared = stat.S_IWOTH | (0 if private_group(st.st_gid) else stat.S_IWGRP)
    if st.st_mode & shared and not st.st_mode & stat.S_ISVTX:
        raise UnsafePathError(
            f"{path}: a directory writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); `chmod go-w {path}`"
        )
    return path


def bounded(value: object, name: str, high: float, low: float = 0.0) -> float:
    """``value`` as a float when it is a real number (not a bool), finite and within
    [``low``, ``high``]; ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} is not a number: {value!r:.40}")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{name} out of range: {value!r:.40}") from None
    if not math.isfinite(number) or not low <= number <= high:
        raise ValueError(f"{name} out of range [{low:g}, {high:g}]: {value!r:.40}")
    return number


def set_aside(path: Path | str, why: object, what: str) -> str:
    """Move a damaged file that trainctl wrote out of the way (to ``<name>.corrupt``, or
    ``.corrupt.<n>`` when taken) and return the one line that says so: ``what`` it is, which file,
    why, and where it went.  A file that cannot be moved is left (the line says so)."""
    path = Path(path)
    where = "left where it is"
    for n in range(100):
        aside = path.with_name(f"{path.name}.corrupt" + (f".{n}" if n else ""))
        if os.path.lexists(aside):
            continue
        try:
            os.rename(path, aside)
        except OSError:
            break
        where = f"moved to {aside}"
        break
    return f"{what} {path} is unreadable ({why}); {where}, going on without it"
