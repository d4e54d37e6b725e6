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
