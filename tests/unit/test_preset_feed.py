"""The agent's preset feed: this run's file in the preset history written at a bounded rate
and at once on an incident, kept by a new agent of the same run, and each preset's risk
given to the projector (the other runs' records with this run's)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainctl.agent.preset_feed import WRITE_EVERY_S, PresetFeed
from trainctl.core import events as E
from trainctl.core.projection import Projector
from trainctl.store.preset_history import PresetHistory, Record, RecordKey
from trainctl.system.machine import machine_id


class FakeContext:
    def __init__(self, run_dir: Path) -> None:
        self.projector = Projector(preset="A")
        self.facts = SimpleNamespace(gpu_probe=None)
        self.spec = SimpleNamespace(job_name="yolo")
        self.files = SimpleNamespace(dir=run_dir)
        self.infos: list[str] = []
        self.clock = lambda: 0.0

    def info(self, text: str, key: str = "") -> None:
        self.infos.append(text)

    def load_preset(self, name: str | None) -> None:
        return None


def _written(history: PresetHistory, run: str) -> dict:
    return json.loads(history.run_file(run).read_text())


def test_bounded_writes_an_incident_at_once_and_the_risk_to_the_projector(tmp_path: Path) -> None:
    history = PresetHistory(tmp_path / "hist")
    other = RecordKey("yolo", machine_id(), "A", "")
    history.write_run("earlier", [Record(other, 8.0, 1000, {"deadlock": 2}, {"detection": 80.0}, 2)], 0.0)
    ctx = FakeContext(tmp_path / "run-1")
    feed = PresetFeed(ctx, history)
    assert ctx.projector.risks["A"].incidents == 2  # the earlier run's, before this one starts
    feed(E.Start(0.0, 1, 10, "A"))
    assert _written(history, "run-1")["updated"] == 0.0
    for i in range(1, 20):
        feed(E.Progress(float(i), 1, 1, i, 100))
    assert _written(history, "run-1")["updated"] == 0.0  # within WRITE_EVERY_S: not rewritten
    feed(E.Progress(WRITE_EVERY_S + 1, 1, 1, 20, 100))
    assert _written(history, "run-1")["updated"] == WRITE_EVERY_S + 1
    feed(E.Stall(40.0, "train", 9.0, "deadlock"))
    feed(E.Exit(41.0, -15, "SIGTERM"))
    feed(E.Restart(41.5, 2, "the trainer stalled", "A", None))
    data = _written(history, "run-1")
    assert data["updated"] == 41.5 and data["records"][0]["incidents"] == {"deadlock": 1}
    risk = ctx.projector.risks["A"]
    assert risk.incidents == 3 and risk.hours == pytest.approx(8.0 + 31.0 / 3600)
    assert (risk.runs, risk.this_run) == (2, True)  # the earlier run's and this one's: the scope shown


def test_a_new_agent_of_the_run_goes_on_from_its_file(tmp_path: Path) -> None:
    history = PresetHistory(tmp_path / "hist")
    first = PresetFeed(FakeContext(tmp_path / "run-1"), history)
    first(E.Start(0.0, 1, 10, "A"))
    first(E.Exit(3600.0, -9, "SIGKILL"))  # the agent dies with it: no restart event
    ctx = FakeContext(tmp_path / "run-1")
    second = PresetFeed(ctx, history)
    second(E.Start(4000.0, 2, 11, "A"))
    second(E.Exit(5800.0, 0))
    [r] = history.read("yolo")[0]
    assert r.hours == pytest.approx(1.5) and r.runs == 1
    # the two agents' records are one run's, and the projection says 'this run'
    assert (ctx.projector.risks["A"].runs, ctx.projector.risks["A"].this_run) == (1, True)


def test_an_unreadable_own_file_starts_fresh_and_says_so(tmp_path: Path) -> None:
    history = PresetHistory(tmp_path / "hist")
    history.dir.mkdir(parents=True)
    history.run_file("run-1").write_text("{torn")
    ctx = FakeContext(tmp_path / "run-1")
    feed = PresetFeed(ctx, history)
    assert any("starts a fresh record" in t for t in ctx.infos)
    feed(E.Start(0.0, 1, 10, "A"))
    feed(E.Exit(360.0, 0))
    assert history.read("yolo")[0][0].hours == pytest.approx(0.1)


def test_a_history_that_cannot_be_written_is_said_once(tmp_path: Path) -> None:
    (tmp_path / "hist").write_text("a file where the directory should be")
    ctx = FakeContext(tmp_path / "run-1")
    feed = PresetFeed(ctx, PresetHistory(tmp_path / "hist"))
    feed(E.Start(0.0, 1, 10, "A"))
    feed(E.Stall(40.0, "train", 9.0, "deadlock"))
    assert sum("cannot write the preset history" in t for t in ctx.infos) == 1


def test_checkpoint_every_auto_decides_writes_and_journals(tmp_path: Path) -> None:
    from trainctl.agent.checkpoint_auto import CheckpointAuto
    from trainctl.core.preset_risk import estimate
    from trainctl.inside.checkpoint_every import EVERY_FILE, read_every

    run_dir = tmp_path / "run-1"
    run_dir.mkdir()
    ctx = FakeContext(run_dir)
    auto = CheckpointAuto(ctx)
    auto(E.Start(0.0, 1, 10, "A"))
    assert not (run_dir / EVERY_FILE).exists()  # no save measured yet: the job's default stands
    auto(E.Phase(100.0, "save"))
    auto(E.Checkpoint(102.0, "c.pt", 1, batch=50, kind="periodic"))
    first = read_every(run_dir / EVERY_FILE)
    assert first == pytest.approx((2 * 2.0 * 2.0 * 3600) ** 0.5)  # the prior: one in two hours
    assert ctx.infos[-1].startswith("checkpoint_every auto: 170 s = √(2 × 2.00 s save × 2.00 h")
    ctx.projector.risks = {"A": estimate(10.0, 21)}  # two incidents an hour
    auto(E.Restart(200.0, 2, "the trainer stalled", "A", None))
    second = read_every(run_dir / EVERY_FILE)
    assert second is not None and second < first
    assert "(was 170 s)" in ctx.infos[-1]
    n = len(ctx.infos)
    auto(E.Start(210.0, 2, 11, "A"))  # nothing moved: no new decision
    assert len(ctx.infos) == n
