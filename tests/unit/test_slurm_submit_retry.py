"""The next job's sbatch, tried again while slurmctld does not answer: the waits (pure) and
the loop with a fake sbatch and a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from trainctl.hosts.slurm import queue as slurm
from trainctl.hosts.slurm.agent_part import submit_retrying
from trainctl.hosts.slurm.queue import SUBMIT_MARGIN_S, submit_retry_wait, submit_timeout


@pytest.mark.parametrize(
    "tries, now, end, wait",
    [
        (1, 0, 1000, 5),
        (2, 0, 1000, 10),
        (3, 0, 1000, 20),
        (5, 0, 1000, 60),
        (9, 0, 1000, 60),
        (1, 0, None, 5),
        (7, 0, None, 60),
        (8, 0, None, None),
        (3, 1000 - SUBMIT_MARGIN_S - 7, 1000, 7),  # never past the job's end minus the margin
        (1, 1000 - SUBMIT_MARGIN_S, 1000, None),  # no time left: no try
    ],
)
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
    return asyncio.run(
        submit_retrying(
            ["sbatch"], lambda: fake.now, end, fake.say, gave_up=gave_up, submit=fake.submit, sleep=fake.sleep
        )
    )


def test_sbatch_is_tried_again_until_slurmctld_answers():
    fake = FakeSlurm(down=3)
    assert run(fake, end=1000.0) == "4242"
    assert fake.said == [(1, 5), (2, 10), (3, 20)] and len(fake.calls) == 4


def test_no_try_is_left_near_the_jobs_end():
    fake = FakeSlurm(down=100)
    with pytest.raises(slurm.SlurmUnreachable, match="did not answer 5 sbatch tries"):
        run(fake, end=60.0)  # tries at 0, 6, 17, 38, then a 6 s wait to the last one at 45
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


def test_the_jobs_queued_after_this_one_are_read_from_squeue():
    out = (
        "501|afterany:500(unfulfilled)\n502|(null)\n503|afterany:5000(unfulfilled)\n"
        "499|afterany:500(unfulfilled),afterok:7\n"
    )
    assert slurm.jobs_after(out, "500") == ["499", "501"]
    assert slurm.jobs_after("", "500") == []


class LateSlurm(FakeSlurm):
    """slurmctld takes the first sbatch but answers too late: the job is queued anyway."""

    def __init__(self, seen_by_squeue: bool) -> None:
        super().__init__(down=1)
        self.queue, self.cancelled, self.seen = [], [], seen_by_squeue

    def submit(self, argv, timeout):
        self.queue.append(str(4242 + len(self.calls)))
        return super().submit(argv, timeout)

    def queued(self):
        return list(self.queue) if self.seen else []

    def cancel(self, job):
        self.cancelled.append(job)


def run_late(fake: LateSlurm):
    return asyncio.run(
        submit_retrying(
            ["sbatch"],
            lambda: fake.now,
            1000.0,
            fake.say,
            submit=fake.submit,
            sleep=fake.sleep,
            queued=fake.queued,
            cancel=fake.cancel,
        )
    )


def test_a_try_that_got_through_late_is_the_next_job_not_a_second_one():
    fake = LateSlurm(seen_by_squeue=True)
    assert run_late(fake) == "4242" and len(fake.calls) == 1 and fake.cancelled == []


def test_a_second_job_queued_by_a_race_is_cancelled():
    fake = LateSlurm(seen_by_squeue=False)  # squeue did not see it before the second try
    got = asyncio.run(
        submit_retrying(
            ["sbatch"],
            lambda: fake.now,
            1000.0,
            fake.say,
            submit=fake.submit,
            sleep=fake.sleep,
            queued=lambda: list(fake.queue) if len(fake.calls) > 1 else [],
            cancel=fake.cancel,
        )
    )
    assert got == "4242" and fake.cancelled == ["4243"] and len(fake.calls) == 2
