"""Issue 40, item 4, end to end: an 8 s pause that heals by itself and a silent evaluation
ended by its summary line do not raise the train threshold (5 × 8 s would make it 40 s):
the hang after them is caught within the 30 s floor it had before, + 2 s.  A real agent, a
real loop (tests/helpers/scripts/pauses.py)."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import PYTHON, run_trainctl
from tests.helpers.hangs import SCRIPTS

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(120)
def test_a_self_healing_pause_and_an_eval_pause_then_a_hang_caught_within_the_old_threshold():
    res = run_trainctl(
        ["run", "--json", "--max-restarts", "0", "--", PYTHON, str(SCRIPTS / "pauses.py")], 100
    )
    [stall] = res.of_type("stall")  # none in either pause
    assert stall.threshold_s is not None and stall.threshold_s <= 30.0 + 2, stall
    assert "hanging now" in (res.run_dir / "train.log").read_text()
    assert stall.idle_s <= 30.0 + 2 + 1.5, stall  # checked about once a second
    assert max(p.batch or 0 for p in res.of_type("progress")) >= 85  # the hang came after the pauses
