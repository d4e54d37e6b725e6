"""The wait for the killed attempt's GPU memory before the next starts (issue 30): pure,
with faked GPU samples and the time as arguments."""

from trainctl.core.gpu_release import LIMIT_S, POLL_S, RELEASED_BYTES, held_bytes, may_start

MB = 1024**2


def test_only_the_killed_processes_memory_counts():
    sample = [(10, 3000 * MB), (11, 800 * MB), (99, 9000 * MB)]  # 99: another job's
    assert held_bytes(sample, (10, 11)) == 3800 * MB
    assert held_bytes(sample, (12,)) == 0  # gone from the list: released
    assert held_bytes([(10, None)], (10,)) is None  # listed without a figure: held


def test_the_restart_waits_until_under_512_mb_polled_every_2_s_up_to_50_s():
    # the driver frees the memory over 6 s: polled at 0, 2, 4, 6 s
    polls = {0.0: 3000 * MB, 2.0: 2000 * MB, 4.0: 600 * MB, 6.0: 100 * MB}
    waited = [t for t, held in polls.items() if not may_start(held, t)[0]]
    assert waited == [0.0, 2.0, 4.0] and POLL_S == 2.0
    assert may_start(RELEASED_BYTES - 1, 6.0) == (True, "released")
    assert may_start(RELEASED_BYTES, 6.0)[0] is False


def test_memory_that_is_never_released_holds_the_restart_50_s_at_most():
    assert may_start(4000 * MB, LIMIT_S - 0.1)[0] is False
    go, why = may_start(4000 * MB, LIMIT_S)
    assert go and "4000 MB" in why and "starting anyway" in why
    go, why = may_start(None, LIMIT_S)
    assert go and "unknown amount" in why
