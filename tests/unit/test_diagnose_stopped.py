"""A stall's "stopped" verdict names every stopped process in its `kill -CONT` advice."""

from __future__ import annotations


def test_the_kill_cont_advice_names_every_stopped_process():
    import psutil

    from trainctl.system.diagnose import _frozen
    from trainctl.system.probes import ProcSample

    def proc(pid: int, role: str, status: str) -> ProcSample:
        return ProcSample(pid, 1, role, "python", status, 0.0, None, None, None)

    second = (
        proc(10, "main", psutil.STATUS_SLEEPING),
        proc(11, "worker", psutil.STATUS_STOPPED),
        proc(12, "worker", psutil.STATUS_STOPPED),
    )
    states = {10: psutil.STATUS_SLEEPING, 11: psutil.STATUS_STOPPED, 12: psutil.STATUS_STOPPED}
    kind, detail = _frozen(states, second, "tree")
    assert kind == "stopped" and "worker 11, worker 12 stopped" in detail, detail
    assert "`kill -CONT 11 12` resumes them." in detail, detail
