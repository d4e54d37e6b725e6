"""Issue 26, end to end: hangs off the well-trodden paths are caught with the defaults (or
the settings named in each test): a torchrun job whose ranks print nothing trainctl reads
(the launcher's own polling is not the ranks' activity) ...

Each hang writes when it began to the run directory (``hang_at``), so the detection time
is measured from the trainer's own clock."""
from __future__ import annotations

import pytest

from tests.e2e.conftest import PYTHON, run_trainctl
from tests.helpers.hangs import SCRIPTS

pytestmark = pytest.mark.e2e
DDP_UNKNOWN = SCRIPTS / "ddp_unknown.py"


def _torchrun(*args: str) -> list[str]:
    return [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            str(DDP_UNKNOWN), *args]


def _late(result, stall) -> float:
    return stall.ts - float((result.run_dir / "hang_at").read_text())


@pytest.mark.timeout(200)
def test_a_silent_torchrun_job_whose_rank_deadlocks_is_caught_by_the_ranks_still_tree():
    """Rank 1's DataLoader worker deadlocks in epoch 2; the ranks print nothing per batch, so
    the job is in start-up to trainctl. The launcher keeps polling (I/O every second): only
    the ranks' stillness counts, and the culprit is named from the stacks."""
    r = run_trainctl(["run", "--json", "--max-restarts", "0", "--startup-idle", "10", "--",
                      *_torchrun("--format", "silent", "--hang-at", "2:5")], timeout=180)
    assert r.returncode == 1, r.describe()
    stalls = r.of_type("stall")
    assert len(stalls) == 1, r.describe()
    stall = stalls[0]
    assert stall.phase == "startup" and stall.threshold_s == 10.0, stall
    assert "deadlock before the first batch" in stall.detail, stall.detail
    assert stall.ranks == (1,) and "Culprit: rank 1 waits for a DataLoader batch" in stall.detail
    late = _late(r, stall)
    print(f"silent torchrun deadlock caught {late:.1f}s after it began (window 10 s + diagnosis)")
    assert 10.0 < late < 10.0 + 30.0, late        # the window, ticks and py-spy on a loaded box


@pytest.mark.timeout(200)
def test_the_issues_torchrun_job_printing_a_bar_less_tqdm_line_stalls_naming_rank_1():
    """The issue's job: ``[rank0] Epoch 2/3:  25%| 5/20 [00:00, 17.14it/s, loss=1.3007]``
    (no bar characters, no ``<remaining``) now reads as progress; rank 1's worker deadlock
    in epoch 2 (its peer then waits in the allreduce: a collective hang) is caught by the
    train threshold (``--stall-timeout 8``, as the issue ran it), naming rank 1."""
    r = run_trainctl(["run", "--json", "--max-restarts", "0", "--stall-timeout", "8", "--",
                      *_torchrun("--hang-at", "2:5")], timeout=180)
    assert r.returncode == 1, r.describe()
    prog = r.of_type("progress")
    assert {p.rank for p in prog} == {0, 1} and max(p.epoch for p in prog) == 2, prog[-3:]
    assert not [e for e in r.of_type("info") if e.key == "no_progress_format"]
    stall = r.of_type("stall")[0]
    assert stall.phase == "train" and stall.threshold_s == 8.0, stall
    assert stall.ranks == (1,), stall
    assert "Culprit: rank 1 waits for a DataLoader batch" in stall.detail
    assert "rank 0 waits in a collective" in stall.detail
    late = _late(r, stall)
    print(f"torchrun bar-less tqdm deadlock caught {late:.1f}s after it began (threshold 8 s + diagnosis)")
    assert 8.0 < late < 8.0 + 30.0, late


@pytest.mark.timeout(90)
def test_a_steady_unknown_format_printer_that_hangs_is_caught_at_its_silence_floor():
    """A line every 0.2 s for 12 s, then a hang: never a burst, so the old watch never
    engaged (the still-tree caught it at 90 s); now the format is unknown after 20 lines and
    the silence is judged against the intervals (2 × 0.2 s, below the floor: 5 s here)."""
    r = run_trainctl(["run", "--json", "--max-restarts", "0", "--silence-floor", "5", "--",
                      PYTHON, str(SCRIPTS / "startup_cases.py"), "steady-hang", "60", "0.2"],
                     timeout=80)
    assert r.returncode == 1, r.describe()
    assert [e.key for e in r.of_type("info")].count("no_progress_format") == 1
    stall = r.of_type("stall")[0]
    assert stall.phase == "startup" and stall.threshold_s == 5.0, stall
    assert "no output" in stall.detail and "unknown progress format" in stall.detail, stall.detail
    late = _late(r, stall)
    print(f"steady unknown-format printer's hang caught {late:.1f}s after it began (floor 5 s)")
    assert 5.0 < late < 5.0 + 15.0, late
