"""The real Spawner: every trainer runs under a holder (src/trainctl/holder/main.py), so it outlives
its agent.  The holder is the trainer's parent and only reaper; it writes train.log, keeps
the job lock while the trainer lives, and records the exit in trainer-<attempt>.json.  The
side channel is a file in the run directory (side-<attempt>.jsonl, in TRAINCTL_EVENTS_PATH),
so nothing the trainer holds depends on the agent, and a new agent can adopt the trainer:
it reads both files on from the offsets the last agent saved in intake.json.

A torchrun trainer (src/trainctl/core/torchrun.py) writes each rank's output to its own files under
``ranks-<attempt>/``: they are tailed too, each with its rank known (:meth:`HeldHandle.rank_output`),
and their offsets kept with the others."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from trainctl.agent.spare import Spare, describe_start, parked_line
from trainctl.agent.spawner import Trainer, TreeOps, split_lines
from trainctl.core import events as E
from trainctl.core.recovery import FINAL_STATES
from trainctl.core.torchrun import Layout, layout, rank_files
from trainctl.holder.handle import FileTail, HeldTrainer, HolderLost, read_status, spare_fifo
from trainctl.holder.main import status_path
from trainctl.store.paths import read_private, write_private

OFFSETS_FILE = "intake.json"


def side_path(run_dir: Path, attempt: int) -> Path:
    return Path(run_dir) / f"side-{attempt}.jsonl"


#: The next attempt's spare is warmed once the running one has trained this long (from its
#: first batch): a short run never pays for one, and its imports never compete with a start-up
#: for the cores.  TRAINCTL_SPARE_AFTER (seconds) sets it (tests and benches: 0).
SPARE_AFTER_S = 30.0


def spare_after_s() -> float:
    try:
        return max(0.0, float(os.environ.get("TRAINCTL_SPARE_AFTER", SPARE_AFTER_S)))
    except ValueError:
        return SPARE_AFTER_S


def held_spawner(ctx, lock_fd) -> HeldSpawner:
    """The run's spawner: a warm spare unless the run says no (``--no-spare``, ``spare =
    false``), journaling through ``ctx``, ending its spare with the run."""
    spawner = HeldSpawner(ctx.files.dir, lock_fd, spare=ctx.spec.spare, note=ctx.info)
    ctx.bus.on_journaled.append(spawner.on_journaled)
    return spawner


class HeldSpawner:
    def __init__(self, run_dir: Path, lock_fd=lambda: None, spare: bool = False, note=None) -> None:
        self.run_dir = Path(run_dir)
        self.lock_fd = lock_fd  # () -> the job lock's fd for the holder to keep, or None
        self.use_spare = spare  # a warm spare for the next attempt (trainctl.agent.spare)
        self.spare: Spare | None = None
        self._warming: asyncio.Task | None = None
        self._to_warm: tuple | None = None  # the spare to warm once the running attempt trains
        self._trains_since: float | None = None  # the running attempt's first batch
        self.spare_after_s = spare_after_s()
        self._saying: asyncio.Future | None = None  # journals the parked spare's memory
        self.note: Callable[[str, str], None] = note or (lambda text, key: None)  # a journal line

    async def spawn(self, argv: list[str], env: dict[str, str], cwd: str, log_path: Path):
        attempt = int(env.get("TRAINCTL_ATTEMPT") or 0)
        side = side_path(self.run_dir, attempt)
        fd = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        env = dict(env, TRAINCTL_EVENTS_PATH=str(side))
        env.pop("TRAINCTL_EVENTS_FD", None)
        try:
            log_offset = os.stat(log_path).st_size
        except FileNotFoundError:
            log_offset = 0
        held = await self._on_spare(argv, env, cwd, attempt)
        try:
            if held is None:
                with contextlib.suppress(FileNotFoundError):  # a spare of an agent that died
                    os.unlink(spare_fifo(self.run_dir, attempt))
                held = await HeldTrainer.start(
                    argv, env, cwd, self.run_dir, attempt, lock_fd=self.lock_fd(), log=log_path
                )
        except TimeoutError as e:
            raise OSError(str(e)) from e
        # The next attempt's spare is warmed once this one trains (its first batch): its
        # imports never compete with this attempt's own start-up for the cores.
        self._to_warm = (argv, env, cwd, log_path, attempt + 1) if self.use_spare else None
        self._trains_since = None
        handle = HeldHandle(held, log_path, log_offset, side, 0, layout(argv))
        handle.keep_pids = self.spare_pids
        return handle

    async def _on_spare(self, argv: list[str], env: dict[str, str], cwd: str, attempt: int):
        """The parked spare released to run this attempt (its holder's trainer), or None: the
        attempt starts cold (the spare discarded, the journal says why)."""
        if self._warming is not None:
            await asyncio.wait([self._warming])  # one starting now: it is taken or discarded
            self._warming = None
        spare, self.spare = self.spare, None
        if spare is None:
            if self.use_spare and self._to_warm is not None and attempt > 1:
                self.note(
                    f"attempt {attempt} started cold: no warm spare (attempt {attempt - 1} trained less than {self.spare_after_s:.0f} s)",
                    "spare.cold",
                )
            return None
        differences, why = spare.fit(argv, env, cwd) if spare.attempt == attempt else ([], "stale")
        if differences or why is not None:
            await spare.discard()
            if why != "stale":
                self.note(describe_start(attempt, differences, why, 0.0), "spare.cold")
            return None
        if not await spare.wait_ready():  # still importing: waiting is still no slower than cold
            await spare.discard()
            self.note(describe_start(attempt, [], "the spare never got ready", 0.0), "spare.cold")
            return None
        ready = spare.ready() or {}
        try:
            spare.release(argv, env, cwd)
        except OSError as e:
            await spare.discard()
            self.note(
                describe_start(attempt, [], f"the spare could not be released ({e})", 0.0), "spare.cold"
            )
            return None
        saved = f", {float(ready['import_s']):.1f} s of imports saved" if ready.get("import_s") else ""
        self.note(describe_start(attempt, [], None, time.monotonic() - spare.started) + saved, "spare.used")
        return spare.held

    async def _warm(
        self, argv: list[str], env: dict[str, str], cwd: str, log_path: Path, attempt: int
    ) -> None:
        """A spare for ``attempt`` started; once parked, its memory journaled."""
        env = dict(
            env, TRAINCTL_ATTEMPT=str(attempt), TRAINCTL_EVENTS_PATH=str(side_path(self.run_dir, attempt))
        )
        try:
            self.spare = await Spare.start(self.run_dir, attempt, argv, env, cwd, log_path, self.lock_fd())
        except OSError as e:
            self.note(f"no warm spare for attempt {attempt}: {e}", "spare.failed")
            return
        if self.spare is not None:
            self._saying = asyncio.ensure_future(self._say_parked(self.spare))

    async def _say_parked(self, spare: Spare, wait_s: float = 600.0) -> None:
        deadline = time.monotonic() + wait_s
        while self.spare is spare and time.monotonic() < deadline:
            if (line := parked_line(spare)) is not None:
                self.note(line, "spare.parked")
                return
            await asyncio.sleep(1.0)

    def spare_pids(self) -> set[int]:
        """The parked spare's process (never swept with an attempt that ended)."""
        return {self.spare.held.pid} if self.spare is not None else set()

    def on_journaled(self, ev: E.Event) -> None:
        """The attempt's first batch: its successor's spare warmed.  The run over (a final
        state journaled): the parked spare ended."""
        if isinstance(ev, E.Progress) and self._to_warm is not None and self.use_spare:
            if self._trains_since is None:
                self._trains_since = ev.ts
            if ev.ts - self._trains_since >= self.spare_after_s:
                args, self._to_warm = self._to_warm, None
                self._warming = asyncio.ensure_future(self._warm(*args))
        elif isinstance(ev, E.State) and ev.state in FINAL_STATES:
            self.use_spare = False
            self._to_warm = None
            if self.spare is not None:
                self.spare.end()

    def adopt(self, attempt: int, log_path: Path):
        """The trainer of ``attempt`` as a handle, read on from the saved offsets: alive
        (adopted) or already ended while no agent watched (its exit is in its status
        file); None when there is none (the agent died before it started)."""
        held = HeldTrainer.adopt(self.run_dir, attempt)
        orphan = False
        if held is None:
            status = read_status(status_path(str(self.run_dir), attempt))
            if not status or status.get("pid") is None:
                return None
            held = HeldTrainer(self.run_dir, attempt, status)  # ended: wait() reads its exit
            orphan = held.alive()  # or its holder was killed too: see rehold
        offsets = read_offsets(self.run_dir)
        same = offsets.get("attempt") == attempt
        log_offset = offsets.get("log", 0) if same else 0
        side_offset = offsets.get("side", 0) if same else 0
        ranks = _layout_from(offsets.get("layout")) if same else None
        handle = HeldHandle(
            held,
            log_path,
            log_offset,
            side_path(self.run_dir, attempt),
            side_offset,
            ranks,
            offsets.get("ranks", {}) if same and ranks else {},
        )
        handle.orphan = orphan
        return handle

    async def rehold(self, handle: Trainer) -> None:
        """An adopted trainer whose holder was killed too gets a new holder (holder.py
        --adopt): its output read again, the job lock kept.  OSError when it cannot."""
        if not isinstance(handle, HeldHandle):
            raise OSError("not a trainer under a holder")
        try:
            handle.held = await HeldTrainer.start(
                [],
                None,
                None,
                self.run_dir,
                handle.attempt,
                lock_fd=self.lock_fd(),
                log=handle.log_tail.path,
                adopt=True,
            )
        except TimeoutError as e:
            raise OSError(str(e)) from e
        handle.orphan = False


class HeldHandle(TreeOps):
    """A trainer under its holder, as the attempt loop sees it."""

    def __init__(
        self,
        held: HeldTrainer,
        log_path: Path,
        log_offset: int,
        side: Path,
        side_offset: int,
        ranks: Layout | None = None,
        rank_offsets: dict[str, int] | None = None,
    ) -> None:
        self._init_tree(held.pid, held.run_dir)
        self.held = held
        self.attempt = held.attempt
        self.orphan = False  # adopted with its holder gone: HeldSpawner.rehold gives it one
        self.returncode: int | None = None
        self.exit_unknown: str | None = None  # why no exit status could be read, if so
        self.exited = asyncio.Event()
        self.log_tail = FileTail(log_path, log_offset).until_eof_after(self.exited)
        self.side_tail = FileTail(side, side_offset).until_eof_after(self.exited)
        self.side_offset = side_offset  # the end of the last complete side-channel line
        self._dropped = 0
        self.layout = ranks  # torchrun: where its ranks write, how they number
        self.rank_tails: dict[str, FileTail] = {}
        self._rank_offsets = dict(rank_offsets or {})

    @property
    def log_dropped(self) -> int:
        return self._dropped

    def alive(self) -> bool:
        return self.held.alive()

    @property
    def log_error(self) -> str | None:
        return (
            "disk full or I/O error (the holder counts the lines it could not keep)"
            if self._dropped
            else None
        )

    async def wait(self) -> int:
        while True:
            try:
                rc = await self.held.wait()
                break
            except HolderLost as e:
                rc = -9  # its holder was killed: the trainer is gone or orphaned to us
                self.exit_unknown = str(e)  # the attempt loop judges by how far it got
                break
            except OSError:  # e.g. no file descriptor left to read its status: again soon
                await asyncio.sleep(0.5)
        self._dropped = int(self.held.status().get("dropped_lines") or 0)
        self.returncode = rc
        self.exited.set()
        return rc

    async def output(self) -> AsyncIterator[bytes]:
        async for data in self.log_tail:
            yield data

    def rank_output(self) -> AsyncIterator[tuple[int, str, bytes]]:
        """Each rank's output (:meth:`_rank_output`); a held trainer's always read."""
        return self._rank_output()

    async def _rank_output(self) -> AsyncIterator[tuple[int, str, bytes]]:
        """torchrun: (global rank, file, bytes) from every rank's stdout and stderr files,
        found as torchrun makes them, until the trainer has exited and all are read."""
        lay = self.layout
        if lay is None:
            return
        queue: asyncio.Queue = asyncio.Queue(maxsize=64)
        pumps: list[asyncio.Task] = []

        async def pump(tail: FileTail, rank: int, rel: str) -> None:
            async for data in tail:
                await queue.put((rank, rel, data))

        async def discover() -> None:
            root = lay.log_dir
            while True:
                final = self.exited.is_set()
                found = [str(p.relative_to(root)) for p in root.glob("*/attempt_*/*/std*.log")]
                new = {rel: local for rel, local in rank_files(found).items() if rel not in self.rank_tails}
                ranks = self.global_ranks() if new else {}
                for rel, local in new.items():
                    if local not in ranks and not final and lay.nnodes_max > 1:
                        continue  # several nodes: the rendezvous numbers the ranks; ask again
                    tail = FileTail(root / rel, self._rank_offsets.get(rel, 0), poll_s=0.2).until_eof_after(
                        self.exited
                    )
                    self.rank_tails[rel] = tail
                    pumps.append(
                        asyncio.create_task(pump(tail, ranks.get(local, lay.global_rank(local)), rel))
                    )
                if final:
                    break
                await asyncio.sleep(0.5)
            await asyncio.gather(*pumps)
            await queue.put(None)

        finder = asyncio.create_task(discover())
        try:
            while (item := await queue.get()) is not None:
                yield item
        finally:
            finder.cancel()
            for t in pumps:
                t.cancel()

    def global_ranks(self) -> dict[int, int]:
        """Local rank -> global rank of this node's live ranks, from their environment
        (LOCAL_RANK, RANK): with several nodes the rendezvous, not the node rank, numbers them."""
        import psutil

        out: dict[int, int] = {}
        try:
            procs = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return out
        for p in procs:
            try:
                env = p.environ()
                out.setdefault(int(env["LOCAL_RANK"]), int(env["RANK"]))
            except (psutil.Error, OSError, KeyError, ValueError):
                continue
        return out

    async def side_lines(self) -> AsyncIterator[bytes]:
        async for line in split_lines(self.log_chunks(self.side_tail)):
            self.side_offset += len(line)
            yield line

    @staticmethod
    async def log_chunks(tail: FileTail) -> AsyncIterator[bytes]:
        async for data in tail:
            yield data

    async def sample(self) -> tuple:
        samples = await super().sample()
        self._dropped = int(self.held.status().get("dropped_lines") or 0)
        return samples

    def offsets(self) -> dict:
        out: dict[str, Any] = {"attempt": self.attempt, "log": self.log_tail.offset, "side": self.side_offset}
        if self.layout is not None:
            lay = self.layout
            out["layout"] = [str(lay.log_dir), lay.nproc, lay.nnodes_max, lay.node_rank]
            out["ranks"] = {rel: t.offset for rel, t in self.rank_tails.items()}
        return out


def _layout_from(saved) -> Layout | None:
    try:
        log_dir, nproc, nnodes, node_rank = saved
        return Layout(Path(log_dir), nproc, int(nnodes), int(node_rank))
    except (TypeError, ValueError):
        return None


def read_offsets(run_dir: Path) -> dict:
    try:
        data = json.loads(read_private(Path(run_dir) / OFFSETS_FILE))  # the user's own file
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def save_offsets(run_dir: Path, offsets: dict) -> None:
    """Where a new agent reads on (atomically; a full disk keeps the last ones)."""
    path = Path(run_dir) / OFFSETS_FILE
    try:
        write_private(path, json.dumps(offsets))
    except OSError:
        pass
