"""Issue 16, end to end: an unknown progress format is still watched (output silence), a
deadlock before the first batch is caught within the startup idle window while a busy
start-up is not, and a trainer that cannot import ends FAILED at once, naming the module.

The trainers are plain Python (tests/helpers/scripts/startup_cases.py); each hang writes
when it began to the run directory (``hang_at``), so the detection time is measured from
the trainer's own clock."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import PYTHON, run_trainctl
from tests.helpers.hangs import SCRIPTS

pytestmark = pytest.mark.e2e
CASES = SCRIPTS / "startup_cases.py"


def _hang_at(result) -> float:
    return float((result.run_dir / "hang_at").read_text())


@pytest.mark.timeout(90)
def test_unknown_format_hang_is_caught_within_twice_its_longest_silence():
    """Healthy silences of ~1 s: the floor applies (5 s here, 60 s by default); the format
    is unknown after 20 lines."""
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
            str(CASES),
            "unknown-hang",
            "21",
        ],
        timeout=80,
    )
    assert r.returncode == 1, r.describe()
    infos = [e for e in r.of_type("info") if e.key == "no_progress_format"]
    assert len(infos) == 1 and infos[0].text == "no progress format recognised; watching output silence"
    stalls = r.of_type("stall")
    assert len(stalls) == 1, r.describe()
    stall = stalls[0]
    assert stall.phase == "startup" and stall.threshold_s == 5.0, stall
    assert "no output" in stall.detail and "unknown progress format" in stall.detail, stall.detail
    late = stall.ts - _hang_at(r)
    print(f"unknown-format hang caught {late:.1f}s after it began (bound 5 s + diagnosis)")
    assert 5.0 < late < 5.0 + 6.0, late  # the bound, one tick and the diagnosis


@pytest.mark.timeout(90)
def test_deadlock_before_the_first_batch_is_caught_within_the_startup_idle_window():
    r = run_trainctl(
        [
            "run",
            "--json",
            "--max-restarts",
            "0",
            "--startup-idle",
            "10",
            "--",
            PYTHON,
            str(CASES),
            "deadlock",
        ],
        timeout=80,
    )
    assert r.returncode == 1, r.describe()
    stall = r.of_type("stall")[0]
    verdict = r.of_type("stall_diagnosis")[0]  # the stall at detection, its verdict after
    assert stall.phase == "startup" and verdict.diagnosis == "deadlock", (stall, verdict)
    assert stall.threshold_s == 10.0 and "deadlock before the first batch" in stall.detail
    assert verdict.stacks, verdict  # the stacks were taken
    late = stall.ts - _hang_at(r)
    print(f"start-up deadlock caught {late:.1f}s after it began (window 10 s + diagnosis)")
    assert 10.0 < late < 10.0 + 6.0, late
    assert len(r.of_type("start")) == 1


@pytest.mark.timeout(110)
def test_a_busy_start_up_three_times_the_window_raises_no_stall():
    """15 s CPU-bound, then 15 s I/O-bound (a cache file written, ~0% CPU), no output: no stall
    with a 10 s window; then its batches come and it finishes."""
    r = run_trainctl(
        ["run", "--json", "--startup-idle", "10", "--", PYTHON, str(CASES), "busy", "15", "15"], timeout=100
    )
    assert r.returncode == 0, r.describe()
    assert not r.of_type("stall"), r.describe()
    assert r.of_type("progress") and r.of_type("state")[-1].state == "FINISHED"


@pytest.mark.timeout(60)
def test_an_import_error_fails_at_once_naming_the_missing_module():
    r = run_trainctl(["run", "--json", "--", PYTHON, str(CASES), "import-error"], timeout=50)
    assert r.returncode == 1, r.describe()
    assert len(r.of_type("start")) == 1 and not r.of_type("restart"), r.describe()
    exit_ev = r.of_type("exit")[0]
    want = "ModuleNotFoundError: No module named 'trainctl_missing_module_for_tests'"
    assert exit_ev.exception == want, exit_ev
    assert any(want in line for line in exit_ev.traceback), exit_ev.traceback
    final = r.of_type("state")[-1]
    assert final.state == "FAILED" and want in final.reason, final
    fatal = [w for w in r.of_type("warning") if w.id == "trainctl.failed"]
    assert fatal and "environment" in fatal[0].advice.lower(), fatal
