"""examples/midepoch_resume.py under a real `trainctl run`: a DataLoader worker deadlock
mid-epoch gets a rescue save and the restart resumes at that batch; a planned restart
(`trainctl ctl RUN restart`) saves first and redoes no batch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.conftest import PYTHON, ROOT, run_trainctl, start_trainctl
from tests.e2e.test_recovery import ctl, of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

EXAMPLE = ROOT / "examples" / "midepoch_resume.py"


def attempts(log: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Per attempt: (where it resumed, the furthest batch it reached), from train.log."""
    out: list = []
    for line in log.splitlines():
        if m := re.match(r"resume epoch=(\d+) batch=(\d+)", line):
            pos = (int(m[1]), int(m[2]))
            out.append([pos, pos])
        elif (m := re.match(r"epoch=(\d+)/\d+ batch=(\d+)/", line)) and out:
            out[-1][1] = max(out[-1][1], (int(m[1]), int(m[2])))
    return [tuple(a) for a in out]


def example(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "--resume-arg=--resume",
        "--resume-arg={checkpoint}",
        "--",
        PYTHON,
        "-u",
        str(EXAMPLE),
        "--epochs",
        "2",
        "--batches",
        "30",
        "--batch-time",
        "0.03",
        "--save-every",
        "10",
        "--checkpoint-dir",
        str(tmp_path / "ckpts"),
        *extra,
    ]


def test_a_worker_deadlock_gets_a_rescue_save_and_the_restart_resumes_there(tmp_path):
    res = run_trainctl(
        [
            "run",
            "--json",
            "--stall-timeout",
            "4",
            "--max-restarts",
            "2",
            *example(tmp_path, "--hang-at", "1:25", "--hang-kind", "worker", "--hang-attempt", "1"),
        ],
        timeout=80,
    )
    assert res.returncode == 0, res.describe()
    events = res.events
    rescue = [c for c in of(events, "checkpoint") if c.kind == "rescue"]
    assert rescue and rescue[0].ok and rescue[0].epoch == 1 and rescue[0].batch >= 20, of(
        events, "checkpoint"
    )
    assert any(e.key == "save_request_done" for e in of(events, "info"))
    assert of(events, "restart")[0].resume_from == rescue[0].path
    log = (res.run_dir / "train.log").read_text()
    (start1, furthest1), (start2, _end2) = attempts(log)[:2]
    assert start1 == (1, 0) and start2 == (1, rescue[0].batch)
    assert furthest1[1] - start2[1] <= 3, (furthest1, start2)  # batches redone
    assert "done" in log.splitlines()


def test_a_planned_restart_saves_first_and_redoes_no_batch(tmp_path):
    with start_trainctl(["run", "--json", "--stall-timeout", "20", *example(tmp_path)]) as tc:
        tc.wait_event(lambda e: e.type == "progress" and (e.batch or 0) >= 5, timeout=40)
        ctl(tc.run_dir, "restart")
        res = tc.wait(70)
    assert res.returncode == 0, res.describe()
    planned = [c for c in of(res.events, "checkpoint") if c.kind == "planned"]
    assert planned and planned[0].ok, of(res.events, "checkpoint")
    (start1, furthest1), (start2, _end2) = attempts((res.run_dir / "train.log").read_text())[:2]
    assert start2 == (planned[0].epoch, planned[0].batch) == furthest1, (furthest1, start2)
