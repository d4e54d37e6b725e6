"""The checkpoints a command's script writes itself, found on disk while the run runs: every
folder below the run's working directory is watched with inotify (system/inotify.py: the
kernel queues what was written, nothing is read while nothing changes), and a file or
folder that is a checkpoint by its name (core/checkpoint_names.py: the job's
``checkpoints`` globs, else the usual names) is checked once it has been quiet for
:data:`SETTLE_S` (store/checkpoint_accept.py: a folder as a whole, a pickle scanned, never
run) and journaled as a ``checkpoint`` event of kind ``script``, with the position the
run's progress had then.  A restart resumes from the newest good one (agent/launch.py reads
the journal) and keeps a copy of it first (agent/checkpoint_keep.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from trainctl.agent.context import RunContext
from trainctl.agent.launch import INTEGRATION_RESUME, integration_of
from trainctl.core import events as E
from trainctl.core.checkpoint_names import SCRIPT_KIND, CheckpointNames, skipped_folder
from trainctl.store.checkpoint_accept import accept_script_checkpoint
from trainctl.store.checkpoint_verify import Verdict
from trainctl.system.inotify import TreeWatch

SETTLE_S = 1.0  # a checkpoint is checked once nothing was written to it for this long
INFO_KEY = "checkpoints.watch"
Position = Callable[[], "E.Progress | None"]


def signature(path: Path) -> tuple:
    """What changes when the checkpoint is written again (a folder: each of its files)."""
    if not path.is_dir():
        st = path.stat()
        return (st.st_ino, st.st_size, st.st_mtime_ns)
    out = []
    for dirpath, _dirs, names in os.walk(path):
        for n in names:
            st = os.stat(os.path.join(dirpath, n))
            out.append((os.path.join(dirpath, n), st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


def _check(path: Path, trusted: Sequence[str] = ()) -> tuple[tuple, Verdict]:
    try:
        sig = signature(path)
    except OSError:
        sig = ()
    return sig, accept_script_checkpoint(path, trusted)


class CheckpointWatch:
    """Started by the service for a command or torchrun run; ``position()``: the run's last
    progress (the intake's)."""

    def __init__(self, ctx: RunContext, position: Position) -> None:
        self.ctx = ctx
        self.position = position
        self.cwd = os.path.realpath(ctx.spec.cwd)
        self.run_dir = os.path.realpath(ctx.files.dir)
        self.names = CheckpointNames(ctx.spec.checkpoints)
        self.reported: set[str] = set()  # paths the trainer reported itself (the report API)
        self.checked: dict[str, tuple] = {}  # path -> the signature it had when journaled
        self.timers: dict[str, asyncio.TimerHandle] = {}
        self.written_at: dict[str, E.Progress | None] = {}
        self.tree: TreeWatch | None = None
        self._said: str | None = None  # what is watched, said after the first attempt's start
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    async def start(cls, ctx: RunContext, position: Position) -> CheckpointWatch | None:
        if ctx.spec.kind not in ("command", "torchrun"):
            return None  # the Ultralytics runner keeps its own checkpoints
        watch = cls(ctx, position)
        await watch._begin()
        return watch

    async def _begin(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self.ctx.bus.on_journaled.append(self._on_journaled)
        try:
            tree = TreeWatch(self.cwd, self._skip)
            await loop.run_in_executor(None, tree.add_tree, self.cwd)
        except OSError as e:
            self._say(f"checkpoints the script writes are not watched: {e}")
            return
        self.tree = tree
        loop.add_reader(tree.fd, self._on_ready)
        what = " ".join(self.ctx.spec.checkpoints) or "the files and folders that look like checkpoints"
        limit = f"; not all: {tree.limit_hit}" if tree.limit_hit else ""
        self._say(
            f"watching {self.cwd} ({tree.folders} folders, inotify) for {what} the script writes{limit}"
        )

    def _say(self, text: str) -> None:
        """A run's journal begins with its first attempt's start: what the watch says at the
        agent's start waits for it (an adopting agent's journal has begun: said at once)."""
        if self.ctx.journal.next_seq > 0:
            self.ctx.info(text, INFO_KEY)
        else:
            self._said = text

    def _skip(self, parent: str, name: str) -> bool:
        return skipped_folder(name) or os.path.join(parent, name) == self.run_dir

    def _on_journaled(self, ev: E.Event) -> None:
        if isinstance(ev, E.Start) and self._said is not None and self._loop is not None:
            text, self._said = self._said, None
            self._loop.call_soon(self.ctx.info, text, INFO_KEY)  # not from inside the journal's write
        if isinstance(ev, E.Checkpoint) and ev.kind != SCRIPT_KIND and ev.path:
            self.reported.add(os.path.realpath(os.path.join(self.cwd, ev.path)))

    def _on_ready(self) -> None:
        assert self.tree is not None and self._loop is not None
        try:
            changes = self.tree.read()
        except OSError as e:
            self.ctx.info(f"checkpoints the script writes are no longer watched: {e}", INFO_KEY)
            self.stop()
            return
        for change in changes:
            if change.overflow:
                self.ctx.info("the checkpoint watch missed changes (the kernel's queue overflowed)", INFO_KEY)
                continue
            rel = os.path.relpath(change.path, self.cwd)
            owner = (
                None if change.is_dir or rel.startswith("..") else self.names.owner(rel.replace(os.sep, "/"))
            )
            if owner is None:
                continue
            path = os.path.join(self.cwd, owner)
            if (timer := self.timers.pop(path, None)) is not None:
                timer.cancel()
            self.timers[path] = self._loop.call_later(SETTLE_S, self._settled, path)
            self.written_at[path] = self.position()  # where the run was when it was written

    def _settled(self, path: str) -> None:
        self.timers.pop(path, None)
        if path in self.reported or integration_of(self.ctx.files) in INTEGRATION_RESUME:
            return  # the trainer said it itself (the report API), or a library's integration does
        task = asyncio.ensure_future(self._journal(path))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _journal(self, path: str) -> None:
        assert self._loop is not None
        sig, verdict = await self._loop.run_in_executor(
            None, _check, Path(path), self.ctx.spec.trusted_checkpoints
        )
        if not sig or sig == self.checked.get(path) or path in self.timers:
            return  # gone, the same as journaled, or written again meanwhile (checked again)
        self.checked[path] = sig
        progress = self.written_at.pop(path, None)
        batch = progress.batch if progress is not None else None
        epoch = None  # an open step counter (no epoch, no count: nanoGPT's iter N) has none
        if progress is not None and batch is not None and (progress.epoch or progress.batches) is not None:
            epoch = progress.epoch or 1
        now = self.ctx.clock()
        self.ctx.emit(
            E.Checkpoint(
                now,
                path,
                epoch,
                verdict.usable,
                f"written by the script: {verdict.detail}",
                batch,
                SCRIPT_KIND,
            )
        )
        self.ctx.project(now)  # the dashboard's "last checkpoint" line, now

    def stop(self) -> None:
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()
        with contextlib.suppress(ValueError):
            self.ctx.bus.on_journaled.remove(self._on_journaled)
        if self.tree is not None:
            if self._loop is not None and not self._loop.is_closed() and self.tree.fd >= 0:
                self._loop.remove_reader(self.tree.fd)
            self.tree.close()
            self.tree = None
