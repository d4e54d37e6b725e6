"""The Spawner seam: how the attempt loop gets a trainer, and everything it does to one.

A :class:`Trainer` is a running training process as the agent sees it: its output and
side channel as async streams, its exit, and the OS work around it (sample its tree,
diagnose a stall, kill the tree, sweep what is left).  The attempt loop only speaks this
protocol, so tests replay recorded histories through a fake spawner and a fake clock in
milliseconds; :class:`PipeSpawner` is the real one.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

import psutil

from trainctl.system.process import KillReport, kill_tree

READ_PAUSE_S = 0.1  # after a small read of the trainer's output, read again this much later
READ_BURST = 32768  # a read this large (a flood) is followed at once
SIDE_LINE_MAX = 1 << 20  # a side-channel line longer than this is dropped, not fatal


class Trainer(Protocol):
    """A running trainer.  Every capability the attempt loop asks of one is here; the
    optional ones have a defined "not supported" answer (:class:`TreeOps` gives them)."""

    pid: int
    log_dropped: int  # output lines train.log could not keep (disk full, I/O error)
    log_error: str | None  # the last such error, while it lasts
    # optional, "not supported" answers in brackets:
    orphan: bool  # adopted with its holder gone: Spawner.rehold gives it one (False)
    save_on_request: bool  # it declared save-on-request before an agent adopted it (False)
    exit_unknown: str | None  # why no exit status could be read, once it ended (None)

    @property
    def returncode(self) -> int | None:
        """The exit status once it ended (None while it runs); read-only: only the
        trainer's handle learns it."""

    def output(self) -> AsyncIterator[bytes]: ...
    def side_lines(self) -> AsyncIterator[bytes]: ...
    async def wait(self) -> int: ...
    async def sample(self) -> tuple: ...
    async def diagnose(
        self, stacks_dir: Path, tag: str, gpu: Any, snapshot: bool = False, on_sampled: Any = None
    ) -> Any: ...
    async def kill(self, grace: float, workers_at_once: bool = False) -> KillReport: ...
    async def sweep(self) -> KillReport: ...
    def signal_main(self, sig: int) -> bool: ...

    def alive(self) -> bool:
        """Whether the trainer still runs (an adopted one may have ended meanwhile)."""

    def rank_output(self) -> AsyncIterator[tuple[int, str, bytes]] | None:
        """torchrun: (global rank, file, bytes) of each rank's own output files (None: the
        trainer's ranks write nowhere of their own)."""

    def offsets(self) -> dict | None:
        """Where a new agent would read this trainer's files on from (None: nowhere, an
        agent that dies takes its trainer with it)."""


class Spawner(Protocol):
    """How the attempt loop gets a trainer: start one, or (optional) take over one that an
    agent before this one started."""

    async def spawn(self, argv: list[str], env: dict[str, str], cwd: str, log_path: Path) -> Trainer:
        """Start the trainer; OSError when it cannot be started."""

    def adopt(self, attempt: int, log_path: Path) -> Trainer | None:
        """The trainer of ``attempt``, started by an agent before this one (alive, or ended
        while no agent watched); None when there is none (or the spawner cannot adopt)."""

    async def rehold(self, trainer: Trainer) -> None:
        """An adopted ``orphan`` trainer taken under this spawner's care again; OSError when
        it cannot (a spawner that cannot adopt never has orphans)."""


class PipeSpawner:
    """The trainer as the agent's child: its output on a pipe of the agent's own (not
    asyncio's, so reading it can pause to take a burst of lines in one read, and wait()
    does not wait for orphaned workers that hold it open), its side channel on another
    pipe whose fd number is in TRAINCTL_EVENTS_FD.  Its trainers die with their agent:
    nothing to adopt."""

    def adopt(self, attempt: int, log_path: Path) -> Trainer | None:
        return None

    async def rehold(self, trainer: Trainer) -> None:
        raise OSError("a piped trainer cannot be held again")

    async def spawn(self, argv: list[str], env: dict[str, str], cwd: str, log_path: Path) -> Trainer:
        side_r, side_w = os.pipe()
        out_r, out_w = os.pipe()
        _grow_pipe(out_w)
        env = dict(env, TRAINCTL_EVENTS_FD=str(side_w))
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out_w,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
                pass_fds=(side_w,),
            )
        except OSError:
            for fd in (side_r, side_w, out_r, out_w):
                os.close(fd)
            raise
        os.close(side_w)
        os.close(out_w)
        return PipeTrainer(proc, out_r, side_r, log_path)


class TreeOps:
    """What every real trainer handle does to the trainer's process tree: sample it,
    diagnose it, kill it (PID-safe: captured processes, not bare pids) and sweep it; and
    the "not supported" answers of the Trainer's optional capabilities."""

    orphan = False
    save_on_request = False
    exit_unknown: str | None = None
    keep_pids: Callable[[], set[int]] = staticmethod(set)  # processes of the run never swept

    def rank_output(self) -> AsyncIterator[tuple[int, str, bytes]] | None:
        return None

    def offsets(self) -> dict | None:
        return None

    def _init_tree(self, pid: int, run_dir: Path | None = None) -> None:
        from trainctl.system.probes import TreeSampler

        self.pid = pid
        self.run_dir = run_dir  # processes whose env names it are this run's (found at sweep)
        self.sampler = TreeSampler()
        try:  # captured now, while it is surely ours: later signals check it is the same
            self.root: psutil.Process | int = psutil.Process(pid)
        except (psutil.Error, OSError):  # OSError: out of file descriptors
            self.root = pid
        self.seen: dict[int, psutil.Process] = {}  # every process of its tree seen so far
        self.last_workers: set[int] = set()

    async def sample(self) -> tuple:
        loop = asyncio.get_running_loop()
        samples = await loop.run_in_executor(None, self.sampler.sample, self.pid)
        self.last_workers = {s.pid for s in samples if s.role == "worker"}
        for s in samples:
            if s.pid not in self.seen:
                try:
                    self.seen[s.pid] = psutil.Process(s.pid)
                except psutil.Error:
                    pass
        return samples

    async def diagnose(
        self, stacks_dir: Path, tag: str, gpu: Any, snapshot: bool = False, on_sampled: Any = None
    ):
        from trainctl.system.diagnose import diagnose

        loop = asyncio.get_running_loop()
        known = set(self.last_workers)
        return await loop.run_in_executor(
            None,
            lambda: diagnose(
                self.pid,
                stacks_dir,
                sampler=self.sampler,
                gpu=gpu,
                tag=tag,
                known_workers=known,
                snapshot=snapshot,
                on_sampled=on_sampled,
            ),
        )

    def signal_main(self, sig: int) -> bool:
        """Signal the trainer's main process only (never its group: DataLoader workers
        inherit its handlers), through the process captured at start; whether it went."""
        from trainctl.system.process import Signaller

        if not isinstance(self.root, psutil.Process):
            return False  # never captured: a bare pid may have been reused
        with Signaller() as sender:
            return sender.send(self.root, sig)

    async def kill(self, grace: float, workers_at_once: bool = False) -> KillReport:
        """The whole tree; the trainer itself is left to its one reaper.  ``workers_at_once``
        (a stall): its DataLoader workers hold nothing to save and get SIGKILL first."""
        loop = asyncio.get_running_loop()
        extra = tuple(p for p in self.seen.values() if p.pid != self.pid)
        workers = tuple(self.sampler.worker_pids()) if workers_at_once else ()
        return await loop.run_in_executor(
            None, lambda: kill_tree(self.root, self.pid, grace=grace, extra_roots=extra, at_once=workers)
        )

    async def sweep(self) -> KillReport:
        """After the trainer's exit: what is left of its tree (orphaned workers included),
        and any process whose environment names this run directory (a daemon that escaped
        the tree: double fork + setsid)."""
        loop = asyncio.get_running_loop()
        keep = self.keep_pids()
        escaped = [
            p for p in await loop.run_in_executor(None, run_dir_processes, self.run_dir) if p.pid not in keep
        ]
        self.seen.update({p.pid: p for p in escaped})
        return await self.kill(2.0)


def run_dir_processes(run_dir: Path | None) -> list[psutil.Process]:
    """Live processes (not this one, not a holder) whose TRAINCTL_RUN_DIR is ``run_dir``."""
    if run_dir is None:
        return []
    want, me, out = str(run_dir), os.getpid(), []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid == me or "trainctl.holder.main" in " ".join(p.info["cmdline"] or []):
                continue
            if p.environ().get("TRAINCTL_RUN_DIR") == want:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


class PipeTrainer(TreeOps):
    def __init__(self, proc: asyncio.subprocess.Process, out_fd: int, side_fd: int, log_path: Path) -> None:
        self._init_tree(proc.pid, Path(log_path).parent)
        self.proc = proc
        self._out_fd, self._side_fd = out_fd, side_fd
        self.log_path = log_path
        self.log_dropped = 0
        self.log_error: str | None = None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def alive(self) -> bool:
        return self.proc.returncode is None

    async def wait(self) -> int:
        return await self.proc.wait()

    async def _pipe(self, fd: int):
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 22)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0)
        )
        return reader, transport

    async def output(self) -> AsyncIterator[bytes]:
        """The trainer's output until every writer has closed it, kept in train.log as read.
        After a small read the pipe is left alone for READ_PAUSE_S, so a trainer that
        flushes every line costs one wake-up per pause, not one per line; a large read is
        followed at once.  A log that cannot be written (ENOSPC, EIO) costs those lines in
        train.log only: they are counted, and reading goes on."""
        reader, transport = await self._pipe(self._out_fd)
        log = _open_log(self.log_path)
        try:
            while data := await reader.read(1 << 20):
                self._log(log, data)
                yield data
                if len(data) < READ_BURST:
                    transport.pause_reading()
                    try:
                        await asyncio.sleep(READ_PAUSE_S)
                    finally:
                        transport.resume_reading()
        finally:
            transport.close()
            if log is not None:
                os.close(log)

    def _log(self, fd: int | None, data: bytes) -> None:
        try:
            if fd is None:
                raise OSError(f"cannot open {self.log_path}")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            self.log_error = None
        except OSError as e:
            self.log_dropped += max(1, data.count(b"\n"))
            self.log_error = e.strerror or str(e)

    async def side_lines(self) -> AsyncIterator[bytes]:
        reader, transport = await self._pipe(self._side_fd)

        async def chunks():
            while chunk := await reader.read(1 << 16):
                yield chunk

        try:
            async for line in split_lines(chunks()):
                yield line
        finally:
            transport.close()


async def split_lines(chunks: AsyncIterator[bytes], limit: int = SIDE_LINE_MAX) -> AsyncIterator[bytes]:
    """Complete lines out of a stream of chunks; a line longer than ``limit`` is skipped
    whole (a side-channel line of many MiB must not cost the agent its memory)."""
    buf, skipping = b"", False
    async for chunk in chunks:
        buf += chunk
        while (nl := buf.find(b"\n")) >= 0:
            line, buf = buf[: nl + 1], buf[nl + 1 :]
            if not skipping:
                yield line
            skipping = False
        if len(buf) > limit:
            buf, skipping = b"", True


def _open_log(path: Path) -> int | None:
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None


def _grow_pipe(fd: int, size: int = 1 << 20) -> None:
    """Room for a burst of output while the reader pauses (64 KiB by default on Linux;
    1 MiB is what an unprivileged process may ask for).  Best effort."""
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), size)
    except OSError:
        pass
