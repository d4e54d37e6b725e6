"""What the trainer says, taken in: console lines (through the output feed) and the
runner's side channel become phases, progress, warnings and checkpoints; they move the
stall detector and the projector, and the journal gets them (progress throttled)."""

from __future__ import annotations

import dataclasses
from collections import deque

from trainctl.agent.context import RunContext
from trainctl.core import events as E
from trainctl.core.feed import FedLine, OutputFeed
from trainctl.core.parse import line_rank
from trainctl.core.recovery import RunState
from trainctl.inside import NONE_KEY, attached_integration
from trainctl.inside.report import SAVE_ON_REQUEST_KEY
from trainctl.store.journal import ProgressThrottle

LOG_FLUSH_S = 0.25
LOG_TAIL = 200
OUTPUT_TAIL = 60  # lines kept to find the trainer's last exception
NONE_ATTACHED_TEXT = (
    "no integration attached (the script imported none of ultralytics, "
    "transformers, lightning, or its integration refused): console parsing"
)
NO_FORMAT_TEXT = "no progress format recognised; watching output silence"
BAD_SIDE_NAMED = 5  # side-channel events refused that are named each; then every 100th
NO_FORMAT_AFTER_S = 60.0  # of output none of which was read, before "no progress format" is said
SAY_FORMAT_AFTER_S = 2.0  # an instrumented run: time for the integration's "attached" to come


class Intake:
    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.phase = "startup"
        self.reported_phase = False  # the phase came from the side channel, not the console
        self.feed = OutputFeed(ctx.matcher, progress=ctx.spec.progress)
        self.throttles: dict[int | None, ProgressThrottle] = {}  # one per rank
        self.lead_rank: int | None = None  # torchrun: the lowest rank seen speaks for the job's rate
        self.structured = False  # progress comes on the side channel: ignore the console's
        self.structured_phases = False
        self.progressed = False  # this attempt went beyond the furthest batch of the run
        self.fatal_stop: str | None = None
        self.stalled = False
        self.replay_until: tuple[int, int] | None = None  # adopted: progress up to here is known
        self.save_on_request = False  # the trainer declared it (info runner.save_on_request)
        self.checkpoints = 0  # checkpoint events of this attempt (ok or not)
        self.bad_side_events = 0  # side-channel lines refused (not an event of its schema)
        self.last_checkpoint: E.Checkpoint | None = None
        self.log_lines: deque[str] = deque(maxlen=LOG_TAIL)
        self.last_log_flush = 0.0
        self.silence_said = False  # "no progress format recognised" said (once a run)
        self.silence_seen: float | None = None  # output with no format known, not said yet
        self.output_since: float | None = None  # this attempt's first console output
        self.tail: deque[str] = deque(maxlen=OUTPUT_TAIL)  # this attempt's last lines
        self.seen_progress = False  # a batch came in this attempt (start-up errors: fatal before)
        self.integration: str | None = None  # the zero-code integration that attached
        self.integration_said = False  # attached, or "none attached" said, this attempt
        self.rank_feeds: dict[str, tuple[int, OutputFeed]] = {}  # torchrun: a feed per rank file
        self.rank_progress: dict[int, E.Progress] = {}  # torchrun: each rank's last batch
        self.stuck_ranks: tuple[int, ...] = ()  # the stall's culprits (none known: its stalled ranks)
        self.save_dir: str | None = None  # where the library writes results (kept across attempts)
        self.last_progress: E.Progress | None = None  # the last position, merged (status)

    def begin(self, now: float) -> None:
        """A new attempt: forget what the last trainer said."""
        self.feed = OutputFeed(self.ctx.matcher, progress=self.ctx.spec.progress)
        self.throttles = {}
        self.lead_rank = None
        self.structured = self.structured_phases = False
        self.progressed = False
        self.fatal_stop = None
        self.stalled = False
        self.save_on_request = False
        self.replay_until = None
        self.checkpoints = 0
        self.last_checkpoint = None
        self.tail.clear()
        self.seen_progress = False
        self.output_since = None
        self.integration = None
        self.integration_said = False
        self.rank_feeds = {}
        self.rank_progress, self.stuck_ranks = {}, ()
        self.set_phase("startup", now, force=True)

    # ------------------------------------------------------------------ console
    def on_output(self, data: bytes) -> None:
        self.on_fed(self.feed.feed(data, self.ctx.clock()))
        self.flush_logs_if_due()

    def end_output(self) -> None:
        self.on_fed(self.feed.flush(self.ctx.clock()))

    def on_rank_output(self, rank: int, stream: str, data: bytes) -> None:
        """torchrun: output of one rank's file (``stream``): its progress carries ``rank``,
        its lines are marked ``[rankN]:`` (torchrun's own prefix), its warnings ``rank N:``."""
        if stream not in self.rank_feeds:
            self.rank_feeds[stream] = (rank, OutputFeed(self.ctx.matcher, progress=self.ctx.spec.progress))
        feed = self.rank_feeds[stream][1]
        self.on_fed(feed.feed(data, self.ctx.clock()), rank)
        self.flush_logs_if_due()

    def end_rank_output(self) -> None:
        for rank, feed in self.rank_feeds.values():
            self.on_fed(feed.flush(self.ctx.clock()), rank)

    def on_fed(self, lines: list[FedLine], rank: int | None = None) -> None:
        now = self.ctx.clock()
        if lines:
            self.on_activity(now, len(lines), rank)
        for fed in lines:
            said = rank if rank is not None else (line_rank(fed.text) if fed.warning else None)
            if fed.warning is not None and said is not None:  # an NCCL/gloo watchdog's rank
                fed = dataclasses.replace(
                    fed,
                    warning=dataclasses.replace(
                        fed.warning, text=f"rank {said}: {fed.warning.text}", rank=said
                    ),
                )
            if rank is not None:
                fed = dataclasses.replace(
                    fed,
                    text=f"[rank{rank}]: {fed.text}",  # torchrun's own prefix
                    events=tuple(
                        dataclasses.replace(ev, rank=rank) if isinstance(ev, E.Progress) else ev
                        for ev in fed.events
                    ),
                )
            self.log_lines.append(fed.text)
            self.tail.append(fed.text)
            if fed.warning is not None:
                self.on_warning(fed.warning)
            if fed.evidence:
                self.ctx.detector.on_evidence(now, "log")
            if not self.structured and not any(isinstance(ev, E.Progress) for ev in fed.events):
                self.ctx.detector.on_other_line(now, rank)  # an evaluation's summary: a pause
            for ev in fed.events:
                if isinstance(ev, E.Progress) and not self.structured:
                    self.on_progress(ev, console=True)
                elif isinstance(ev, E.Phase) and not (self.structured or self.structured_phases):
                    self.set_phase(ev.phase, now)

    def on_activity(self, now: float, lines: int = 1, rank: int | None = None) -> None:
        """Output came: the detector learns its silences; an unknown format is said once."""
        ctx = self.ctx
        ctx.detector.on_output(now, lines, rank)
        if self.output_since is None:
            self.output_since = now
        if not ctx.detector.watching_silence:
            return
        if not self.silence_said and self.integration is None and self.silence_seen is None:
            self.silence_seen = now  # said once no integration attached (say_unknown_format)
        self.say_unknown_format(now)
        if self.stalled and ctx.sm.state == RunState.STALLED:  # it speaks again
            self.stalled = False
            ctx.set_state(RunState.RUNNING, "output again")

    def say_unknown_format(self, now: float, at_stall: bool = False) -> None:
        """ "No progress format recognised", once a run, only when no integration reports
        batches: in a zero-code run the integration's "attached" comes on the side channel,
        read at other moments than the console, so it is given ``SAY_FORMAT_AFTER_S`` to
        come before the run is said to have none (never both); and only after
        ``NO_FORMAT_AFTER_S`` of output none of which was read (a run whose progress is read a
        second later never hears it), or at the stall its silence gives."""
        if self.silence_said or self.silence_seen is None:
            return
        if self.integration is not None or self.structured or not self.ctx.detector.watching_silence:
            self.silence_seen = None
            return
        if self.ctx.facts.instrumented and now - self.silence_seen < SAY_FORMAT_AFTER_S:
            return
        since = self.output_since if self.output_since is not None else now
        if not at_stall and now - since < NO_FORMAT_AFTER_S:
            return  # a minute of output none of which was read, or its silence's stall
        self.silence_said = True
        self.silence_seen = None
        self.ctx.info(NO_FORMAT_TEXT, "no_progress_format")

    def on_kernel_line(self, line: str) -> None:
        warning = self.ctx.matcher.feed(line, self.ctx.clock(), "kernel")
        if warning is not None:
            self.on_warning(warning)

    # ------------------------------------------------------------------ side channel
    def on_side_line(self, line: bytes) -> None:
        """One line of the trainer's side channel: an event checked against its schema on
        its own; one that does not fit is counted and named (the first few, then every
        hundredth), and the lines after it are read as usual."""
        try:
            ev = E.decode_checked(line)
        except ValueError as e:
            self.bad_side_events += 1
            n = self.bad_side_events
            if n <= BAD_SIDE_NAMED or n % 100 == 0:
                self.ctx.info(f"side channel: event refused ({n} so far): {e}", "side.bad_event")
            return
        now = self.ctx.clock()
        ev = dataclasses.replace(ev, ts=now)  # one time base for detector and journal
        if isinstance(ev, E.Progress) or (
            isinstance(ev, E.Info) and (attached_integration(ev.key) or ev.key.startswith("runner."))
        ):
            # its progress comes here (an integration attached, trainctl's own runner): its
            # console is no unknown format (not so for a refusal, a failed bootstrap, or a
            # script reporting only phases or checkpoints)
            self.ctx.detector.on_structured()
        if isinstance(ev, E.Progress):
            self.structured = True
            self.on_progress(ev)
        elif isinstance(ev, E.Phase):
            # A script may report only its phases (src/trainctl/inside/report.py): its console progress
            # still counts.
            self.structured_phases = True
            self.set_phase(ev.phase, now, reported=True)
        elif isinstance(ev, E.Checkpoint):
            if ev.ok:
                self.ctx.facts.last_checkpoint = ev.path
            self.checkpoints += 1
            self.last_checkpoint = ev
            self.ctx.emit(ev)  # journaled with its position (epoch, batch) and kind
            self.ctx.project(now)  # the dashboard's "last checkpoint" line, now
        elif isinstance(ev, (E.Info, E.Warning)):
            if isinstance(ev, E.Info) and ev.key == "runner.config_error":
                self.fatal_stop = f"bad configuration: {ev.text}"  # a restart cannot fix it
            if isinstance(ev, E.Info) and ev.key == SAVE_ON_REQUEST_KEY:
                self.save_on_request = True
            if (path := E.results_path(ev)) is not None:
                self.save_dir = path
            if isinstance(ev, E.Info) and (name := attached_integration(ev.key)):
                self.integration = name
                self.integration_said = True
            self.ctx.emit(ev)

    # ------------------------------------------------------------------ meaning
    def on_warning(self, warning: E.Warning) -> None:
        self.ctx.emit(warning)
        sig = self.ctx.matcher.catalog.get(warning.id)
        if sig is not None and sig.before_progress and self.seen_progress:
            return  # a start-up error's wording, after the first batch: not a start-up error
        if sig is not None and sig.action == "stop" and warning.severity == "fatal":
            self.fatal_stop = f"{warning.id}: {warning.text[:200]}"

    def set_phase(self, phase: str, now: float, force: bool = False, reported: bool = False) -> None:
        """Enter ``phase``; a repeat (the runner's own "startup" after ours) is dropped.
        ``reported``: the trainer said so on its side channel (not guessed from output)."""
        if phase == self.phase and not force:
            self.reported_phase = self.reported_phase or reported
            return
        self.reported_phase = reported
        self.phase = phase
        self.ctx.detector.on_phase(phase, now)
        self.ctx.emit(E.Phase(now, phase))
        self.ctx.project(now)

    def on_progress(self, ev: E.Progress, console: bool = False) -> None:
        ctx, now = self.ctx, ev.ts
        if ev.rank is None or self.lead_rank is None or ev.rank <= self.lead_rank:
            # the position (status, an unknown exit's judgement), replayed lines included;
            # a loss-only line (HF's dict after its bar) keeps the counter read before it
            self.last_progress = E.merged_progress(self.last_progress, ev)
        if self.replay_until is not None:  # an adopted trainer's lines its dead agent journaled
            if (ev.epoch or 0, ev.batch or 0) <= self.replay_until:
                ctx.detector.on_progress(ev, now)  # it is alive: only not news
                return
            self.replay_until = None
        self.seen_progress = True
        if console and self.ctx.facts.instrumented and not self.integration_said:
            self.integration_said = True
            self.ctx.info(NONE_ATTACHED_TEXT, NONE_KEY)
        # A batch line read from the console may be older than a val/save phase the trainer
        # reported on its side channel (two channels, read at different moments): it must
        # not end that phase, or a restart could kill the trainer in the middle of a save.
        late = console and self.reported_phase and self.phase in ("val", "save")
        if self.phase != "train" and not late:
            self.set_phase("train", now)
        mark = (ev.epoch or 0, ev.batch or 0)
        if mark > ctx.facts.furthest:  # only a batch beyond any earlier attempt's is new progress
            ctx.facts.furthest = mark
            self.progressed = True
        ctx.detector.on_progress(ev, now)
        if ev.rank is not None:
            self.rank_progress[ev.rank] = ev
            if self.lead_rank is None or ev.rank < self.lead_rank:
                self.lead_rank = ev.rank
        if ev.rank == self.lead_rank:  # ranks move in lockstep: one of them makes the rate
            ctx.projector.on_event(ev)  # every batch, not only the throttled ones in the journal
        warning = ctx.matcher.feed_progress(ev, now)
        if warning is not None:
            self.on_warning(warning)
        if ctx.sm.state in (RunState.STARTING, RunState.STALLED):
            self.stalled = False
            ctx.set_state(RunState.RUNNING, "progress")
        throttle = self.throttles.get(ev.rank)
        if throttle is None:
            throttle = self.throttles[ev.rank] = ProgressThrottle(1.0)
        admitted = throttle.offer(ev)
        if admitted is not None:
            ctx.emit(admitted)

    # ------------------------------------------------------------------ flushing
    def flush_progress(self, now: float, force: bool = False) -> None:
        for throttle in self.throttles.values():
            pending = throttle.flush(now, force=force)
            if pending is not None:
                self.ctx.emit(pending)

    def flush_logs_if_due(self) -> None:
        if self.ctx.clock() - self.last_log_flush >= LOG_FLUSH_S:
            self.flush_logs()

    def flush_logs(self) -> None:
        self.last_log_flush = self.ctx.clock()
        if self.log_lines:
            lines = tuple(self.log_lines)
            self.log_lines.clear()
            self.ctx.emit(E.Log(self.ctx.clock(), lines))
