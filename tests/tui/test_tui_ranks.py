"""The dashboard's ranks: a row per torchrun rank (batch, rate, state, CPU), the culprit of
a stall marked; the chart follows one rank."""

from __future__ import annotations

from trainctl.core import events as ev
from trainctl.tui.model import RunModel
from trainctl.tui.widgets.resources_panel import ResourcesInfo, resources_text


def _progress(ts, rank, batch, loss=1.0):
    return ev.Progress(ts, 1, 2, batch, 20, {"loss": loss}, rank=rank)


def test_a_row_per_rank_with_its_rate_and_the_stuck_one_marked():
    m = RunModel()
    m.apply_all(
        [
            ev.Start(0.0, 1, 10, None),
            _progress(1.0, 0, 2),
            _progress(1.0, 1, 2),
            _progress(2.0, 0, 6),
            _progress(2.0, 1, 6),
            _progress(3.0, 1, 7),
            ev.Stall(9.0, "train", 6.0, "deadlock", ranks=(1,)),
            ev.State(9.0, "STALLED"),
        ]
    )
    rows = m.rank_rows()
    assert [(r.rank, r.batch, r.rate) for r in rows] == [(0, 6, 4.0), (1, 7, 1.0)]
    assert m.stuck_ranks == (1,)
    # the chart and counters follow rank 0 only: one loss point per batch, not per rank
    assert m.losses["loss"].xs == [2.0, 6.0] and m.progress.rank == 0
    procs = (
        {"pid": 10, "role": "main", "status": "sleeping", "cpu_percent": 0.0},
        {"pid": 11, "role": "child", "status": "sleeping", "cpu_percent": 3.0, "rank": 0},
        {"pid": 12, "role": "child", "status": "sleeping", "cpu_percent": 1.0, "rank": 1},
        {"pid": 13, "role": "worker", "status": "sleeping", "cpu_percent": 0.5, "rank": 1},
    )
    text = resources_text(ResourcesInfo(procs, None, True, True, None, rows, m.stuck_ranks)).plain
    lines = text.splitlines()
    assert lines[0].startswith(" rank 0") and "6/20" in lines[0] and "4.00 it/s" in lines[0]
    assert lines[1].startswith("▶rank 1") and "STUCK" in lines[1] and "+1w" in lines[1]
    assert "cpu 2%" in lines[1], lines[1]  # the rank and its worker
    assert lines[-1] == "no GPU"


def test_a_new_attempt_starts_new_rank_rows_and_a_plain_run_keeps_the_process_rows():
    m = RunModel()
    m.apply_all(
        [_progress(1.0, 0, 3), ev.Stall(2.0, "train", 5.0, "deadlock", ranks=(1,)), ev.Start(3.0, 2, 11, "B")]
    )
    assert m.rank_rows() == () and m.stuck_ranks == ()
    procs = ({"pid": 10, "role": "main", "status": "running", "cpu_percent": 90.0},)
    assert resources_text(ResourcesInfo(procs, None, True)).plain.startswith("main")
