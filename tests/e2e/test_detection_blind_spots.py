"""Issue 26, end to end: hangs off the well-trodden paths are caught with the defaults (or
the settings named in each test): a torchrun job whose ranks print nothing trainctl reads
(the launcher's own polling is not the ranks' activity), the issue's torchrun job printing
a bar-less tqdm line (a collective hang: rank 0 waits for rank 1), a steady printer of an
unknown format, and hangs in a first validation and at the first batch after it (a plain
loop, an Ultralytics job, a zero-code Ultralytics script).  The still-tree window is set
short (``--startup-idle 5``: at most 45 s by default after the first batch, 90 s before)
to keep the tier fast; bench/bench_detection_matrix.py measures the defaults.

Each hang writes when it began to the run directory (``hang_at``), so the detection time
is measured from the trainer's own clock."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.e2e.conftest import PYTHON, ROOT, run_trainctl, start_trainctl, write_ultralytics_job
from tests.helpers.hangs import SCRIPTS

pytestmark = pytest.mark.e2e
DDP_UNKNOWN = SCRIPTS / "ddp_unknown.py"


def _torchrun(*args: str) -> list[str]:
    return [
        PYTHON,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(DDP_UNKNOWN),
        *args,
    ]


def _late(result, stall) -> float:
    return stall.ts - float((result.run_dir / "hang_at").read_text())


@pytest.mark.timeout(200)
def test_a_silent_torchrun_job_whose_rank_deadlocks_is_caught_by_the_ranks_still_tree():
    """Rank 1's DataLoader worker deadlocks in epoch 2; the ranks print nothing per batch, so
    the job is in start-up to trainctl. The launcher keeps polling (I/O every second): only
    the ranks' stillness counts, and the culprit is named from the stacks."""
    r = run_trainctl(
        [
            "run",
            "--json",
            "--max-restarts",
            "0",
            "--startup-idle",
            "5",
            "--",
            *_torchrun("--format", "silent", "--hang-at", "2:5"),
        ],
        timeout=180,
    )
    assert r.returncode == 1, r.describe()
    stalls = r.of_type("stall")
    assert len(stalls) == 1, r.describe()
    stall = stalls[0]
    assert stall.phase == "startup" and stall.threshold_s == 5.0, stall
    assert "deadlock before the first batch" in stall.detail, stall.detail
    verdict = r.of_type("stall_diagnosis")[0]  # the stall goes out at detection, its verdict after
    assert verdict.culprits == (1,) and "Culprit: rank 1 waits for a DataLoader batch" in verdict.detail
    late = _late(r, stall)
    print(f"silent torchrun deadlock caught {late:.1f}s after it began (window 5 s + diagnosis)")
    assert 5.0 < late < 5.0 + 30.0, late  # the window, ticks and py-spy on a loaded box


@pytest.mark.timeout(200)
def test_the_issues_torchrun_job_printing_a_bar_less_tqdm_line_stalls_naming_rank_1():
    """The issue's job: ``[rank0] Epoch 2/3:  25%| 5/20 [00:00, 17.14it/s, loss=1.3007]``
    (no bar characters, no ``<remaining``) now reads as progress; rank 1's worker deadlock
    in epoch 2 (its peer then waits in the allreduce: a collective hang) is caught by the
    train threshold (``--stall-timeout 8``, as the issue ran it), naming rank 1."""
    r = run_trainctl(
        [
            "run",
            "--json",
            "--max-restarts",
            "0",
            "--stall-timeout",
            "8",
            "--",
            *_torchrun("--hang-at", "2:5"),
        ],
        timeout=180,
    )
    assert r.returncode == 1, r.describe()
    prog = r.of_type("progress")
    assert {p.rank for p in prog} == {0, 1} and max(p.epoch for p in prog) == 2, prog[-3:]
    assert not [e for e in r.of_type("info") if e.key == "no_progress_format"]
    stall = r.of_type("stall")[0]
    assert stall.phase == "train" and stall.threshold_s == 8.0, stall
    verdict = r.of_type("stall_diagnosis")[0]
    assert verdict.culprits == (1,), verdict
    assert "Culprit: rank 1 waits for a DataLoader batch" in verdict.detail
    assert "rank 0 waits in a collective" in verdict.detail
    late = _late(r, stall)
    print(f"torchrun bar-less tqdm deadlock caught {late:.1f}s after it began (threshold 8 s + diagnosis)")
    assert 8.0 < late < 8.0 + 30.0, late


@pytest.mark.timeout(90)
def test_a_steady_unknown_format_printer_that_hangs_is_caught_at_its_silence_floor():
    """A line every 0.2 s for 12 s, then a hang: never a burst, so the old watch never
    engaged (the still-tree caught it at 90 s); now the format is unknown after 20 lines and
    the silence is judged against the intervals (2 × 0.2 s, below the floor: 5 s here; 60 s
    by default)."""
    r = run_trainctl(
        [
            "run",
            "--json",
            "--max-restarts",
            "0",
            "--silence-floor",
            "5",
            "--",
            PYTHON,
            str(SCRIPTS / "startup_cases.py"),
            "steady-hang",
            "60",
            "0.2",
        ],
        timeout=80,
    )
    assert r.returncode == 1, r.describe()
    assert [e.key for e in r.of_type("info")].count("no_progress_format") == 1
    stall = r.of_type("stall")[0]
    # the floor, or a little more where a loaded machine read one interval late (> 2.5 s)
    assert stall.phase == "startup" and 5.0 <= stall.threshold_s < 20.0, stall
    assert "no output" in stall.detail and "unknown progress format" in stall.detail, stall.detail
    late = _late(r, stall)
    print(f"steady unknown-format printer's hang caught {late:.1f}s after it began (floor 5 s)")
    assert stall.threshold_s - 1.0 < late < stall.threshold_s + 15.0, late


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "kind,at",
    [("val", "1:1"), ("worker", "2:1")],
    ids=["inside-the-first-validation", "at-the-first-batch-after-it"],
)
def test_a_plain_loop_hanging_in_its_first_silent_validation_or_right_after_it(kind, at):
    """A plain loop (known format, no phases said): its validation after epoch 1 computes
    silently for 3 s. A hang inside it (the main thread blocked) or at the first batch of
    epoch 2 (its worker blocked) leaves the tree still after the epoch's last batch: caught
    by the still-tree window (5 s here; at most 45 s by default) instead of the 300 s
    first-phase default."""
    r = run_trainctl(
        [
            "run",
            "--json",
            "--max-restarts",
            "0",
            "--startup-idle",
            "5",
            "--",
            PYTHON,
            "-u",
            str(SCRIPTS / "train_loop.py"),
            "--epochs",
            "2",
            "--batches",
            "10",
            "--workers",
            "1",
            "--val-time",
            "3",
            "--hang-kind",
            kind,
            "--hang-at",
            at,
        ],
        timeout=110,
    )
    assert r.returncode == 1, r.describe()
    stall = r.of_type("stall")[0]
    assert stall.phase == "train" and stall.threshold_s == 5.0, stall
    assert "deadlock after the last batch of the epoch" in stall.detail, stall.detail
    assert r.of_type("stall_diagnosis")[0].diagnosis == "deadlock", stall
    late = _late(r, stall)
    print(f"plain loop, {kind} hang at {at}: caught {late:.1f}s after it began (window 5 s)")
    assert 5.0 < late < 5.0 + 20.0, late


@pytest.mark.timeout(150)
def test_an_ultralytics_job_stopped_in_its_first_validation_is_caught_when_still(tmp_path):
    """A real Ultralytics job (preset B with validation on): the trainer is stopped (SIGSTOP)
    as its first validation begins. Nothing learned about validations (300 s by default),
    and the still tree's window is 5 s here: the stop itself is certain, called after 3 s."""
    job = write_ultralytics_job(tmp_path / "job", n_train=16, n_val=64, batch=4, epochs=2)
    preset = tmp_path / "Bval.toml"
    preset.write_text(
        (ROOT / "src" / "trainctl" / "presets" / "B.toml").read_text().replace("val = false", "val = true")
    )
    with start_trainctl(
        ["run", str(job), "--json", "--preset", str(preset), "--max-restarts", "0", "--startup-idle", "5"]
    ) as tc:
        start = tc.wait_event("start", 60)
        tc.wait_event(lambda e: e.type == "phase" and e.phase == "val", 120, "phase val")
        os.kill(start.pid, signal.SIGSTOP)
        stopped_at = time.time()
        res = tc.wait(90)
    stall = res.of_type("stall")
    assert len(stall) == 1, res.describe()
    stall = stall[0]
    assert stall.phase == "val" and stall.threshold_s == 3.0 and stall.certain == "stopped", stall
    assert f"the trainer (pid {start.pid}) stopped" in stall.detail, stall
    assert res.of_type("stall_diagnosis")[0].diagnosis == "stopped", stall
    late = stall.ts - stopped_at
    print(f"Ultralytics stopped in its first validation: caught {late:.1f}s after (certain: 3 s)")
    assert 3.0 < late < 3.0 + 20.0, late


@pytest.mark.timeout(200)
def test_a_zero_code_ultralytics_script_hanging_at_the_first_batch_after_validation(tmp_path):
    """A plain Ultralytics script (zero-code integration, defaults but the still-tree
    window): its main thread blocks as epoch 2 starts, after epoch 1's validation and
    save: the phase lasts until the first batch after it, and a still tree there is a
    deadlock."""
    from trainctl.config.demo import make_dataset

    data = make_dataset(tmp_path / "data", n_train=16, n_val=8, size=64)
    env = dict(os.environ, PLAIN_YOLO_HANG_EPOCH="2")
    res = run_trainctl(
        [
            "run",
            "--json",
            "--max-restarts",
            "0",
            "--startup-idle",
            "5",
            "--",
            PYTHON,
            str(SCRIPTS / "plain_yolo.py"),
            str(data),
            "2",
            str(tmp_path / "runs"),
        ],
        timeout=180,
        env=env,
    )
    assert res.returncode == 1, res.describe()
    stall = res.of_type("stall")[0]
    assert stall.phase in ("val", "save") and stall.threshold_s == 5.0, stall
    assert "no output, no CPU and no I/O" in stall.detail, stall
    assert res.of_type("stall_diagnosis")[0].diagnosis == "deadlock", res.of_type("stall_diagnosis")
    late = _late(res, stall)
    print(f"zero-code Ultralytics hang at epoch 2's start ({stall.phase}): caught {late:.1f}s after")
    assert 5.0 < late < 5.0 + 20.0, late
