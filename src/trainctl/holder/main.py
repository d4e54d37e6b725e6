"""The holder: the trainer's parent, so that the trainer outlives its agent.

``python -m trainctl.holder.main --run-dir D --attempt N [--lock-fd FD] [--log PATH] -- ARGV...``

The agent starts it in a new session. It becomes a child subreaper, starts ARGV in a new
session (stdin /dev/null, stdout+stderr into one pipe) and is its only reaper. It appends
every byte of that pipe to train.log (a write error drops bytes, counted, but never stops
the draining: the trainer never blocks on a full pipe nor dies of SIGPIPE), keeps the job
lock fd open for its whole life (the trainer does not inherit it), and keeps the status
file ``trainer-<attempt>.json`` (see :data:`STATUS_SIZE`) up to date. After the trainer
exits it drains the pipe (EOF or :data:`DRAIN_S`), kills what is left of the tree (orphans
come to it as the subreaper), reaps, writes the final status and exits 0.

SIGTERM is forwarded to the trainer's process group; SIGHUP, SIGINT and SIGPIPE are ignored.

The run directory deleted under it (``rm -rf RUN`` by mistake): every :data:`STATUS_EVERY_S`
it looks whether its status file or train.log is gone (no link left), and makes them again
(the directory too, 0700): the status file rewritten, train.log a copy of what it held
(:func:`copy_out`), appended to from there.  The trainer never notices.

The trainer keeps a read end of its own output pipe (its number is ``pipe_fd`` in the status
file): a holder killed (kill -9, the OOM killer) then never kills its trainer by EPIPE at its
next line; it blocks once the pipe (1 MiB) is full, until a new holder drains it.
``--adopt`` starts such a new holder for the trainer named in the status file (an adopting
agent does): it opens the trainer's read end through /proc, relays it to train.log as
before and watches the trainer through a pidfd.  Not its parent, it reads the trainer's exit
status through that pidfd (:mod:`trainctl.holder.exit_status`: the kernel keeps it, Linux
6.15+); where the kernel cannot tell, the status file says ``"exit_unknown": true``.

``--alert-file F`` (the run's 0600 alerts.json): the holder watches the run's agent
(:mod:`trainctl.holder.agentwatch`) and sends the "unsupervised" alert when it is gone.
Self-contained (stdlib + psutil, and the holder's own modules) so that it starts fast.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import select
import signal
import sys
import time

import psutil

from trainctl.holder.agentwatch import AgentWatch
from trainctl.holder.exit_status import exit_code

STATUS_SIZE = 4096  # the status file is preallocated to this size, then only pwritten
LAST_LINE_MAX = 512
STATUS_EVERY_S = 1.0  # counters are written at most this often
DRAIN_S = 5.0  # after the trainer's exit, read its pipe until EOF or this long
KILL_GRACE_S = 2.0  # SIGTERM → SIGKILL for what is left of the tree
CHUNK = 1 << 20
READ_PAUSE_S = 0.1  # after a small read, read again this much later: a trainer that
READ_BURST = 32768  # flushes every line costs one wake-up per pause (a flood: at once)
PR_SET_CHILD_SUBREAPER = 36


def status_path(run_dir: str, attempt: int) -> str:
    return os.path.join(run_dir, f"trainer-{attempt}.json")


def fit_status(status: dict, size: int = STATUS_SIZE) -> bytes:
    """``status`` as JSON padded with spaces to exactly ``size`` bytes; long fields (argv,
    last_line, spawn_error) are cut until it fits."""
    st = dict(status)
    for cap in (None, 256, 64, 0):
        if cap is not None:
            st["argv"] = [a[:cap] for a in (status.get("argv") or [])[: cap // 4]]
            st.update(
                {k: v[:cap] for k in ("last_line", "spawn_error") if isinstance(v := status.get(k), str)}
            )
        data = json.dumps(st).encode()
        if len(data) < size:
            return data.ljust(size - 1) + b"\n"
    raise ValueError("status does not fit")  # numbers only: cannot happen


def copy_out(fd: int, path: str) -> int:
    """The file ``fd`` holds, deleted meanwhile: its bytes copied to a new ``path`` (0600,
    written beside it, then renamed into place).  Returns the new file's fd (O_RDWR|O_APPEND).
    The caller writes only through the returned fd from then on, so nothing is lost."""
    tmp = f"{path}.remade-{os.getpid()}"
    new = os.open(tmp, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        offset = 0
        while chunk := os.pread(fd, CHUNK, offset):
            offset += len(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(new, view) :]
        os.rename(tmp, path)
    except BaseException:
        os.close(new)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return new


def lost(fd: int | None, path: str | os.PathLike) -> bool:
    """The file ``fd`` holds is no longer at ``path``: it, or its run directory, was
    deleted or moved away (``mv RUN RUN.old``).  Either way it is made again at ``path``,
    where every reader looks; a directory moved away keeps what it had then."""
    if fd is None:
        return False
    try:
        held = os.fstat(fd)
    except OSError:
        return False
    try:
        there = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return True
    except OSError:
        return False  # cannot tell (a permission, an I/O error): nothing made again
    return held.st_nlink == 0 or (there.st_dev, there.st_ino) != (held.st_dev, held.st_ino)


class Holder:
    def __init__(
        self,
        run_dir: str,
        attempt: int,
        argv: list[str],
        log_path: str,
        lock_fd: int | None,
        alert_file: str | None = None,
        old: dict | None = None,
    ) -> None:
        """``old``: with --adopt, the status file as the killed holder left it."""
        self.argv, self.log_path, self.lock_fd = argv, log_path, lock_fd
        self.run_dir, self.status_file = run_dir, status_path(run_dir, attempt)
        self.watch = AgentWatch(run_dir, alert_file) if alert_file else None
        self.status_fd = self.open_status()
        me = psutil.Process()
        self.st: dict = {
            "holder_pid": me.pid,
            "holder_start": me.create_time(),
            "pid": None,
            "pid_start": None,
            "attempt": attempt,
            "argv": argv,
            "started": None,
            "log_bytes": 0,
            "dropped_bytes": 0,
            "dropped_lines": 0,
            "last_line": None,
            "returncode": None,
            "ended": None,
            "spawn_error": None,
        }
        if old is not None:  # the trainer's, carried over from the first write on
            self.st.update(
                {
                    k: old.get(k)
                    for k in (
                        "pid",
                        "pid_start",
                        "started",
                        "log_bytes",
                        "dropped_bytes",
                        "dropped_lines",
                        "pipe_fd",
                    )
                },
                adopted=True,
            )
        self.log_fd: int | None = None
        self.pipe_r: int | None = None
        self.pid: int | None = None
        self.pidfd: int | None = None  # --adopt: the trainer is not our child
        self.lost_partial = b""  # the start of a line being dropped
        self.reaped = self.term_pending = self.dirty = False
        self.written_at = 0.0
        self.write_status()

    # ------------------------------------------------------------------ status and log
    def open_status(self) -> int:
        fd = os.open(self.status_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.ftruncate(fd, 0)
        os.pwrite(fd, b" " * STATUS_SIZE, 0)  # the room for every later write
        return fd

    def remake_files(self) -> None:
        """The status file and train.log made again where they were deleted (see above);
        best effort: a failure now is tried again at the next status write."""
        status_gone, log_gone = lost(self.status_fd, self.status_file), lost(self.log_fd, self.log_path)
        if not (status_gone or log_gone):
            return
        try:
            for d in (self.run_dir, os.path.dirname(self.log_path)):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(d, 0o700)
            if log_gone and self.log_fd is not None:  # lost() says False for no fd
                new = copy_out(self.log_fd, self.log_path)
                os.close(self.log_fd)
                self.log_fd = new
            if status_gone:
                new = self.open_status()
                os.close(self.status_fd)
                self.status_fd = new
                self.dirty = True
            print("holder: the run directory's files were deleted: made again", file=sys.stderr, flush=True)
        except OSError as e:
            print(f"holder: cannot make the deleted files again: {e}", file=sys.stderr, flush=True)

    def write_status(self) -> None:
        try:
            os.pwrite(self.status_fd, fit_status(self.st), 0)
            self.dirty, self.written_at = False, time.monotonic()
        except OSError:
            self.dirty = True  # tried again on the next wake-up

    def append(self, data: bytes) -> None:
        """Append to the log; on any error count what was lost and go on."""
        self.dirty = True
        done = 0
        try:
            if self.log_fd is None:
                self.log_fd = os.open(
                    self.log_path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
                )
            while done < len(data):
                done += os.write(self.log_fd, data[done:])
            self.st["log_bytes"] += done
            self.st["last_line"], self.lost_partial = None, b""
            return
        except OSError:
            self.st["log_bytes"] += done
        lost = data[done:]
        self.st["dropped_bytes"] += len(lost)
        self.st["dropped_lines"] += lost.count(b"\n")
        *complete, partial = (self.lost_partial + lost).split(b"\n")
        self.lost_partial = partial[-4 * LAST_LINE_MAX :]
        if complete:  # the last complete line we could not write (after a progress bar's \r)
            line = complete[-1].rstrip(b"\r").rsplit(b"\r", 1)[-1]
            self.st["last_line"] = line.decode(errors="replace")[-LAST_LINE_MAX:]

    # ------------------------------------------------------------------ the trainer
    def adopt(self, old: dict) -> bool:
        """Take over the trainer of ``old`` (its status file when this holder started), whose
        holder was killed: False when it is gone (or another process has its pid)."""
        pid = old.get("pid")
        try:
            if not isinstance(pid, int):
                raise TypeError(f"no pid in the status file ({pid!r})")
            self.pidfd = os.pidfd_open(pid)  # first: a pid reused after the check is not ours
            if abs(psutil.Process(pid).create_time() - (old.get("pid_start") or 0)) > 0.05:
                raise ProcessLookupError(pid)
        except (OSError, TypeError, psutil.Error) as e:
            self.st.update(spawn_error=f"cannot adopt the trainer (pid {pid}): {e}", pid=None)
            self.write_status()
            return False
        self.pid = pid
        keep = old.get("pipe_fd")
        if keep is not None:
            try:  # the trainer's own read end of its output pipe: ours to drain now
                self.pipe_r = os.open(
                    f"/proc/{pid}/fd/{int(keep)}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
                )
            except (OSError, ValueError) as e:
                print(f"holder: cannot read the trainer's output: {e}", file=sys.stderr, flush=True)
        return True

    def spawn(self) -> bool:
        r, w = os.pipe()
        with contextlib.suppress(OSError):  # room for output while we pause (best effort)
            fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
        keep = os.dup(r)  # the trainer's own read end (see above)
        os.set_inheritable(keep, True)
        defaults = (
            signal.SIGHUP,
            signal.SIGINT,
            signal.SIGPIPE,
            signal.SIGTERM,
            signal.SIGCHLD,
            signal.SIGXFSZ,
        )
        try:
            self.pid = os.posix_spawnp(
                self.argv[0],
                self.argv,
                dict(os.environ),
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, w, 1),
                    (os.POSIX_SPAWN_DUP2, w, 2),
                ],
                setsid=True,
                setsigdef=defaults,
                setsigmask=(),
            )
        except (OSError, ValueError) as e:
            for fd in (r, w, keep):
                os.close(fd)
            self.st.update(spawn_error=f"{type(e).__name__}: {e}", returncode=127, ended=time.time())
            self.write_status()
            return False
        os.close(w)
        os.close(keep)
        self.st["pipe_fd"] = keep
        self.pipe_r = r
        os.set_blocking(r, False)
        with contextlib.suppress(psutil.Error):  # not reaped yet, so still there
            self.st["pid_start"] = psutil.Process(self.pid).create_time()
        self.st.update(pid=self.pid, started=time.time())
        self.write_status()
        if self.term_pending:
            self.on_sigterm()
        return True

    def on_sigterm(self, *_: object) -> None:
        if self.pid is None:
            self.term_pending = True  # forwarded as soon as the trainer is there
        elif not self.reaped:  # its group (pgid = its pid) lives while it is unreaped
            with contextlib.suppress(OSError):
                os.killpg(self.pid, signal.SIGTERM)
        else:
            self.signal_tree(signal.SIGTERM)

    def reap(self) -> None:
        """Reap every child that has exited: the trainer and any orphan handed to us (an
        adopted trainer: seen gone through its pidfd, its exit status unknown)."""
        if self.pidfd is not None and not self.reaped and select.select([self.pidfd], [], [], 0)[0]:
            self.reaped = True
            assert self.pid is not None  # adopted: its pid is known
            rc = None
            for _ in range(20):  # a zombie reaped by another as we read: the kernel keeps it
                if (rc := exit_code(self.pidfd, self.pid, self.st.get("pid_start"))) is not None:
                    break
                time.sleep(0.01)
            if rc is None:
                self.st.update(exit_unknown=True, ended=time.time())
            else:
                self.st.update(returncode=rc, ended=time.time(), exit_from="trainer")
            self.write_status()
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.pid:
                self.reaped = True
                self.st.update(returncode=os.waitstatus_to_exitcode(status), ended=time.time())
                self.write_status()

    def signal_tree(self, sig: int) -> int:
        """Signal every live descendant (they are all ours: we are their subreaper)."""
        n = 0
        for p in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE:
                    p.send_signal(sig)
                    n += 1
        return n

    def read_pipe(self) -> int:
        """One read of the trainer's pipe: how much it read (0: nothing now, or EOF: closed)."""
        assert self.pipe_r is not None
        try:
            data = os.read(self.pipe_r, CHUNK)
        except BlockingIOError:
            return 0
        except OSError:
            data = b""
        if data:
            self.append(data)
        else:
            os.close(self.pipe_r)
            self.pipe_r = None
        return len(data)

    def pump(self, wake_r: int, until: float | None) -> None:
        """One wait for output, a signal or the next status write; then reap."""
        fds = (
            [wake_r]
            + ([self.pipe_r] if self.pipe_r is not None else [])
            + ([self.pidfd] if self.pidfd is not None and not self.reaped else [])
        )
        timeout = STATUS_EVERY_S
        if until is not None:
            timeout = min(timeout, max(0.0, until - time.monotonic()))
        ready, _, _ = select.select(fds, [], [], timeout)
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass
        if self.pipe_r is not None and self.pipe_r in ready:
            if 0 < self.read_pipe() < READ_BURST:
                time.sleep(READ_PAUSE_S)  # the pipe (1 MiB) holds what comes meanwhile
        self.reap()
        if time.monotonic() - self.written_at >= STATUS_EVERY_S:
            self.remake_files()
            if self.dirty:
                self.write_status()

    def run(self, adopt: dict | None = None) -> int:
        wake_r, wake_w = os.pipe()
        for fd in (wake_r, wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self.on_sigterm)
        if not (self.adopt(adopt) if adopt is not None else self.spawn()):
            return 0
        while not self.reaped:
            self.pump(wake_r, None)
            if self.watch is not None and not self.reaped:
                self.watch.check(self.pid)
        drain_until = time.monotonic() + DRAIN_S
        while self.pipe_r is not None and time.monotonic() < drain_until:
            self.pump(wake_r, drain_until)
        # What is left of the tree: SIGTERM, a grace, then SIGKILL; reap them all.
        for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 5.0)):
            if not self.signal_tree(sig):
                break
            self.signal_tree(signal.SIGCONT)
            end = time.monotonic() + grace
            while time.monotonic() < end and self.signal_tree(0):
                self.pump(wake_r, min(end, time.monotonic() + 0.05))
        while self.pipe_r is not None and self.read_pipe():  # what the killed ones wrote
            pass
        if self.pipe_r is not None:
            os.close(self.pipe_r)
        self.reap()
        self.remake_files()
        self.write_status()
        if left := self.signal_tree(0):
            with contextlib.suppress(OSError):
                print(
                    f"holder: {left} process(es) of the trainer's tree survived SIGKILL",
                    file=sys.stderr,
                    flush=True,
                )
        return 0


def become_subreaper() -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def main(args: list[str] | None = None) -> int:
    args = sys.argv[1:] if args is None else args
    cut = args.index("--") if "--" in args else len(args)
    ap = argparse.ArgumentParser(
        prog="trainctl.holder.main",
        usage="%(prog)s --run-dir D --attempt N [--lock-fd FD] "
        "[--log PATH] [--alert-file F] (--adopt | -- ARGV...)",
    )
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--attempt", type=int, required=True)
    ap.add_argument("--lock-fd", type=int)
    ap.add_argument("--log")
    ap.add_argument("--alert-file")
    ap.add_argument(
        "--adopt", action="store_true", help="take over the trainer of the status file, its holder killed"
    )
    opts = ap.parse_args(args[:cut])
    argv = args[cut + 1 :]
    old = None
    if opts.adopt:
        try:
            with open(status_path(opts.run_dir, opts.attempt), "rb") as f:
                old = json.loads(f.read())
            argv = list(old["argv"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"--adopt: no trainer to adopt: {e}")
    if not argv:
        ap.error("no command after --")
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    become_subreaper()
    if opts.lock_fd is not None:
        os.set_inheritable(opts.lock_fd, False)  # held by us alone, for our whole life
    holder = Holder(
        opts.run_dir,
        opts.attempt,
        argv,
        opts.log or os.path.join(opts.run_dir, "train.log"),
        opts.lock_fd,
        opts.alert_file,
        old,
    )
    return holder.run(old)


if __name__ == "__main__":
    sys.exit(main())
