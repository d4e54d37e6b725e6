"""Linux inotify through ctypes: a watch on every folder of a tree, and the names written,
moved in or made there.  Nothing is read while nothing changes (no polling): the kernel
queues the events on one descriptor that the caller's event loop reads when it is ready."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_ISDIR = 0x40000000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
WATCHED = IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)


class InotifyUnavailable(OSError):
    """No inotify here (not Linux, no libc symbol, or the kernel refused an instance)."""


@dataclass(frozen=True)
class Change:
    """``path`` was written and closed, moved in, or made (``is_dir``: a folder)."""

    path: str
    is_dir: bool
    overflow: bool = False  # the kernel dropped events: the caller looks again by itself


def _libc() -> ctypes.CDLL:
    try:  # the process's own symbols, libc's among them (find_library would run ldconfig)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (OSError, AttributeError) as e:
        raise InotifyUnavailable(errno.ENOSYS, f"no inotify: {e}") from None
    return libc


class TreeWatch:
    """One inotify instance watching ``root`` and its folders (``skip(dirpath, name)``: a
    folder not to enter).  ``fd`` is non-blocking; :meth:`read` returns what changed."""

    def __init__(self, root: str, skip: Callable[[str, str], bool]) -> None:
        self.root = root
        self.skip = skip
        self._libc = _libc()
        fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise InotifyUnavailable(err, f"inotify_init1: {os.strerror(err)}")
        self.fd: int = fd
        self._dirs: dict[int, str] = {}
        self.limit_hit: str | None = None  # why a folder is not watched (the watch limit)

    @property
    def folders(self) -> int:
        return len(self._dirs)

    def add_tree(self, top: str) -> list[str]:
        """Watch ``top`` and every folder below it (not the skipped ones); the paths of
        the files already there (a folder made while nothing watched it may hold some)."""
        found: list[str] = []
        for dirpath, dirnames, filenames in os.walk(top):
            if not self._add(dirpath):
                dirnames[:] = []
                continue
            dirnames[:] = [d for d in dirnames if not self.skip(dirpath, d)]
            found.extend(os.path.join(dirpath, f) for f in filenames)
        return found

    def _add(self, path: str) -> bool:
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), WATCHED)
        if wd < 0:
            err = ctypes.get_errno()
            if err == errno.ENOSPC and self.limit_hit is None:
                self.limit_hit = f"the inotify watch limit (fs.inotify.max_user_watches) at {path}"
            return False  # gone meanwhile, unreadable, or the limit
        self._dirs[wd] = path
        return True

    def read(self) -> list[Change]:
        """What the kernel has queued (nothing: an empty list); new folders are watched."""
        out: list[Change] = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return out
            if not data:
                return out
            for change in self._parse(data):
                if change.is_dir and not change.overflow:
                    parent, name = os.path.split(change.path)
                    if not self.skip(parent, name):
                        out.extend(Change(p, False) for p in self.add_tree(change.path))
                out.append(change)

    def _parse(self, data: bytes) -> Iterator[Change]:
        at = 0
        while at + _HEADER.size <= len(data):
            wd, mask, _cookie, size = _HEADER.unpack_from(data, at)
            name = data[at + _HEADER.size : at + _HEADER.size + size].rstrip(b"\0")
            at += _HEADER.size + size
            if mask & IN_Q_OVERFLOW:
                yield Change(self.root, True, overflow=True)
            elif mask & IN_IGNORED:
                self._dirs.pop(wd, None)  # the folder went away
            elif wd in self._dirs and name and (mask & IN_ISDIR or not mask & IN_CREATE):
                # a file counts once written and closed or moved in, not when it is made
                yield Change(os.path.join(self._dirs[wd], os.fsdecode(name)), bool(mask & IN_ISDIR))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
