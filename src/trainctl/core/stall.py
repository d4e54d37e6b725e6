"""The stall detector: has the trainer stopped making progress?  Pure; time is an argument.

Feed it what happens (:meth:`StallDetector.on_progress`, :meth:`~StallDetector.on_phase`,
:meth:`~StallDetector.on_evidence`) and ask :meth:`~StallDetector.check` about once a
second.  It answers one :class:`StallVerdict` per stall and re-arms on the next progress
(or phase change).

How long a silence may last depends on what the trainer is doing:

* **startup** (until the first batch of an attempt): a generous grace, 600 s by default,
  because MIOpen kernel search or torch.compile can take many minutes before the first
  batch.  Evidence that work is happening (an MIOpen/compile line, a busy CPU) pushes the
  deadline to ``last evidence + 300 s``, but never past 1800 s.  A startup that succeeded
  before is remembered: the grace is at least 2 × the longest startup seen.  A fixed
  ``startup_timeout`` is used as it is (no extension).
* **train**: ``factor`` (5) × the slowest of the last 512 batch intervals, never below
  2 × the slowest steady interval ever seen, and never below ``floor`` (30 s).  NVRx uses
  5 × max; the floor is added so that jitter on a fast loop (0.05 s batches → 0.25 s)
  can never fire: a trainer that prints nothing for 30 s is worth a look, and the users'
  manual check was "batch number unchanged 60 s apart".  Until 3 intervals are known the
  threshold is 300 s.  Warm-up is kept apart: the first 2 intervals of every epoch (and of
  every attempt) do not teach the train threshold, and while waiting for them the
  threshold is ``max(train, factor × slowest warm-up interval seen)`` (300 s before any).
  When the last progress was the last batch of an epoch (``batch == batches``) and no
  phase event came, the trainer is between epochs (a silent validation or save in a
  generic script): the threshold is ``max(train, 3 × longest such gap seen)``, the
  first one gets the first-phase default below.  A fixed ``train_timeout`` replaces all
  of this learning (for a silent gap between epochs: ``max(train_timeout, val_timeout)``).
* **pauses** in train: a gap that ended a stall verdict (the trainer went on by itself),
  or one past ``factor`` × the slowest batch interval learned, never teaches the train
  threshold (nor its "slowest ever"): after any number of pauses that healed, the next
  hang is caught within the threshold that held before them.  A pause whose silence was
  ended by a console line that is no batch (:meth:`~StallDetector.on_other_line`: an
  evaluation's summary) is a phase of its own, learned like validation: once two came
  N steps apart, the silence N steps after the last one may last
  ``max(train, 3 × longest pause seen)``.  Two such gaps in a row are no pause: the batches
  became that slow, and both are learned.
* **val** and **save**: ``max(floor, 3 × longest duration of that phase seen)``; the first
  one (nothing learned) gets ``max(300 s, min(10 × train threshold, 1800 s))``.  A phase
  lasts until the first batch after it: Ultralytics' first batch after validation is
  slow (its workers restart), so that gap counts toward val/save, not train.  A save
  inside an epoch (entered from train before the epoch's last batch: a mid-epoch
  checkpoint) ends at its ``train`` phase: the workers go on, and the next batch is
  watched with the train threshold from the save's end.
* **finished**: never stalls.

Two watches work whatever the phase's own threshold says:

* **output silence** (an unknown progress format): feed the console lines with
  :meth:`~StallDetector.on_output`, with their source (a torchrun rank).  When a source
  printed ``UNKNOWN_LINES`` (20) lines spanning ``UNKNOWN_SPAN_S`` (2 s: a config dump
  printed at once is not output), or printed for ``UNKNOWN_AFTER_S`` (30 s), and no
  progress was read, the format is unknown (:attr:`~StallDetector.watching_silence`):
  decided by time and lines, so a steady printer is watched as well as a bursty one.  From
  then on, until a first batch, the silence since a source's last line may last
  ``max(silence_floor, 2 × the 0.99 quantile of its intervals between reads, 1.5 × the
  longest)`` (the healthy silences learned, kept across restarts, count too; floor 60 s),
  instead of the startup grace.  Several ranks: each has its own intervals, and the output is silent when
  every watched rank is (a rank still printing keeps the job alive).
* **a still tree** (a deadlock while a batch is awaited): feed the tree's CPU, I/O and
  GPU each tick with :meth:`~StallDetector.on_tree`.  When nothing happened for
  ``startup_idle`` (90 s) before the first batch: no output, no CPU (the tree below
  ``IDLE_CPU_PERCENT`` in all), no change in the bytes read and written (/proc/PID/io
  rchar + wchar: files, pipes, and sockets used with read/write; the kernel does not count
  send/recv there, but a download writes its file) and no busy GPU, that is a deadlock.
  A busy CPU, I/O or GPU (compile, MIOpen kernel search, dataset caching, a download)
  keeps the long startup grace.  The same watch runs at every boundary where a batch is
  awaited after the first: a validation or a save (until the first batch after it), and
  the gap after an epoch's last batch (a silent validation in a plain loop); there the
  window is at most ``PHASE_IDLE_S`` (45 s), and at most a fixed ``train_timeout``,
  while a busy validation or save keeps its own threshold (never cut short).  In train
  itself the batch thresholds decide.  ``startup_idle=None`` turns it off.  Under
  torchrun the agent feeds the ranks' processes only (the launcher polls its workers and
  its store for ever), and nothing while no rank exists (the launcher at its
  rendezvous); a verdict is marked ``still``.

Several ranks: progress may carry ``rank``; each rank keeps its own last-progress time,
so a verdict names the ranks that are stuck, and one stuck rank among moving ones gives
its own verdict ("rank 1 made no progress ...").

:meth:`reset` starts a new attempt (startup again, learned statistics kept);
:meth:`state_dict` / :meth:`load_state_dict` carry the learned statistics across restarts
of trainctl itself.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal, overload

from trainctl.core.events import Progress
from trainctl.core.stall_silence import SilenceWatch, SourceOutput
from trainctl.core.stall_thresholds import MIN_SAMPLES, Thresholds

FLOOR_S = 30.0
FACTOR = 5.0
PHASE_FACTOR = 3.0
STARTUP_GRACE_S = 600.0
STARTUP_MAX_S = 1800.0
EVIDENCE_WINDOW_S = 300.0
INITIAL_S = 300.0
WARMUP_BATCHES = 2
TRAIN_WINDOW = 512
PHASE_WINDOW = 64
SILENCE_FLOOR_S = 60.0  # an unknown format: the least silence allowed
STARTUP_IDLE_S = 90.0  # no output, CPU or I/O this long before the first batch: deadlock
PHASE_IDLE_S = 45.0  # ... in a validation, a save, or between epochs (at most)
IDLE_CPU_PERCENT = 5.0  # the whole tree below this (% of one core) is idle

_PHASES = ("startup", "train", "val", "save", "finished")
# the modes where a batch is awaited and a still tree is a deadlock, and how a verdict says so
_STILL_MODES = {
    "startup": "before the first batch",
    "silence": "before the first batch",
    "val": "in validation",
    "save": "in a checkpoint save",
    "boundary": "after the last batch of the epoch",
}


@dataclass(frozen=True)
class StallVerdict:
    """A stall: ``idle_s`` without progress in ``phase``, past ``threshold_s``.

    ``ranks`` names the stuck ranks when progress carries ranks (empty otherwise);
    ``still``: the still-tree watch decided (no output, CPU or I/O), not a threshold;
    ``certain``: the rule of :mod:`trainctl.core.stall_certain` that proved the hang
    (``stopped``, ``worker_gone``, ``deadlock``; None: a threshold decided)."""

    phase: str
    idle_s: float
    threshold_s: float
    reason: str
    ranks: tuple[int, ...] = ()
    still: bool = False
    certain: str | None = None


class _Rank:
    """What one rank did last."""

    __slots__ = ("last_t", "epoch", "batch", "batches", "n_in_epoch", "gen", "armed", "other_t", "steps")

    def __init__(self, now: float, gen: int) -> None:
        self.last_t = now
        self.epoch: int | None = None
        self.batch: int | None = None
        self.batches: int | None = None
        self.n_in_epoch = 0  # progress events seen in this epoch (since the last phase)
        self.gen = gen  # phase generation at its last progress
        self.armed = True
        self.other_t: float | None = None  # the first line since its last batch that is no batch
        self.steps = 0  # batches in this attempt


@overload
def _positive(name: str, value: float | None, *, optional: Literal[False]) -> float: ...
@overload
def _positive(name: str, value: float | None, *, optional: bool = True) -> float | None: ...
def _positive(name: str, value: float | None, *, optional: bool = True) -> float | None:
    if value is None and optional:
        return None
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"stall detector: {name} must be a number of seconds > 0 (got {value!r})")
    return float(value)


class StallDetector(SilenceWatch, Thresholds):
    """Phase-aware stall detection with thresholds learned from the run (see module doc).

    The output-silence watch is in :mod:`trainctl.core.stall_silence`, the thresholds and
    what they learn in :mod:`trainctl.core.stall_thresholds`."""

    def __init__(
        self,
        train_timeout: float | None = None,
        startup_timeout: float | None = None,
        val_timeout: float | None = None,
        save_timeout: float | None = None,
        floor: float = FLOOR_S,
        factor: float = FACTOR,
        *,
        phase_factor: float = PHASE_FACTOR,
        startup_grace: float = STARTUP_GRACE_S,
        startup_max: float = STARTUP_MAX_S,
        evidence_window: float = EVIDENCE_WINDOW_S,
        initial: float = INITIAL_S,
        warmup_batches: int = WARMUP_BATCHES,
        silence_floor: float = SILENCE_FLOOR_S,
        startup_idle: float | None = STARTUP_IDLE_S,
    ) -> None:
        self.train_timeout = _positive("train_timeout", train_timeout)
        self.startup_timeout = _positive("startup_timeout", startup_timeout)
        self.val_timeout = _positive("val_timeout", val_timeout)
        self.save_timeout = _positive("save_timeout", save_timeout)
        self.floor = _positive("floor", floor, optional=False)
        self.factor = _positive("factor", factor, optional=False)
        self.phase_factor = _positive("phase_factor", phase_factor, optional=False)
        self.startup_grace = _positive("startup_grace", startup_grace, optional=False)
        self.startup_max = max(_positive("startup_max", startup_max, optional=False), self.startup_grace)
        self.evidence_window = _positive("evidence_window", evidence_window, optional=False)
        self.initial = _positive("initial", initial, optional=False)
        if not isinstance(warmup_batches, int) or warmup_batches < 0:
            raise ValueError(f"stall detector: warmup_batches must be an int >= 0 (got {warmup_batches!r})")
        self.warmup_batches = warmup_batches
        self.silence_floor = _positive("silence_floor", silence_floor, optional=False)
        self.startup_idle = _positive("startup_idle", startup_idle)
        # learned statistics (kept across attempts, saved by state_dict)
        self._train: deque[float] = deque(maxlen=TRAIN_WINDOW)
        self._train_peak = 0.0
        self._learned: dict[str, deque[float]] = {
            k: deque(maxlen=PHASE_WINDOW)
            for k in ("warmup", "boundary", "val", "save", "startup", "silence", "pause")
        }
        self.reset(0.0)

    # ------------------------------------------------------------------ feeding
    def reset(self, now: float) -> None:
        """A new attempt: back to startup; learned statistics are kept."""
        self._phase = "startup"
        self._phase_start = now
        self._ref = now  # idle is measured from here outside train
        self._pending_train = False  # phase said train, first batch not seen yet
        self._save_mid_epoch = False  # the save phase began inside an epoch
        self._gen = 0  # bumped at every phase change
        self._ranks: dict[int | None, _Rank] = {}
        self._last_key: int | None = None
        self._armed = True
        self._evidence_t: float | None = None
        self._evidence: dict[str, int] = {}
        self._progressed = False  # a batch came in this attempt
        self._outputs: dict[int | None, SourceOutput] = {}  # console lines per source (rank)
        self._silence = False  # unknown format: output silence is watched
        self._structured = False  # a side channel speaks: no format is guessed
        self._active_t = now  # the last output, busy CPU or I/O (before the first batch)
        self._busy_t: float | None = None  # the tree's last busy sample (CPU, I/O, GPU; not output)
        self._io: int | None = None
        self._sampled = False  # the tree was sampled in this attempt
        self._idle_armed = True
        self._pauses: list[int] = []  # the steps after which this attempt paused (an evaluation)
        self._held_pause: float | None = None  # the last gap kept out of train as a pause

    def on_other_line(self, now: float, source: int | None = None) -> None:
        """A console line that is no batch (an evaluation's summary): after a silence in
        train it tells a pause (a phase of its own) from a hang that healed by itself."""
        rank = self._ranks.get(source)
        if self._phase == "train" and rank is not None and rank.other_t is None:
            rank.other_t = now

    def on_phase(self, phase: str, now: float) -> None:
        """The trainer entered ``phase`` (startup, train, val, save, finished)."""
        if phase not in _PHASES:
            raise ValueError(f"stall detector: unknown phase {phase!r} (allowed: {', '.join(_PHASES)})")
        if phase == "startup":
            self._phase, self._phase_start, self._ref = "startup", now, now
            self._pending_train = False
            self._evidence_t, self._evidence = None, {}
            self._armed = True
            self._active_t, self._idle_armed = max(self._active_t, now), True
            return
        if phase == "train":
            if self._phase == "save" and self._save_mid_epoch:
                self._learn("save", now - self._phase_start)
                self._enter("train", now)
            elif self._phase in ("startup", "val", "save"):
                self._pending_train = True  # this phase lasts until the first batch
            elif self._phase == "finished":
                self._enter("train", now)
            return
        if phase == self._phase:
            return
        if phase == "save":
            rank = self._ranks.get(self._last_key)
            self._save_mid_epoch = (
                self._phase == "train"
                and not self._pending_train
                and rank is not None
                and rank.batch is not None
                and rank.batches is not None
                and rank.batch < rank.batches
            )
        if self._phase in ("val", "save"):
            self._learn(self._phase, now - self._phase_start)
        self._enter(phase, now)

    def on_progress(self, ev: Progress, now: float) -> None:
        """A progress event.  A repeat of the same (epoch, batch) is not progress."""
        key = ev.rank
        rank = self._ranks.get(key)
        if rank is not None and ev.batch is not None and ev.epoch == rank.epoch and ev.batch == rank.batch:
            return
        if self._phase in ("val", "save") and not self._pending_train:
            # activity inside val/save (a runner reporting val batches): the phase goes on
            self._ref = now
            self._armed = True
            self._active_t = max(self._active_t, now)
            self._idle_armed = True
            self._touch(key, ev, now, count=False)
            return
        self._progressed = True
        if self._phase != "train":
            if self._phase != "finished":
                self._learn(self._phase, now - self._phase_start)
            self._enter("train", now)
        self._learn_interval(self._ranks.get(key), ev, now)
        self._touch(key, ev, now, count=True)
        self._armed = True
        self._active_t = max(self._active_t, now)
        self._idle_armed = True

    def on_evidence(self, now: float, kind: str) -> None:
        """Startup evidence that work is going on (``miopen``, ``compile``, ``cpu``, ...):
        extends the startup grace (bounded by ``startup_max``).  Ignored after startup."""
        if self._phase != "startup":
            return
        self._evidence_t = now if self._evidence_t is None else max(self._evidence_t, now)
        self._evidence[kind] = self._evidence.get(kind, 0) + 1

    def on_tree(
        self, now: float, cpu_percent: float | None, io_bytes: int | None, gpu_percent: float | None = None
    ) -> None:
        """One sample of the trainer's whole tree: its CPU (% of one core, summed; None:
        not known yet), the bytes it read and wrote (rchar + wchar; None: unreadable) and
        the GPU's utilisation (None: no GPU; a busy GPU is activity: a validation waiting
        on the GPU in a blocking sync uses no CPU).
        Busy CPU or a change in the bytes is activity (the still-tree watch)."""
        if self._phase == "finished":
            return
        first = not self._sampled
        self._sampled = True
        moved = io_bytes is not None and self._io is not None and io_bytes != self._io
        if io_bytes is not None:
            self._io = io_bytes
        busy = (
            moved
            or (cpu_percent is not None and cpu_percent >= IDLE_CPU_PERCENT)
            or (gpu_percent is not None and gpu_percent >= IDLE_CPU_PERCENT)
        )
        if busy:
            self._busy_t = now
        if first or busy or cpu_percent is None:
            self._active_t = max(self._active_t, now)
            self._idle_armed = True

    # ------------------------------------------------------------------ asking
    @property
    def phase(self) -> str:
        """The phase whose threshold applies now (a val/save stays until the next batch)."""
        return self._phase

    def mode(self) -> str:
        """What the current silence is judged as: startup, silence (an unknown format),
        warmup, train, pause, boundary (after an epoch's last batch), val, save, finished."""
        if self._phase == "finished":
            return "finished"
        return self._mode_for(self._ranks.get(self._last_key))

    def idle(self, now: float) -> float:
        """Seconds without progress (in startup/val/save: since the phase began)."""
        if self._phase == "finished":
            return 0.0
        return max(0.0, now - self._reference())

    def threshold(self, now: float) -> float | None:
        """Seconds of silence allowed right now; None once finished."""
        if self._phase == "finished":
            return None
        return self._threshold(self._mode_for(self._ranks.get(self._last_key)), now)[0]

    def explain(self, now: float) -> str:
        """Where the current threshold comes from, in words (for the dashboard)."""
        if self._phase == "finished":
            return "finished: no stall watch"
        value, basis = self._threshold(self._mode_for(self._ranks.get(self._last_key)), now)
        return f"{value:.0f}s: {basis}"

    def check(self, now: float) -> StallVerdict | None:
        """A verdict the first time the silence passes the threshold, then None until progress."""
        if self._phase == "finished":
            return None
        mode = self._mode_for(self._ranks.get(self._last_key))
        still = self._still_tree(now, mode)
        if still is not None:
            return still
        limit, basis = self._threshold(mode, now)
        idle = self.idle(now)
        named = tuple(sorted(k for k in self._ranks if k is not None))
        if mode == "silence":
            named = tuple(sorted(k for k, o in self._outputs.items() if o.unknown and k is not None))
        if self._armed and idle > limit:
            self._armed = False
            for r in self._ranks.values():
                r.armed = False
            return StallVerdict(self._phase, idle, limit, self._reason(mode, idle, limit, basis), named)
        if self._phase == "train" and len(named) > 1:
            return self._check_ranks(now)
        return None

    # ------------------------------------------------------------------ inside
    def _enter(self, phase: str, now: float) -> None:
        self._phase, self._phase_start, self._ref = phase, now, now
        self._pending_train = False
        self._gen += 1
        self._armed = True
        self._active_t, self._idle_armed = max(self._active_t, now), True
        for r in self._ranks.values():
            r.armed = True

    def still_window(self, mode: str) -> tuple[float, str] | None:
        """How long a still tree may last in ``mode`` (None: not watched): before the first
        batch ``startup_idle``; awaiting a batch after a phase (a validation, a save, the
        gap after an epoch's last batch) at most PHASE_IDLE_S, and at most a fixed train
        timeout (``--stall-timeout``).  In train itself the batch thresholds decide."""
        if self.startup_idle is None or mode not in _STILL_MODES:
            return None
        if mode in ("startup", "silence"):
            return self.startup_idle, f"startup idle window {self.startup_idle:.0f}s"
        value, basis = min(self.startup_idle, PHASE_IDLE_S), "still-tree window"
        if self.train_timeout is not None and self.train_timeout < value:
            value, basis = self.train_timeout, "fixed train timeout"
        return value, f"{basis} {value:.0f}s"

    def _still_tree(self, now: float, mode: str) -> StallVerdict | None:
        """A deadlock while a batch is awaited: a tree with no output, CPU or I/O."""
        window = self.still_window(mode)
        if window is None or not self._sampled or not self._idle_armed:
            return None
        quiet = now - self._active_t
        if quiet <= window[0]:
            return None
        self._idle_armed = False
        where = _STILL_MODES[mode]
        if self._pending_train and mode in ("val", "save"):
            where += ", awaiting the first batch after it"
        return StallVerdict(
            self._phase,
            quiet,
            window[0],
            f"deadlock {where}: no output, no CPU and no I/O for {quiet:.0f}s ({window[1]})",
            still=True,
        )

    def _reference(self) -> float:
        if self.watching_silence:
            return self._silent_source()[1]
        if self._phase == "train" and self._ranks:
            return max(self._ref, max(r.last_t for r in self._ranks.values()))
        return self._ref

    def _touch(self, key: int | None, ev: Progress, now: float, *, count: bool) -> None:
        rank = self._ranks.get(key)
        if rank is None:
            rank = self._ranks[key] = _Rank(now, self._gen)
        new_epoch = (
            rank.gen != self._gen
            or (ev.epoch is not None and ev.epoch != rank.epoch)
            or (ev.batch is not None and rank.batch is not None and ev.batch < rank.batch)
        )
        rank.n_in_epoch = (1 if new_epoch else rank.n_in_epoch + 1) if count else 0
        rank.last_t, rank.gen, rank.armed, rank.other_t = now, self._gen, True, None
        if count:
            rank.steps += 1
        rank.epoch, rank.batch, rank.batches = ev.epoch, ev.batch, ev.batches
        self._last_key = key

    def _learn_interval(self, rank: _Rank | None, ev: Progress, now: float) -> None:
        """File the gap since this rank's previous batch under steady, warm-up or boundary."""
        if rank is None or rank.gen != self._gen:
            return  # first batch of the attempt or after a phase
        gap = now - rank.last_t
        if gap < 0:
            return
        if (ev.epoch is not None and rank.epoch is not None and ev.epoch != rank.epoch) or (
            ev.batch is not None and rank.batch is not None and ev.batch < rank.batch
        ):
            self._learn("boundary", gap)
        elif rank.n_in_epoch <= self.warmup_batches:
            self._learn("warmup", gap)
        elif not rank.armed or self._outlier(gap):
            self._on_pause(rank, gap)
        else:
            self._held_pause = None
            self._learn_train(gap)

    def _learn_train(self, gap: float) -> None:
        self._train.append(gap)
        self._train_peak = max(self._train_peak, gap)

    def _outlier(self, gap: float) -> bool:
        """A gap past ``factor`` × the slowest batch interval learned: a pause, no batch."""
        if self.train_timeout is not None:
            return gap > self.train_timeout
        samples = self._train if len(self._train) >= MIN_SAMPLES else [*self._train, *self._learned["warmup"]]
        return len(samples) >= MIN_SAMPLES and gap > self.factor * max(samples)

    def _on_pause(self, rank: _Rank, gap: float) -> None:
        """A gap that ended a stall verdict, or an outlier: kept out of the train threshold
        (a hang that healed by itself must not blind the next one).  One ended by a line
        that is no batch (a silent evaluation, then its summary) is learned as a pause, with
        the step it came after.  Two in a row are no pause: the batches became that slow."""
        if self._held_pause is not None:
            self._learn_train(self._held_pause)
            self._learn_train(gap)
            self._held_pause = None
            return
        self._held_pause = gap
        if rank.other_t is not None and self._outlier(rank.other_t - rank.last_t):
            self._learn("pause", gap)
            self._pauses = [*self._pauses[-(MIN_SAMPLES - 1) :], rank.steps]

    def _pause_due(self, rank: _Rank) -> bool:
        """The trainer is where it paused before: as many steps after the last pause as
        between the two before it (an evaluation every N steps)."""
        if len(self._pauses) < 2:
            return False
        period = self._pauses[-1] - self._pauses[-2]
        return period > 0 and rank.steps == self._pauses[-1] + period

    def _mode_for(self, rank: _Rank | None) -> str:
        """train is split by what the next gap will be: warmup, boundary or steady train."""
        if self._phase != "train":
            return "silence" if self.watching_silence else self._phase
        if rank is None:
            return "warmup"
        if rank.batch is not None and rank.batches is not None and rank.batch >= rank.batches:
            return "boundary"
        if rank.n_in_epoch <= self.warmup_batches:
            return "warmup"
        if self._pause_due(rank):
            return "pause"
        return "train"

    def _reason(self, mode: str, idle: float, limit: float, basis: str) -> str:
        what = {
            "startup": "no first batch yet",
            "train": "no progress",
            "warmup": "no progress",
            "boundary": "no progress after the last batch of the epoch",
            "val": "validation silent",
            "save": "checkpoint save silent",
            "silence": "no output",
            "pause": "no progress after the step where training pauses",
        }.get(mode, "no progress")
        return f"{what} for {idle:.0f}s in {self._phase} (threshold {limit:.0f}s: {basis})"

    def _check_ranks(self, now: float) -> StallVerdict | None:
        stuck: list[tuple[int, float, float]] = []
        for key, r in self._ranks.items():
            if key is None or not r.armed:
                continue
            limit = self._threshold(self._mode_for(r), now)[0]
            if now - r.last_t > limit:
                stuck.append((key, now - r.last_t, limit))
        if not stuck:
            return None
        for key, _, _ in stuck:
            self._ranks[key].armed = False
        idle = max(s[1] for s in stuck)
        limit = min(s[2] for s in stuck)
        names = ", ".join(str(s[0]) for s in sorted(stuck))
        reason = (
            f"rank {names} made no progress for {idle:.0f}s while other ranks continue "
            f"(threshold {limit:.0f}s)"
        )
        return StallVerdict("train", idle, limit, reason, tuple(sorted(s[0] for s in stuck)))
