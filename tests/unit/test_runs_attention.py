"""Which runs need a person (src/trainctl/store/listing.py needs_attention, attention_count) and how a run
reads as a row of `trainctl ls` and the dashboard's picker (row_cells)."""

from __future__ import annotations

import time

import pytest

from trainctl.store.listing import COLUMNS, attention_count, needs_attention, row_cells, row_key


def row(state: str, **kw) -> dict:
    base = {
        "where": "local",
        "run_dir": f"/runs/{state.lower()}",
        "job": "j",
        "state": state,
        "live": state in ("STARTING", "RUNNING", "STALLED", "BACKOFF"),
        "reason": "",
        "progress": None,
        "eta": None,
        "buffer_s": None,
        "incident": None,
        "started": 1.0,
    }
    return {**base, **kw}


@pytest.mark.parametrize(
    "r, why",
    [
        (row("RUNNING"), None),
        (row("FINISHED"), None),
        (row("PENDING", live=False), None),
        (row("STOPPED", reason="stopped by the user"), None),
        (row("STOPPED", reason="stopped by the user: Slurm job 7 cancelled before it ran"), None),
        (row("STALLED"), "stalled"),
        (row("FAILED", reason="restart budget spent"), "failed"),
        (row("BACKOFF"), "restarting after a fault"),
        (
            row("STOPPED", reason="Slurm job 7 was cancelled outside trainctl (scancel by someone else)"),
            "stopped: Slurm job 7 was cancelled outside trainctl (scancel by someone else)",
        ),
        (row("STOPPED"), "stopped: ?"),
        (row("STOPPED", reason="stopped: its time ran out"), "stopped: its time ran out"),
        (row("RUNNING", live=False), "its agent is gone"),
        (
            row("RUNNING", live=False, trainer_pid=42, unsupervised=True),
            "its trainer (pid 42) runs on unsupervised, its agent gone: `trainctl attach` adopts it",
        ),
        (
            row("RUNNING", live=False, trainer_pid=42, unsupervised=False),
            "its trainer (pid 42) runs on under its holder, its agent gone: `trainctl attach` adopts it",
        ),
        (row("RUNNING", buffer_s=-600.0), "deadline at risk"),
        (row("RUNNING", buffer_s=600.0), None),
        (row("FINISHED", buffer_s=-600.0), None),  # over: its deadline is history
        ({"where": "gpu-box", "error": "cannot list its runs: ssh: timeout", "started": None}, None),
    ],
)
def test_needs_attention(r, why):
    assert needs_attention(r) == why


def test_the_count_leaves_out_the_run_on_screen():
    rows = [
        row("STALLED"),
        row("FAILED"),
        row("RUNNING"),
        row("FINISHED"),
        row("STALLED", where="gpu-box", run_dir="/runs/stalled"),
    ]  # same path, other host
    assert attention_count(rows) == 3
    assert attention_count(rows, ("local", "/runs/stalled")) == 2
    assert attention_count(rows, ("gpu-box", "/runs/stalled")) == 2
    assert attention_count(rows, ("local", "/runs/running")) == 3
    assert attention_count([]) == 0
    assert row_key({"run_dir": "/x"}) == ("local", "/x")


def test_row_cells_say_state_where_progress_eta_incident_on_one_line_each():
    eta = time.mktime((2030, 1, 2, 15, 4, 0, 0, 0, -1))
    local = row(
        "RUNNING",
        progress={"epoch": 2, "epochs": 3, "batch": 40, "batches": 300},
        eta=eta,
        incident={"ts": eta - 3600, "text": "stall in train:\ndeadlock"},
    )
    cells = row_cells(local)
    assert len(cells) == len(COLUMNS)
    assert cells[:4] == ("RUNNING", "j", "/runs/running", "epoch 2/3 40/300")
    assert cells[4].endswith("15:04") and "\n" not in cells[6] and "deadlock" in cells[6]
    assert cells[5] == "-" and row_cells({**local, "goodput": {"ratio": 0.9312}})[5] == "93.1 %"
    assert row_cells({**local, "eta_declared": True})[4].endswith("15:04 (declared rate)")
    queued = row("PENDING", slurm={"job": "42", "partition": "debug", "reason": "BeginTime"})
    assert row_cells(queued)[:3] == ("PENDING (BeginTime)", "j", "slurm 42 debug")
    remote = row("FAILED", where="gpu-box", eta=eta)
    assert row_cells(remote)[2] == "gpu-box:/runs/failed" and row_cells(remote)[4] == "-"
    down = {"where": "gpu-box", "error": "cannot list its runs: \x1b[31mno route", "started": None}
    assert row_cells(down)[0] == "?" and "\x1b" not in row_cells(down)[6]


def test_a_kept_fold_reads_only_the_new_lines_and_starts_over_on_a_new_journal(tmp_path):
    from trainctl.core import events as E
    from trainctl.hosts.local import summarize
    from trainctl.store.journal import Journal
    from trainctl.store.listing import JournalFold

    path = tmp_path / "events.jsonl"
    journal = Journal(path)
    journal.append(E.Start(10.0, 1, 42, "A"))
    journal.append(E.State(10.5, "RUNNING", "progress"))
    journal.append(E.Progress(11.0, 1, 2, 3, 10, {"loss": 1.0}))
    folds: dict[str, JournalFold] = {}
    first = summarize(tmp_path, with_slurm=False, folds=folds)
    assert first["state"] == "RUNNING" and first["progress"]["batch"] == 3 and first["started"] == 10.0
    fold = folds[str(tmp_path)]
    offset = fold.offset
    assert offset == path.stat().st_size
    journal.append(E.Progress(12.0, 1, 2, 4, 10, {"loss": 0.9}))
    journal.append(E.Stall(13.0, "train", 60.0, "deadlock"))
    journal.append(E.State(13.0, "STALLED", "no batch for 60 s"))
    with open(path, "a") as f:
        f.write('{"type": "state", "ts": 14')  # a line being written: not yet
    again = summarize(tmp_path, with_slurm=False, folds=folds)
    assert fold.offset > offset and again["state"] == "STALLED" and again["progress"]["batch"] == 4
    assert again["incident"]["text"] == "stall in train: deadlock"
    assert again == summarize(tmp_path, with_slurm=False)  # the same as a whole read
    journal.close()
    path.unlink()  # a new journal: from its start
    fresh = Journal(path)
    fresh.append(E.State(20.0, "FAILED", "gave up"))
    fresh.close()
    last = summarize(tmp_path, with_slurm=False, folds=folds)
    assert last["state"] == "FAILED" and last["progress"] is None and last["started"] == 20.0


def test_the_frequent_look_asks_slurm_only_of_the_runs_still_going(tmp_path, monkeypatch):
    from trainctl.core import events as E
    from trainctl.hosts.local import summarize
    from trainctl.hosts.slurm import queue as slurm
    from trainctl.store.journal import Journal

    asked: list[str] = []
    monkeypatch.setattr(slurm, "job_info", lambda job: asked.append(job))
    for name, state, job in (("done", "FINISHED", "7"), ("going", "RUNNING", "8")):
        run_dir = tmp_path / name
        run_dir.mkdir()
        slurm.add_job(run_dir, job)
        journal = Journal(run_dir / "events.jsonl")
        journal.append(E.State(1.0, state, ""))
        journal.close()
    done = summarize(tmp_path / "done", ended_slurm=False)
    going = summarize(tmp_path / "going", ended_slurm=False)
    assert asked == ["8"] and done["slurm"] == {"job": "7", "jobs": ["7"]} and going["slurm"]["job"] == "8"
    summarize(tmp_path / "done")  # `ls`: every run's job
    assert asked == ["8", "7"]
