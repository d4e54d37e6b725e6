"""A follow between a Slurm run's agents (`run --json`, `attach --headless`): the job that was
to carry the run ended before its agent went on with it.  The follow ends saying so (no run
left called RUNNING), with the job's output, attach, and the sbatch that goes on; Slurm's
answers are a fake (the pure logic of what is said)."""

from __future__ import annotations

import asyncio
import shlex

import pytest

from trainctl.core import events as E
from trainctl.hosts.slurm import queue as slurm
from trainctl.hosts.slurm.jobs import BetweenJobs
from trainctl.store.journal import Journal
from trainctl.store.paths import make_private_dir
from trainctl.store.spec import RunSpec


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "run"
    make_private_dir(run)
    RunSpec(job_name="nf", kind="command", command=["true"], slurm={"time": "5:00", "warn": 30}).save(
        run / "spec.json"
    )
    slurm.add_job(run, "13")
    journal = Journal(run / "events.jsonl")
    journal.append(E.State(1.0, "RUNNING", "progress"))
    journal.close()
    return run


def follow_once(run_dir, monkeypatch, info: slurm.JobInfo | None) -> tuple[bool, list[str]]:
    monkeypatch.setattr(slurm, "job_info", lambda job: info)
    said: list[str] = []
    goes_on = asyncio.run(BetweenJobs(run_dir, said.append)({"state": "RUNNING", "live": False}))
    return goes_on, said


def test_a_job_that_ended_before_its_agent_ends_the_follow_saying_what_to_do(run_dir, monkeypatch):
    goes_on, said = follow_once(run_dir, monkeypatch, slurm.JobInfo("13", "FAILED"))
    assert goes_on is False and len(said) == 1, said
    text = said[0]
    assert text.startswith("Slurm job 13 ended (FAILED) before its agent went on with the run: no agent "), (
        text
    )
    assert "the run is RUNNING" not in text and "last state, RUNNING, is an earlier agent's" in text
    assert f"why: {run_dir / 'slurm-13.out'};" in text
    assert f"attach {shlex.quote(str(run_dir))}`" in text
    by_hand = text.split("; to go on with it: `")[1].rstrip("`")
    argv = shlex.split(by_hand)
    assert (
        argv[0] == "sbatch" and "--job-name=trainctl-nf" in argv and argv[-1] == str(run_dir / "slurm-job.sh")
    )
    assert not any(a.startswith("--dependency") for a in argv) and "--time=5:00" in argv


def test_a_job_gone_from_the_queue_or_cancelled_says_so(run_dir, monkeypatch):
    assert "Slurm job 13 ended (gone from the queue) before" in follow_once(run_dir, monkeypatch, None)[1][0]
    cancelled = follow_once(run_dir, monkeypatch, slurm.JobInfo("13", "CANCELLED by 0"))[1][0]
    assert cancelled.startswith(
        "Slurm job 13 was cancelled outside trainctl (scancel by someone else?) before"
    )


def test_a_job_still_queued_or_running_is_waited_for(run_dir, monkeypatch):
    goes_on, said = follow_once(run_dir, monkeypatch, slurm.JobInfo("13", "PENDING", reason="BeginTime"))
    assert goes_on is True and said == ["Slurm job 13 PENDING (BeginTime)"]
    assert follow_once(run_dir, monkeypatch, slurm.JobInfo("13", "RUNNING"))[0] is True
