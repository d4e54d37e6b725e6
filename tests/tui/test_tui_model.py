"""Pure tests of the dashboard's run model and the editor's form model (no app)."""

from __future__ import annotations

import math

import pytest

from trainctl.config import preset_problems
from trainctl.core import events as ev
from trainctl.tui.model import RunModel, Series
from trainctl.tui.preset_form import build_text, field_for, form_values

pytestmark = pytest.mark.timeout(20)


def progress(ts: float, epoch: int, batch: int, **losses: float) -> ev.Progress:
    return ev.Progress(
        ts, epoch=epoch, epochs=3, batch=batch, batches=100, losses=losses or {"box_loss": 1.0}, rate=2.0
    )


def test_global_batch_index_restart_marks_and_nan():
    model = RunModel()
    model.apply_all(
        [
            progress(1, 1, 50),
            progress(2, 2, 10, box_loss=math.nan, cls_loss=2.0),
            ev.Restart(3, attempt=2, reason="stall", preset="B"),
            progress(4, 2, 1),
        ]
    )
    assert model.losses["box_loss"].xs == [50.0, 101.0]  # the NaN is not drawn
    assert model.losses["cls_loss"].xs == [110.0]
    assert model.restarts == [(110.0, "#2 B")]
    assert model.preset == "B" and model.epoch_started == 2


def test_warnings_counted_newest_first():
    model = RunModel()
    w = dict(severity="info", text="t", advice="a")
    model.apply_all(
        [
            ev.Warning(1, id="a", **w),
            ev.Warning(2, id="b", **w),
            ev.Warning(3, id="a", **w),
            ev.Warning(4, id="a", count=7, **w),
        ]
    )
    rows = model.warning_rows()
    assert [r.id for r in rows] == ["a", "b"]
    assert rows[0].count == 7 and rows[1].count == 1


def test_stall_and_info_become_rows():
    model = RunModel()
    model.apply_all(
        [
            ev.Stall(
                1,
                phase="train",
                idle_s=61,
                diagnosis="deadlock",
                stacks="/r/stacks/s.txt",
                detail="worker in futex_wait",
            ),
            ev.Info(2, text="grace raised", key="stall.grace"),
        ]
    )
    stall = model.warnings["stall.deadlock"]
    assert stall.severity == "error" and "futex_wait" in stall.advice and "s.txt" in stall.advice
    assert model.warnings["stall.grace"].severity == "info"


@pytest.mark.parametrize("n", [0, 1, 399, 400, 401, 12345])
def test_sampled_series_is_small_and_ends_on_the_last_point(n):
    series = Series([float(i) for i in range(n)], [float(i) for i in range(n)])
    xs, ys = series.sampled(400)
    assert len(xs) <= 401 and xs == ys
    if n:
        assert xs[0] == 0 and xs[-1] == n - 1


def test_form_round_trip_is_identity(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for name in ("A", "B"):
        text = (root / "src" / "trainctl" / "presets" / f"{name}.toml").read_text()
        new, problems = build_text(text, form_values(text), f"{name}.toml")
        assert new == text and problems == []


def test_form_changes_keep_comments_and_name_keys():
    text = (
        '# top comment\ndescription = "x"\n\n[dataloader]\nworkers = 2  # two\n'
        "\n[train]\nval = false  # keep\n"
    )
    values = form_values(text)
    values["dataloader-workers"] = "4"
    values["train"] = "val = false\nbatch = 16\noptimizer = SGD"
    values["env"] = 'MIOPEN_FIND_MODE=2\nQUOTED="a b"'
    values["args"] = "--cache 'ram disk'"
    new, problems = build_text(text, values, "p.toml")
    assert problems == []
    assert "# top comment" in new and "workers = 4  # two" in new and "val = false  # keep" in new
    assert 'optimizer = "SGD"' in new and "batch = 16" in new
    assert 'MIOPEN_FIND_MODE = "2"' in new and 'QUOTED = "a b"' in new
    assert 'args = ["--cache", "ram disk"]' in new
    assert preset_problems(new, "p.toml") == []
    values["threads-omp_num_threads"] = "-1"
    values["args"] = "--unbalanced 'quote"
    _, problems = build_text(text, values, "p.toml")
    labels = {p.key for p in problems}
    assert {"[threads] omp_num_threads", "args"} <= labels
    assert {field_for(p) for p in problems} == {"threads-omp_num_threads", "args"}
    assert all(str(p).startswith("p.toml: ") for p in problems)


def test_clearing_a_field_removes_the_key():
    text = "[dataloader]\nworkers = 2\nprefetch_factor = 2\n"
    values = form_values(text)
    values["dataloader-prefetch_factor"] = ""
    new, problems = build_text(text, values, "p.toml")
    assert "prefetch_factor" not in new and "workers = 2" in new and problems == []
