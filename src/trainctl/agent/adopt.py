"""Adoption: a new agent takes over a run whose agent died (kill -9, OOM killer, a lost
box session).  Everything it needs is in the run directory: the journal says where the run
was (attempt, preset, restarts, last good checkpoint, furthest batch); the holder's status
file says whether that attempt's trainer lives on, or how it ended while nobody watched."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainctl.core import events as E
from trainctl.core.projection import LEARNS_FROM, Projector
from trainctl.core.recovery import FINAL_STATES, Outcome, OutcomeKind
from trainctl.inside.report import SAVE_ON_REQUEST_KEY
from trainctl.store.journal import read_events
from trainctl.store.snapshot import load_view


@dataclass
class Where:
    """Where the run was when its agent died, from its journal."""

    attempt: int = 0  # the last attempt started (0: none)
    preset: str | None = None  # that attempt's preset
    exited: int | None = None  # its exit code, when journaled
    restart: E.Restart | None = None  # a restart journaled after that exit (died in BACKOFF)
    state: str | None = None  # the last state journaled
    last_checkpoint: str | None = None
    furthest: tuple[int, int] = (0, 0)
    auto_restarts: int = 0
    progressed: bool = False  # the last attempt went beyond the batches before it
    save_on_request: bool = False  # its trainer declared it (read before the agent died)

    @property
    def ended(self) -> bool:
        return self.state in FINAL_STATES

    def outcome(self) -> Outcome:
        """The last attempt's outcome, when it exited but no decision was journaled."""
        rc = self.exited
        kind = OutcomeKind.FINISHED if rc == 0 else OutcomeKind.CRASH
        return Outcome(kind, self.progressed, rc, self.preset)


def where_the_run_was(journal: Path) -> Where:
    w = Where()
    before = (0, 0)  # the furthest batch before the last attempt began
    try:
        events = list(read_events(journal))
    except OSError:
        return w
    for ev in events:
        if isinstance(ev, E.Start):
            w.attempt, w.preset, w.exited, w.restart = ev.attempt, ev.preset, None, None
            before, w.progressed, w.save_on_request = w.furthest, False, False
        elif isinstance(ev, E.Info) and ev.key == SAVE_ON_REQUEST_KEY:
            w.save_on_request = True
        elif isinstance(ev, E.Exit):
            w.exited = ev.returncode
        elif isinstance(ev, E.Restart):
            w.restart = ev
            if "requested by the user" not in ev.reason:
                w.auto_restarts += 1
        elif isinstance(ev, E.State):
            w.state = ev.state
        elif isinstance(ev, E.Checkpoint) and ev.ok:
            w.last_checkpoint = ev.path
        elif isinstance(ev, E.Progress):
            mark = (ev.epoch or 0, ev.batch or 0)
            if mark > w.furthest:
                w.furthest = mark
            if mark > before:
                w.progressed = True
    return w


def projector_catches_up(projector: Projector, journal: Path) -> None:
    """A new agent's projection goes on from the run's journal: the run's first start (its
    cost so far), the attempts, stalls, restarts and checkpoints, and the current attempt's
    batches (journaled about once a second), so the rate shown is this attempt's, not the
    rate earlier runs measured until the new agent's meter fills again."""

    def learned() -> Iterator[E.Event]:
        lead: int | None = None  # ranks move in lockstep: the lowest one's batches make the rate
        for ev in read_events(journal):
            if isinstance(ev, E.Progress):
                if ev.rank is not None:
                    lead = ev.rank if lead is None else min(lead, ev.rank)
                    if ev.rank != lead:
                        continue
                yield ev
            elif ev.type in LEARNS_FROM:
                yield ev

    try:
        projector.catch_up(learned())
    except OSError:
        pass


def agent_running(run_dir: Path) -> bool:
    """An agent holds this run (alive, even if stopped): its flock on agent.lock is held."""
    from trainctl.client.connection import agent_holds

    return agent_holds(run_dir)


def needs_adoption(run_dir: Path) -> bool:
    """True for a run whose agent is gone while the run is not over: its trainer lives on
    (under its holder), or its agent died between attempts (BACKOFF, STARTING)."""
    from trainctl.holder.handle import HeldTrainer, live_trainer

    run_dir = Path(run_dir)
    if not (run_dir / "spec.json").exists() or agent_running(run_dir):
        return False
    if (run_dir / "slurm.json").exists() or (
        run_dir.name.startswith("node") and (run_dir.parent / "slurm.json").exists()
    ):
        # a Slurm run's agent is its job's (on a compute node, whose lock this machine may
        # not see), and so is a node's of a job of several (RUN/node<N>): the job's next
        # start goes on with the run, never a client's agent here
        return False
    if load_view(run_dir).view.state in FINAL_STATES:
        return False  # an ended run (the common case): its snapshot and the journal's tail say so
    was = where_the_run_was(run_dir / "events.jsonl")
    if was.ended:
        return False
    if was.attempt and was.exited is None and HeldTrainer.adopt(run_dir, was.attempt) is not None:
        return True
    if was.exited is None and (st := live_trainer(run_dir)) is not None and st.get("attempt") == was.attempt:
        return True  # its holder was killed too: the trainer runs on unsupervised
    return was.state in ("BACKOFF", "STARTING")
