"""The agent's phase bookkeeping, driven directly (no trainer): a batch line read late from
the console must not end a save the trainer reported on its side channel."""

from __future__ import annotations

import time

from trainctl.agent.context import RunConfig, RunContext
from trainctl.agent.intake import Intake
from trainctl.core import events as E
from trainctl.core.signatures import Catalog
from trainctl.store.journal import Journal
from trainctl.store.paths import RunFiles
from trainctl.store.spec import RunSpec


def make_agent(tmp_path):
    """The agent's intake, the part that keeps the phase: its context built without an agent
    (given a journal and a catalog, as the service gives them)."""
    (tmp_path / "run").mkdir()
    files = RunFiles(tmp_path / "run")
    spec = RunSpec(job_name="t", kind="command", command=["true"])
    ctx = RunContext(RunConfig(files, spec, time.time), Journal(files.events), Catalog([]))
    return Intake(ctx)


def batch(ts: float, b: int) -> E.Progress:
    return E.Progress(ts, 1, 2, b, 5, {"loss": 0.5})


def test_a_late_console_batch_does_not_end_a_reported_save(tmp_path):
    agent = make_agent(tmp_path)
    agent.on_progress(batch(1.0, 4), console=True)
    assert agent.phase == "train"
    agent.set_phase("save", 2.0, reported=True)  # side channel: saving()
    agent.on_progress(batch(2.1, 5), console=True)  # printed before the save began
    assert agent.phase == "save"
    agent.set_phase("train", 6.0, reported=True)  # side channel: save done
    assert agent.phase == "train"


def test_console_progress_ends_a_guessed_phase_and_structured_progress_any(tmp_path):
    agent = make_agent(tmp_path)
    agent.set_phase("val", 1.0)  # guessed from the console
    agent.on_progress(batch(2.0, 1), console=True)
    assert agent.phase == "train"
    agent.set_phase("save", 3.0, reported=True)
    agent.on_progress(batch(4.0, 2))  # side-channel progress: in order
    assert agent.phase == "train"
