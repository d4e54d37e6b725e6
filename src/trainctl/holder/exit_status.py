"""A trainer's exit status read from the trainer itself, not from its parent: what a watcher
that is not its parent (an agent whose holder was killed, a holder that adopted it) can read.

Two sources, both about the process a pidfd pins, so a reused pid is never taken for it:

* the pidfd's ``PIDFD_GET_INFO`` ioctl with ``PIDFD_INFO_EXIT`` (Linux 6.15+): the wait
  status, kept by the kernel once the process was reaped, by whoever reaped it;
* while it is a zombie nobody has reaped yet, ``exit_code`` in ``/proc/PID/stat`` (the
  last field, Linux 3.5+).

The pidfd must have been opened before the process was reaped (:func:`open_pidfd`, early).
"""

from __future__ import annotations

import fcntl
import os
import struct

import psutil

_INFO_SIZE = 64  # struct pidfd_info, its first version: mask, cgroupid, 11 ids, exit_code
_PIDFD_GET_INFO = (3 << 30) | (_INFO_SIZE << 16) | (0xFF << 8) | 11  # _IOWR(0xFF, 11, ...)
_PIDFD_INFO_EXIT = 1 << 3
_EXIT_CODE_AT = 60
_SAME_START_S = 0.05


def open_pidfd(pid: int | None, start: float | None) -> int | None:
    """A pidfd on ``pid`` if it is still the process created at ``start`` (alive or a
    zombie); None when it is gone, another process, or the kernel has no pidfd."""
    if not pid or start is None:
        return None
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None
    try:  # opened first, then checked: a pid reused after the check is not the one pinned
        if abs(psutil.Process(pid).create_time() - start) <= _SAME_START_S:
            return fd
    except psutil.Error:
        pass
    os.close(fd)
    return None


def _reaped_status(pidfd: int) -> int | None:
    buf = bytearray(_INFO_SIZE)
    struct.pack_into("Q", buf, 0, _PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(pidfd, _PIDFD_GET_INFO, buf)
    except OSError:  # before 6.13 no such ioctl; ESRCH while it is not reaped on some kernels
        return None
    if not struct.unpack_from("Q", buf, 0)[0] & _PIDFD_INFO_EXIT:
        return None
    return int(struct.unpack_from("i", buf, _EXIT_CODE_AT)[0])


def _zombie_status(pid: int, start: float | None) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2 :].split()
        if fields[0] != b"Z" or len(fields) < 50:
            return None
        if start is not None and abs(psutil.Process(pid).create_time() - start) > _SAME_START_S:
            return None
        return int(fields[-1])
    except (OSError, ValueError, IndexError, psutil.Error):
        return None


def exit_code(pidfd: int | None, pid: int, start: float | None) -> int | None:
    """The process's exit code as ``subprocess`` gives it (negative: killed by that signal),
    once it has ended; None while it runs, or where neither source can tell."""
    if pidfd is None:
        return None
    status = _reaped_status(pidfd)
    if status is None:
        status = _zombie_status(pid, start)
        if (reaped := _reaped_status(pidfd)) is not None:  # reaped meanwhile: the kernel's word
            status = reaped
    return None if status is None else os.waitstatus_to_exitcode(status)
