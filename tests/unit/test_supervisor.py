import pytest

from trainctl.core.recovery import (
    ALLOWED,
    FINAL_STATES,
    Outcome,
    RecoveryPolicy,
    RunState,
    StateMachine,
    exit_code,
)


def test_stall_falls_back_at_once_then_backs_off_on_repeated_failures():
    pol = RecoveryPolicy("A", "B", max_restarts=5, backoff_base=1.0)
    d = pol.decide(Outcome("stall", made_progress=True, preset="A"), 100.0)
    assert (d.action, d.preset, d.delay_s) == ("restart", "B", 0.0)  # an incident's first restart
    assert "falling back from A to B" in d.reason
    d2 = pol.decide(Outcome("crash", made_progress=True, returncode=1, preset="B"), 130.0)
    assert (d2.action, d2.preset, d2.delay_s) == ("restart", "B", 1.0)
    d3 = pol.decide(Outcome("crash", made_progress=True, returncode=1, preset="B"), 160.0)
    assert d3.delay_s == 2.0


def test_a_restart_that_held_ends_the_incident_and_its_back_off():
    pol = RecoveryPolicy("A", None, max_restarts=9, backoff_base=1.0, calm_s=600.0)
    assert [pol.decide(Outcome("stall", True), t).delay_s for t in (0.0, 10.0, 20.0)] == [0.0, 1.0, 2.0]
    assert pol.decide(Outcome("stall", True), 20.0 + 599.9).delay_s == 4.0  # not calm long enough
    assert pol.decide(Outcome("crash", True, 1), 619.9 + 600.0).delay_s == 0.0  # a new incident
    assert pol.decide(Outcome("crash", True, 1), 1230.0).delay_s == 1.0


def test_without_fallback_restarts_with_the_same_preset():
    pol = RecoveryPolicy("A", None)
    assert pol.decide(Outcome("stall", True, preset="A")).preset == "A"


def test_budget_is_spent_and_the_run_fails_with_a_reason():
    pol = RecoveryPolicy("A", "B", max_restarts=3, no_progress_limit=99)
    delays = []
    for _ in range(3):
        d = pol.decide(Outcome("stall", True, preset="B"))
        assert d.action == "restart"
        delays.append(d.delay_s)
    assert delays == sorted(delays) and delays[0] < delays[-1]
    d = pol.decide(Outcome("stall", True, preset="B"))
    assert d.action == "fail" and "budget" in d.reason


def test_no_progress_attempts_count_double_and_stop_the_loop():
    pol = RecoveryPolicy("A", "B", max_restarts=10, no_progress_limit=2)
    assert pol.decide(Outcome("stall", False)).action == "restart"
    d = pol.decide(Outcome("stall", False))
    assert d.action == "fail" and "no new batch" in d.reason
    pol = RecoveryPolicy("A", None, max_restarts=3, no_progress_limit=5)
    assert pol.decide(Outcome("crash", False, 1)).action == "restart"  # used 2
    assert pol.decide(Outcome("crash", False, 1)).action == "fail"  # used 4 > 3


def test_user_actions_and_endings():
    pol = RecoveryPolicy("A", "B", auto_recover=False)
    assert pol.decide(Outcome("finished", True, 0)).action == "finish"
    assert pol.decide(Outcome("user_stop", True)).action == "stop"
    d = pol.decide(Outcome("user_restart", False, preset="A", requested_preset="B"))
    assert (d.action, d.preset, d.delay_s) == ("restart", "B", 0.0)
    assert pol.used == 0  # the user's restarts do not spend the automatic budget
    assert pol.decide(Outcome("stall", True)).action == "fail"  # auto-recovery off


def test_fatal_error_that_a_restart_cannot_fix_is_not_retried():
    pol = RecoveryPolicy("A", "B")
    d = pol.decide(Outcome("crash", True, 1, stop_reason="rocm.hip.no_binary_for_gpu"))
    assert d.action == "fail" and "no_binary_for_gpu" in d.reason


def test_state_machine_refuses_illegal_transitions():
    sm = StateMachine()
    assert sm.to(RunState.RUNNING)
    assert not sm.to(RunState.RUNNING)
    sm.to(RunState.FINISHED)
    with pytest.raises(ValueError, match="FINISHED to RUNNING"):
        sm.to(RunState.RUNNING)


def test_a_trainer_that_never_started_fails_at_once_and_says_so():
    pol = RecoveryPolicy("A", "B", max_restarts=3)
    d = pol.decide(Outcome("crash", False, None, "A", stop_reason="[Errno 2] No such file: 'trian.py'"))
    assert d.action == "fail"
    assert d.reason == "the trainer could not start: [Errno 2] No such file: 'trian.py'"
    d = RecoveryPolicy("A", "B").decide(Outcome("crash", True, 1, "A", stop_reason="oom: killed"))
    assert d.action == "fail" and "exited with code 1 after a fatal error" in d.reason


def test_a_user_stop_ends_in_stopped_a_final_state_of_its_own():
    assert FINAL_STATES == {RunState.FINISHED, RunState.FAILED, RunState.STOPPED}
    assert "STOPPED" in FINAL_STATES and "RUNNING" not in FINAL_STATES  # journal strings too
    for state in RunState:
        if state in FINAL_STATES:
            assert ALLOWED[state] == set(), state  # nothing follows an end
        else:
            assert FINAL_STATES <= ALLOWED[state], state  # any live state may end
    for path in (
        [RunState.RUNNING, RunState.STOPPING, RunState.STOPPED],
        [RunState.RUNNING, RunState.STOPPING, RunState.BACKOFF, RunState.STOPPED],
        [RunState.STALLED, RunState.STOPPED],
    ):
        sm = StateMachine()
        for state in path:
            assert sm.to(state)
    with pytest.raises(ValueError, match="STOPPED to STARTING"):
        sm.to(RunState.STARTING)


def test_exit_codes_follow_the_final_state():
    assert [exit_code(s) for s in ("FINISHED", "FAILED", "STOPPED")] == [0, 1, 130]
    assert exit_code("RUNNING") == 0 and exit_code(None) == 0 and exit_code("BOGUS", 3) == 3


def test_an_unknown_exit_is_finished_only_at_the_last_batch_of_the_last_epoch():
    from trainctl.core.recovery import reached_the_end

    assert reached_the_end(3, 3, 20, 20)
    assert reached_the_end(None, None, None, None, phase="finished")
    assert not reached_the_end(3, 3, 19, 20)
    assert not reached_the_end(2, 3, 20, 20)
    assert not reached_the_end(None, None, 20, 20)  # no epochs known: cannot tell
    assert not reached_the_end(1, 1, 5, None)
