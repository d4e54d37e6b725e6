"""Which runs need a person (engine/runs.py needs_attention, attention_count) and how a run
reads as a row of `trainctl ls` and the dashboard's picker (row_cells)."""
from __future__ import annotations

import time

import pytest

from trainctl.engine.runs import COLUMNS, attention_count, needs_attention, row_cells, row_key


def row(state: str, **kw) -> dict:
    base = {"where": "local", "run_dir": f"/runs/{state.lower()}", "job": "j", "state": state,
            "live": state in ("STARTING", "RUNNING", "STALLED", "BACKOFF"), "reason": "",
            "progress": None, "eta": None, "buffer_s": None, "incident": None, "started": 1.0}
    return {**base, **kw}


@pytest.mark.parametrize("r, why", [
    (row("RUNNING"), None),
    (row("FINISHED"), None),
    (row("PENDING", live=False), None),
    (row("STOPPED", reason="stopped by the user"), None),
    (row("STOPPED", reason="stopped by the user: Slurm job 7 cancelled before it ran"), None),
    (row("STALLED"), "stalled"),
    (row("FAILED", reason="restart budget spent"), "failed"),
    (row("BACKOFF"), "restarting after a fault"),
    (row("STOPPED", reason="Slurm job 7 was cancelled outside trainctl (scancel by someone else)"),
     "stopped: Slurm job 7 was cancelled outside trainctl (scancel by someone else)"),
    (row("STOPPED"), "stopped: ?"),
    (row("STOPPED", reason="stopped: its time ran out"), "stopped: its time ran out"),
    (row("RUNNING", live=False), "its agent is gone"),
    (row("RUNNING", buffer_s=-600.0), "deadline at risk"),
    (row("RUNNING", buffer_s=600.0), None),
    (row("FINISHED", buffer_s=-600.0), None),      # over: its deadline is history
    ({"where": "gpu-box", "error": "cannot list its runs: ssh: timeout", "started": None}, None),
])
def test_needs_attention(r, why):
    assert needs_attention(r) == why


def test_the_count_leaves_out_the_run_on_screen():
    rows = [row("STALLED"), row("FAILED"), row("RUNNING"), row("FINISHED"),
            row("STALLED", where="gpu-box", run_dir="/runs/stalled")]   # same path, other host
    assert attention_count(rows) == 3
    assert attention_count(rows, ("local", "/runs/stalled")) == 2
    assert attention_count(rows, ("gpu-box", "/runs/stalled")) == 2
    assert attention_count(rows, ("local", "/runs/running")) == 3
    assert attention_count([]) == 0
    assert row_key({"run_dir": "/x"}) == ("local", "/x")


def test_row_cells_say_state_where_progress_eta_incident_on_one_line_each():
    eta = time.mktime((2030, 1, 2, 15, 4, 0, 0, 0, -1))
    local = row("RUNNING", progress={"epoch": 2, "epochs": 3, "batch": 40, "batches": 300}, eta=eta,
                incident={"ts": eta - 3600, "text": "stall in train:\ndeadlock"})
    cells = row_cells(local)
    assert len(cells) == len(COLUMNS)
    assert cells[:4] == ("RUNNING", "j", "/runs/running", "epoch 2/3 40/300")
    assert cells[4].endswith("15:04") and "\n" not in cells[5] and "deadlock" in cells[5]
    queued = row("PENDING", slurm={"job": "42", "partition": "debug", "reason": "BeginTime"})
    assert row_cells(queued)[:3] == ("PENDING (BeginTime)", "j", "slurm 42 debug")
    remote = row("FAILED", where="gpu-box", eta=eta)
    assert row_cells(remote)[2] == "gpu-box:/runs/failed" and row_cells(remote)[4] == "-"
    down = {"where": "gpu-box", "error": "cannot list its runs: \x1b[31mno route", "started": None}
    assert row_cells(down)[0] == "?" and "\x1b" not in row_cells(down)[5]
