"""checkpoint_every = "auto": Young's interval from the measured save pause and the preset's
failure rate, bounded and re-decided only on a real change; the pauses read from events;
the trainer following the agent's file; the job file's "auto"."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainctl.config import load_job
from trainctl.core import events as E
from trainctl.core.checkpoint_interval import MAX_S, MIN_S, SavePauses, decide, young_interval
from trainctl.core.preset_risk import estimate
from trainctl.inside.checkpoint_every import POLL_S, EveryFollower


def test_young_interval() -> None:
    # a 2 s save and a failure every 2 hours: √(2 × 2 × 7200) = 169.7 s
    assert young_interval(2.0, 7200.0) == pytest.approx(math.sqrt(28800.0))
    assert young_interval(0.0, 7200.0) == 0.0


def test_decide_from_the_preset_risk() -> None:
    risky, safe = estimate(9.0, 9), estimate(300.0, 0)  # ~1 incident per hour / per 600 h
    d = decide(None, 1.5, risky)
    assert d is not None
    assert d.every_s == pytest.approx(math.sqrt(2 * 1.5 * risky.mean_time_between_h * 3600))
    assert "√(2 × 1.50 s save × " in d.text() and "h between incidents" in d.text()
    long = decide(None, 1.5, safe)
    assert long is not None and long.every_s > d.every_s


def test_bounds() -> None:
    assert decide(None, 0.01, estimate(0.0, 50)).every_s == MIN_S  # type: ignore[union-attr]
    d = decide(None, 60.0, estimate(1000.0, 0))
    assert d is not None and d.every_s == MAX_S and d.young_s > MAX_S and "bounded from" in d.text()


def test_no_save_measured_no_decision() -> None:
    assert decide(None, None, estimate(0.0, 0)) is None
    assert decide(None, 0.0, estimate(0.0, 0)) is None


def test_redecided_only_when_it_moves() -> None:
    risk = estimate(5.0, 2)
    first = decide(None, 2.0, risk)
    assert first is not None
    assert decide(first.every_s, 2.2, risk) is None  # within 20 %
    again = decide(first.every_s, 2.0, estimate(5.0, 8))  # four times the incidents
    assert again is not None and again.every_s < first.every_s and again.previous_s == first.every_s
    assert f"(was {first.every_s:.0f} s)" in again.text()


def test_save_pauses_from_events() -> None:
    p = SavePauses()
    assert not p.on_event(E.Phase(10.0, "save"))
    assert p.on_event(E.Checkpoint(11.5, "c.pt", 1, batch=10, kind="periodic"))
    p.on_event(E.Phase(11.6, "train"))
    p.on_event(E.Phase(20.0, "save"))
    p.on_event(E.Start(25.0, 2, 1, "A"))  # the save was cut short: no sample
    assert not p.on_event(E.Checkpoint(30.0, "c.pt", 1, batch=20))
    p.on_event(E.Phase(40.0, "save"))
    assert not p.on_event(E.Checkpoint(43.0, "c.pt", 1, ok=False))  # a failed save: no sample
    p.on_event(E.Phase(50.0, "save"))
    p.on_event(E.Checkpoint(52.5, "c.pt", 2))
    assert list(p.pauses) == [1.5, 2.5] and p.median() == 2.0


def test_the_trainer_follows_the_agents_file(tmp_path: Path) -> None:
    now = [0.0]
    path = tmp_path / "checkpoint-every.json"
    f = EveryFollower(path, 600.0, clock=lambda: now[0])
    assert f() == 600.0  # no file: the job's
    path.write_text(json.dumps({"every_s": 95.0}))
    assert f() == 600.0  # polled a moment ago
    now[0] += POLL_S
    assert f() == 95.0
    path.write_text("garbage")
    now[0] += POLL_S
    assert f() == 95.0  # a bad file keeps the last good interval


def test_job_file_auto(tmp_path: Path) -> None:
    body = '[ultralytics]\nmodel = "m"\ndata = "d"\n'
    (tmp_path / "a.toml").write_text(f'kind = "ultralytics"\ncheckpoint_every = "auto"\n{body}')
    (tmp_path / "b.toml").write_text(f'kind = "ultralytics"\ncheckpoint_every = "90s"\n{body}')
    a, b = load_job(tmp_path / "a.toml"), load_job(tmp_path / "b.toml")
    assert (a.checkpoint_auto, a.checkpoint_every) == (True, 600.0)
    assert (b.checkpoint_auto, b.checkpoint_every) == (False, 90.0)
    (tmp_path / "c.toml").write_text(f'kind = "ultralytics"\ncheckpoint_every = "often"\n{body}')
    with pytest.raises(Exception, match='"auto"'):
        load_job(tmp_path / "c.toml")
