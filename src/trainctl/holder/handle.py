"""The agent's side of the holder (``src/trainctl/holder/main.py``): start a trainer under a holder,
adopt one whose agent died, wait for its exit; and follow the files it writes.

:class:`HeldTrainer` never ``waitpid``\\ s anything but its own child (the holder, when this
agent started it); for an adopted trainer it watches the holder's pidfd (or polls). The
returncode always comes from the holder's status file ``trainer-<attempt>.json``.

:class:`FileTail` follows ``train.log`` from a byte offset by polling (no pipe from the
trainer to the agent, so the agent may die and a new one resume at its offset);
:class:`JsonLinesTail` does the same for a side-channel file of JSON lines, delivering
only complete lines.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil

from trainctl.core.statefile import read_regular
from trainctl.holder.exit_status import exit_code, open_pidfd
from trainctl.holder.main import fit_status
from trainctl.holder.main import status_path as _status_path

START_TIMEOUT_S = 10.0
POLL_S = 0.2
_SAME_START_S = 0.05  # create times are in clock ticks: the same process reads the same


class HolderLost(RuntimeError):
    """The holder died (killed) before it could record the trainer's exit."""


def read_status(path: Path | str) -> dict | None:
    """The status file's JSON, or None while there is none (not written yet, or missing).
    A read that races a rewrite is retried."""
    for _ in range(5):
        try:
            data = read_regular(path, 1 << 20)  # never a FIFO waited on, never a link followed
        except OSError:
            return None
        if not data.strip():
            return None
        try:
            return json.loads(data)
        except ValueError:
            time.sleep(0.002)
    return None


def _same_process(pid: int | None, start: float | None) -> psutil.Process | None:
    """The live (not zombie) process ``pid`` if it was created at ``start``; else None."""
    if not pid or start is None:
        return None
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - start) > _SAME_START_S or p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p
    except psutil.Error:
        return None


def spare_fifo(run_dir: Path | str, attempt: int) -> Path:
    """Where the warm spare parked for ``attempt`` waits to be released (trainctl.agent.spare):
    while it exists, ``trainer-<attempt>.json`` is the spare's, not an attempt's."""
    return Path(run_dir) / f"spare-{attempt}.fifo"


def last_status(run_dir: Path | str) -> dict | None:
    """The status file of the run's last attempt (the highest ``trainer-<N>.json``, a parked
    spare's aside), or None."""
    attempts = [
        int(n)
        for p in Path(run_dir).glob("trainer-*.json")
        if (n := p.name[len("trainer-") : -len(".json")]).isdigit()
        and not spare_fifo(run_dir, int(n)).exists()
    ]
    return read_status(_status_path(str(run_dir), max(attempts))) if attempts else None


def live_trainer(run_dir: Path | str) -> dict | None:
    """The last attempt's status while its trainer lives (the same process: pid and start
    time), whoever watches it, or None.  ``holder_alive`` is added: False for a trainer whose
    agent and holder were both killed (it runs on unsupervised)."""
    st = last_status(run_dir)
    if (
        not st
        or st.get("returncode") is not None
        or _same_process(st.get("pid"), st.get("pid_start")) is None
    ):
        return None
    return {**st, "holder_alive": _same_process(st.get("holder_pid"), st.get("holder_start")) is not None}


class HeldTrainer:
    """A trainer under its holder. ``pid`` is the trainer's (its process group and session
    too), ``holder_pid`` the holder's."""

    def __init__(
        self, run_dir: Path | str, attempt: int, status: dict, proc: asyncio.subprocess.Process | None = None
    ) -> None:
        self.run_dir, self.attempt = Path(run_dir), attempt
        self.status_path = Path(_status_path(str(run_dir), attempt))
        self.pid: int = status["pid"]
        self.holder_pid: int = status["holder_pid"]
        self._pid_start, self._holder_start = status.get("pid_start"), status.get("holder_start")
        self._proc = proc  # the holder, when it is our child
        # the trainer's exit read from the trainer where its holder dies unrecorded
        self._exit_fd = open_pidfd(self.pid, self._pid_start)

    @classmethod
    async def start(
        cls,
        argv: list[str],
        env: dict[str, str] | None,
        cwd: Path | str | None,
        run_dir: Path | str,
        attempt: int,
        lock_fd: int | None = None,
        *,
        log: Path | str | None = None,
        adopt: bool = False,
    ) -> HeldTrainer:
        """Start ``argv`` under a new holder; return once the trainer runs. OSError when it
        cannot be started (its message says why), TimeoutError if the holder does not say
        within START_TIMEOUT_S.  ``adopt``: no ``argv``; a new holder for the trainer of
        ``attempt`` whose holder was killed (holder.py --adopt)."""
        run_dir = Path(run_dir)
        path = Path(_status_path(str(run_dir), attempt))
        if not adopt:
            try:
                # a status file of an earlier try must not be taken for this one
                path.unlink()  # noqa: ASYNC240 - one local unlink
            except FileNotFoundError:
                pass
        cmd = [
            sys.executable,
            "-I",
            "-m",
            "trainctl.holder.main",
            "--run-dir",
            str(run_dir),
            "--attempt",
            str(attempt),
        ] + (["--adopt"] if adopt else [])
        if lock_fd is not None:
            cmd += ["--lock-fd", str(lock_fd)]
        if log is not None:
            cmd += ["--log", str(log)]
        if (run_dir / "alerts.json").exists():  # the holder says "unsupervised" if the agent dies
            cmd += ["--alert-file", str(run_dir / "alerts.json")]
        out = os.open(run_dir / "holder.out", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                *([] if adopt else ["--", *argv]),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=env,
                cwd=cwd,
                start_new_session=True,
                pass_fds=(lock_fd,) if lock_fd is not None else (),
            )
        finally:
            os.close(out)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            st = read_status(path)
            if st and st.get("spawn_error"):
                await proc.wait()
                raise OSError(f"cannot start {argv[0] if argv else '(empty command)'}: {st['spawn_error']}")
            if st and st.get("pid") and st.get("holder_pid") == proc.pid:
                return cls(run_dir, attempt, st, proc)
            if proc.returncode is not None:
                raise OSError(
                    f"the holder exited ({proc.returncode}) before starting the "
                    f"trainer: {_tail(run_dir / 'holder.out')}"
                )
            if time.monotonic() > deadline:
                await _stop_holder(proc)
                raise TimeoutError(
                    f"the holder did not start the trainer within "
                    f"{START_TIMEOUT_S:.0f}s: {_tail(run_dir / 'holder.out')}"
                )
            await asyncio.sleep(0.005)

    @classmethod
    def adopt(cls, run_dir: Path | str, attempt: int) -> HeldTrainer | None:
        """The trainer of ``attempt`` if it and its holder still live (the same processes,
        by create time); else None."""
        st = read_status(_status_path(str(run_dir), attempt))
        if not st or st.get("returncode") is not None:
            return None
        if (
            _same_process(st.get("holder_pid"), st.get("holder_start")) is None
            or _same_process(st.get("pid"), st.get("pid_start")) is None
        ):
            return None
        return cls(run_dir, attempt, st)

    def status(self) -> dict:
        return read_status(self.status_path) or {}

    def alive(self) -> bool:
        """The trainer runs (not exited, not a zombie, not a reused pid)."""
        return _same_process(self.pid, self._pid_start) is not None

    def holder_alive(self) -> bool:
        return _same_process(self.holder_pid, self._holder_start) is not None

    async def wait(self) -> int:
        """The trainer's returncode (negative: killed by that signal), once its holder has
        recorded it and exited; where the holder died without recording it (killed, or an
        adopting holder that is not the trainer's parent), read from the trainer itself
        (:mod:`trainctl.holder.exit_status`) and written into the status file.  HolderLost
        when no one can tell."""
        try:
            if self._proc is not None:
                await self._proc.wait()
            else:
                await self._wait_holder_gone()
            st = self.status()
            rc = st.get("returncode")
            if rc is not None and not st.get("exit_unknown"):
                return rc
            while self.alive():  # orphaned by the holder's death: wait it out
                await asyncio.sleep(POLL_S)
            rc = exit_code(self._exit_fd, self.pid, self._pid_start)
            if rc is not None:
                self._record_exit(st, rc)
                return rc
            if st.get("exit_unknown"):  # an adopted trainer (not the holder's child) has ended
                raise HolderLost(
                    f"trainer {self.pid} ended; its exit status is unknown (its first "
                    "holder was killed: no process left that could read it)"
                )
            raise HolderLost(
                f"the holder {self.holder_pid} of trainer {self.pid} died without recording its exit"
            )
        finally:
            self.close()

    def _record_exit(self, st: dict, rc: int) -> None:
        """The exit read from the trainer, in the status file its dead holder left (nobody
        else writes it now): every later reader sees the attempt ended, and how."""
        st = dict(st, returncode=rc, ended=st.get("ended") or time.time(), exit_from="trainer")
        st.pop("exit_unknown", None)
        try:
            fd = os.open(self.status_path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        try:
            os.pwrite(fd, fit_status(st), 0)
        except (OSError, ValueError):
            pass
        finally:
            os.close(fd)

    def close(self) -> None:
        """The trainer's pidfd closed (after :meth:`wait`, or when it is dropped)."""
        fd, self._exit_fd = getattr(self, "_exit_fd", None), None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    async def _wait_holder_gone(self) -> None:
        fd = None
        try:
            fd = os.pidfd_open(self.holder_pid)
        except (OSError, AttributeError):
            pass
        try:
            # Opened first, then checked: a pidfd pins the process, so a pid reused after
            # the check cannot be mistaken for the holder.
            if not self.holder_alive():
                return
            if fd is None:
                while self.holder_alive():
                    await asyncio.sleep(POLL_S)
                return
            loop = asyncio.get_running_loop()
            gone = loop.create_future()

            def on_gone() -> None:
                if not gone.done():
                    gone.set_result(None)

            loop.add_reader(fd, on_gone)
            try:
                while not gone.done() and self.holder_alive():  # a zombie holder: polled
                    await asyncio.wait({gone}, timeout=POLL_S)
            finally:
                loop.remove_reader(fd)
        finally:
            if fd is not None:
                os.close(fd)


async def _stop_holder(proc: asyncio.subprocess.Process) -> None:
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if proc.returncode is not None:
            return
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            return
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            pass


def _tail(path: Path, n: int = 400) -> str:
    try:
        return path.read_bytes()[-n:].decode(errors="replace").strip() or "(no output)"
    except OSError:
        return "(no output)"


class FileTail:
    """Follow a file from byte ``offset``: ``async for chunk in tail`` yields what was
    appended, polling every ``poll_s`` (one stat and at most one read of ``chunk`` bytes per
    poll; a full read is followed by the next one after one turn of the event loop: a
    trainer that writes faster than the agent parses never keeps the agent's clients
    waiting more than a chunk's parse, about 40 ms for 256 KiB). The file may not exist
    yet; one deleted is read on through the descriptor held (its writer may go on writing
    it); one replaced (new inode) or truncated is read again from its start, unless the new
    file is a copy of what was read (the holder's, of a deleted train.log): read on.
    ``offset`` is where the next read starts. It stops after :meth:`close`, or, once :meth:`until_eof_after`'s event is set,
    at the first end of file seen after that (the writer is gone: read what is left)."""

    def __init__(
        self, path: Path | str, offset: int = 0, *, poll_s: float = 0.1, chunk: int = 256 << 10
    ) -> None:
        self.path, self.offset, self.poll_s, self.chunk = Path(path), offset, poll_s, chunk
        self._fd: int | None = None
        self._ino: int | None = None
        self._closed = False
        self._final: asyncio.Event | None = None

    def until_eof_after(self, event: asyncio.Event) -> FileTail:
        """Once ``event`` is set (the writer has exited), read to the end of file and stop."""
        self._final = event
        return self

    def close(self) -> None:
        """Stop at the next poll, reading nothing more."""
        self._closed = True

    def _read(self) -> tuple[bytes, bool]:
        """One poll: (data, at_end)."""
        try:
            st = os.stat(self.path)
        except OSError:
            st = None
        if self._fd is not None and (st is None or st.st_ino != self._ino):
            # Deleted or replaced: first what the file we hold still has (its writer may
            # hold it too, and go on writing: then it is followed as long as it has no name).
            size = os.fstat(self._fd).st_size
            if size > self.offset:
                return self._pread(size)
            if st is None:
                return b"", True
            if not self._copy_of_ours(st.st_size):
                self.offset = 0  # another file: from its start
            os.close(self._fd)
            self._fd = None
        if st is None:
            return b"", True
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            self._ino = os.fstat(self._fd).st_ino
        if st.st_size < self.offset:
            self.offset = 0  # truncated
        return self._pread(st.st_size)

    def _pread(self, size: int) -> tuple[bytes, bool]:
        assert self._fd is not None  # opened by the caller
        want = min(self.chunk, size - self.offset)
        if want <= 0:
            return b"", True
        data = os.pread(self._fd, want, self.offset)
        self.offset += len(data)
        return data, len(data) < self.chunk

    def _copy_of_ours(self, size: int) -> bool:
        """The file now at the path begins with what we read (the holder's copy of a deleted
        train.log, holder/main.copy_out): read on at our offset, nothing read twice."""
        assert self._fd is not None  # called while we hold the file
        if self.offset == 0 or size < self.offset:
            return False
        n = min(self.offset, 4096)
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            return os.pread(fd, n, self.offset - n) == os.pread(self._fd, n, self.offset - n)
        finally:
            os.close(fd)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        try:
            while not self._closed:
                final = self._final is not None and self._final.is_set()
                try:
                    data, at_end = self._read()
                except OSError:
                    data, at_end = b"", True
                if data:
                    yield data
                if at_end:
                    if final:
                        return
                    await asyncio.sleep(self.poll_s)
                else:  # behind the writer: the loop's other tasks (clients) get a turn first
                    await asyncio.sleep(0)
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class JsonLinesTail:
    """A :class:`FileTail` of a JSON-lines file: yields each complete line's object. A
    partial last line waits for its end; a line that is not JSON, or longer than
    ``max_line``, is skipped and counted in ``bad_lines``. ``offset`` is the end of the
    last complete line (where a new reader resumes)."""

    def __init__(self, path: Path | str, offset: int = 0, *, max_line: int = 1 << 20, **kw) -> None:
        self.tail = FileTail(path, offset, **kw)
        self.offset, self.max_line, self.bad_lines = offset, max_line, 0
        self._partial = b""
        self._skipping = False  # inside an over-long line: drop up to its end

    def until_eof_after(self, event: asyncio.Event) -> JsonLinesTail:
        self.tail.until_eof_after(event)
        return self

    def close(self) -> None:
        self.tail.close()

    def __aiter__(self) -> AsyncIterator[dict]:
        return self._objects()

    async def _objects(self) -> AsyncIterator[dict]:
        async for data in self.tail:
            if self.tail.offset - len(data) != self.offset + len(self._partial):
                # The file was replaced or truncated: the tail reads it from its start.
                self.offset, self._partial = self.tail.offset - len(data), b""
                self._skipping = False
            *lines, rest = (self._partial + data).split(b"\n")
            for line in lines:
                self.offset += len(line) + 1
                if self._skipping or len(line) > self.max_line:
                    self._skipping, self.bad_lines = False, self.bad_lines + 1
                    continue
                try:
                    obj = json.loads(line)
                except ValueError:
                    obj = None
                if isinstance(obj, dict):
                    yield obj
                elif line.strip():
                    self.bad_lines += 1
            if len(rest) > self.max_line:  # never held whole: skip to its end
                self.offset += len(rest)
                rest, self._skipping = b"", True
            self._partial = rest
