"""The next job's sbatch, tried again while slurmctld does not answer: the waits (pure) and
the loop with a fake sbatch and a fake clock."""
from __future__ import annotations

import asyncio

import pytest

from trainctl.engine import slurm
from trainctl.engine.agent.slurm_job import submit_retrying
from trainctl.engine.slurm import SUBMIT_MARGIN_S, submit_retry_wait, submit_timeout


@pytest.mark.parametrize("tries, now, end, wait", [
    (1, 0, 1000, 5), (2, 0, 1000, 10), (3, 0, 1000, 20), (5, 0, 1000, 60), (9, 0, 1000, 60),
    (1, 0, None, 5), (7, 0, None, 60), (8, 0, None, None),
    (3, 1000 - SUBMIT_MARGIN_S - 7, 1000, 7),      # never past the job's end minus the margin
    (1, 1000 - SUBMIT_MARGIN_S, 1000, None),        # no time left: no try
])
def test_the_waits_double_and_stop_before_the_jobs_end(tries, now, end, wait):
    assert submit_retry_wait(tries, now, end) == wait


def test_sbatchs_own_bound_shrinks_near_the_end():
    assert submit_timeout(0, None) == 60 and submit_timeout(0, 1000) == 60
    assert submit_timeout(1000 - SUBMIT_MARGIN_S - 8, 1000) == 8 and submit_timeout(999, 1000) == 5


class FakeSlurm:
    """sbatch that slurmctld does not answer ``down`` times, then takes; time moves on."""

    def __init__(self, down: int, refuse: bool = False) -> None:
        self.down, self.refuse, self.now, self.calls, self.said = down, refuse, 0.0, [], []

    def submit(self, argv, timeout):
        self.calls.append(timeout)
        self.now += 1
        if self.refuse:
            raise slurm.SlurmError("sbatch refused the job: Invalid partition name specified")
        if len(self.calls) <= self.down:
            raise slurm.SlurmUnreachable("sbatch: slurmctld is unreachable (connection refused)")
        return "4242"

    async def sleep(self, s):
        self.now += s

    def say(self, tries, error, wait):
        self.said.append((tries, wait))


def run(fake: FakeSlurm, end, gave_up=lambda: False):
    return asyncio.run(submit_retrying(["sbatch"], lambda: fake.now, end, fake.say,
                                       gave_up=gave_up, submit=fake.submit, sleep=fake.sleep))


def test_sbatch_is_tried_again_until_slurmctld_answers():
    fake = FakeSlurm(down=3)
    assert run(fake, end=1000.0) == "4242"
    assert fake.said == [(1, 5), (2, 10), (3, 20)] and len(fake.calls) == 4


def test_no_try_is_left_near_the_jobs_end():
    fake = FakeSlurm(down=100)
    with pytest.raises(slurm.SlurmUnreachable, match="did not answer 5 sbatch tries"):
        run(fake, end=60.0)   # tries at 0, 6, 17, 38, then a 6 s wait to the last one at 45
    assert fake.said[-1] == (4, 6) and fake.now <= 60.0 - SUBMIT_MARGIN_S + 1


def test_slurm_ending_the_job_stops_the_tries_and_a_refusal_is_not_retried():
    fake = FakeSlurm(down=100)
    with pytest.raises(slurm.SlurmUnreachable):
        run(fake, end=1000.0, gave_up=lambda: len(fake.calls) >= 2)
    assert len(fake.calls) == 2
    refused = FakeSlurm(down=0, refuse=True)
    with pytest.raises(slurm.SlurmError, match="Invalid partition"):
        run(refused, end=1000.0)
    assert len(refused.calls) == 1 and refused.said == []
