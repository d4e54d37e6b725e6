"""The projection under a real agent: a PyTorch loop whose job has a deadline and a budget
it cannot meet.  `trainctl status` answers from the live agent (human and --json), the
at-risk warnings come once each (not on every tick), and after the run `status` still
answers from the journal."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import PYTHON, ROOT, start_trainctl

pytestmark = pytest.mark.e2e

TRAIN_LOOP = ROOT / "tests" / "helpers" / "scripts" / "train_loop.py"


def status(run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainctl", "status", str(run_dir), *extra],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=str(ROOT),
    )


@pytest.mark.timeout(90)
def test_status_and_at_risk_warnings_on_a_live_run(tmp_path):
    # ~300 batches at 0.05 s: about 15 s of work; the deadline is 5 s away and the budget
    # ($36/h = 1 cent/s, $0.04) is spent after about 4 s.
    deadline = (dt.datetime.now() + dt.timedelta(seconds=5)).replace(microsecond=0)
    command = [
        PYTHON,
        str(TRAIN_LOOP),
        "--epochs",
        "2",
        "--batches",
        "150",
        "--batch-time",
        "0.05",
        "--workers",
        "0",
    ]
    job = tmp_path / "trainctl.toml"
    job.write_text(
        f'kind = "command"\nname = "late"\ncommand = {json.dumps(command)}\n'
        f'deadline = "{deadline.isoformat()}"\ncost_per_hour = 36.0\nbudget = 0.04\n'
    )
    with start_trainctl(["run", str(job), "--json"]) as tc:
        tc.wait_event(
            lambda e: e.type == "progress" and e.epoch == 1 and (e.batch or 0) >= 60,
            40,
            "progress past batch 60",
        )
        live = status(tc.run_dir, "--json")
        assert live.returncode == 0, live.stderr
        st = json.loads(live.stdout)
        assert st["live"] is True and st["state"] == "RUNNING", st
        proj = st["projection"]
        now = time.time()
        assert proj["deadline"] == pytest.approx(deadline.timestamp())
        assert proj["rate"] == pytest.approx(20, rel=0.5), proj  # 0.05 s a batch
        # 1 s or so of work done of 300 batches' worth: the ETA is several seconds ahead
        assert now + 2 < proj["eta"] < now + 30, (proj["eta"] - now, proj)
        assert proj["cost_so_far"] > 0 and proj["cost_at_eta"] > proj["cost_so_far"]
        human = status(tc.run_dir)
        assert human.returncode == 0, human.stderr
        assert "agent live" in human.stdout and "RUNNING" in human.stdout, human.stdout
        assert "ETA " in human.stdout and "deadline " in human.stdout, human.stdout
        assert "budget $0.04" in human.stdout, human.stdout
        r = tc.wait(60)
    assert r.returncode == 0, r.describe()
    ids = [w.id for w in r.of_type("warning")]
    assert ids.count("deadline.at_risk") == 1, ids
    assert ids.count("budget.at_risk") == 1, ids
    late = next(w for w in r.of_type("warning") if w.id == "deadline.at_risk")
    assert "deadline" in late.text and late.advice, late
    projections = r.of_type("projection")
    phases = r.of_type("phase")
    assert len(projections) >= len(phases), (len(projections), len(phases))
    assert projections[-1].buffer_s < 0  # it did end after the deadline
    # The journal's last projection is the end itself, made after the exit.
    exit_ev = r.of_type("exit")[-1]
    assert projections[-1].finished and projections[-1].ts >= exit_ev.ts, projections[-1]
    assert not any(p.finished for p in projections[:-1])

    after = status(r.run_dir, "--json")
    st = json.loads(after.stdout)
    assert st["live"] is False and st["state"] == "FINISHED", st
    assert st["projection"]["deadline"] == pytest.approx(deadline.timestamp())
    human = status(r.run_dir)
    assert "agent not running" in human.stdout and "FINISHED" in human.stdout, human.stdout
    assert "finished " in human.stdout and "in all" in human.stdout, human.stdout


@pytest.mark.timeout(60)
def test_the_first_measured_rate_comes_within_seconds_and_the_end_says_what_was_measured(tmp_path):
    """Not 30 s later: once the work left and the run's own rate are known, the journal
    (and the dashboard's Deadline panel) gets a projection with an ETA at once.  Under
    preset A (declared 2.4 it/s, a figure from another box) any rate before that is said to
    be declared; from the first measured batches on it is the run's own (about 20 it/s),
    and `trainctl status` after the run says what it measured (issue 28: "finished ... at
    2.10 it/s" while the run measured 14.3)."""
    command = [
        PYTHON,
        str(TRAIN_LOOP),
        "--epochs",
        "2",
        "--batches",
        "100",
        "--batch-time",
        "0.05",
        "--workers",
        "0",
    ]
    with start_trainctl(["run", "--json", "--preset", "A", "--", *command]) as tc:
        r = tc.wait(50)
    assert r.returncode == 0, r.describe()
    first = r.of_type("progress")[0]
    ended = r.of_type("exit")[0].ts
    projections = r.of_type("projection")
    for p in projections:  # a declared figure is never passed off as measured
        assert (p.rate == 2.4) == (p.rate_source == "declared"), p
    measured = [p for p in projections if p.eta is not None and p.rate_source == "measured" and p.ts < ended]
    assert measured, [(p.ts - first.ts, p.rate, p.rate_source) for p in projections]
    assert measured[0].ts - first.ts < 3.0, measured[0].ts - first.ts
    assert measured[0].rate == pytest.approx(20, rel=0.5) and measured[0].preset == "A"
    end = projections[-1]
    assert end.finished and end.rate_source == "measured" and end.rate == pytest.approx(20, rel=0.5), end
    human = status(r.run_dir)
    assert human.returncode == 0, human.stderr
    [line] = [s for s in human.stdout.splitlines() if "finished " in s]
    assert line.endswith(f"at {end.rate:.2f} it/s"), human.stdout  # measured: no words needed
    assert "declared" not in human.stdout and "2.40" not in human.stdout, human.stdout
