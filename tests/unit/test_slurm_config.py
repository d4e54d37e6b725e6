"""The pure Slurm pieces: [slurm] in a job file, Slurm times, the sbatch argv trainctl builds,
the warning's lead time, and sbatch's refusals read as one line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from trainctl.config import ConfigError, load_job
from trainctl.config.slurm import slurm_time_s
from trainctl.hosts.slurm.queue import SlurmUnreachable, _why, sbatch_argv, warn_seconds


def job(tmp_path: Path, slurm: str) -> Path:
    p = tmp_path / "trainctl.toml"
    p.write_text(f'kind = "command"\ncommand = ["true"]\n[slurm]\n{slurm}\n')
    return p


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("90", 5400),
        (90, 5400),
        ("1:30", 90),
        ("2:00:00", 7200),
        ("1-0", 86400),
        ("1-2:30", 95400),
        ("1-00:00:10", 86410),
        ("infinite", None),
    ],
)
def test_slurm_times(value, seconds):
    assert slurm_time_s(value) == seconds


@pytest.mark.parametrize("value", ["", "1h", "-5", "1:2:3:4", "0", 0, True])
def test_bad_slurm_times_are_refused(value):
    with pytest.raises(ValueError):
        slurm_time_s(value)


def test_a_slurm_table_is_read(tmp_path):
    j = load_job(
        job(
            tmp_path,
            'partition = "gpu"\ntime = "24:00:00"\ngpus = 2\ncpus = 8\n'
            'mem = "64G"\nwarn = 300\noptions = ["--qos=high"]\nsetup = "module load cuda"',
        )
    )
    assert j.slurm == {
        "partition": "gpu",
        "time": "24:00:00",
        "gpus": "2",
        "cpus": 8,
        "mem": "64G",
        "warn": 300,
        "options": ["--qos=high"],
        "setup": "module load cuda",
    }


@pytest.mark.parametrize(
    "slurm, said",
    [
        ('time = "soon"', "[slurm] time: a Slurm time"),
        ("nodes = 2", '[slurm] nodes: 2 nodes run one torchrun node each: only for kind = "torchrun"'),
        ('gpus = 2\ngres = "gpu:2"', "give gpus or gres, not both"),
        ('options = ["--signal=USR2@60"]', "set by trainctl itself"),
        ('options = ["qos=high"]', "one sbatch option"),
        ('options = ["--nodes=2"]', "give nodes = N instead"),
        ('options = ["-N2"]', "give nodes = N instead"),
        ('partition = "a b"', "must not contain spaces"),
        ("warn = 100000", "at most 65535"),
        ("color = 1", "[slurm] color"),
    ],
)
def test_a_bad_slurm_table_names_the_key(tmp_path, slurm, said):
    with pytest.raises(ConfigError) as e:
        load_job(job(tmp_path, slurm))
    assert said in str(e.value) and "trainctl.toml" in str(e.value)


def test_slurm_and_host_together_are_refused(tmp_path):
    p = job(tmp_path, 'time = "1:00"\n[host]\ndestination = "box"')
    with pytest.raises(ConfigError, match="give \\[slurm\\] or \\[host\\]"):
        load_job(p)


def test_the_sbatch_argv_carries_the_job_and_trainctls_own_options(tmp_path):
    argv = sbatch_argv(
        {"partition": "gpu", "time": "1:00:00", "gpus": "2", "options": ["--qos=high"]},
        tmp_path,
        "trainctl-x",
        300,
        dependency="41",
    )
    assert argv[0] == "sbatch" and argv[-1] == str(tmp_path / "slurm-job.sh")
    for opt in (
        "--parsable",
        "--job-name=trainctl-x",
        f"--output={tmp_path}/slurm-%j.out",
        "--signal=B:USR1@300",
        "--dependency=afterany:41",
        "--partition=gpu",
        "--time=1:00:00",
        "--gpus=2",
        "--qos=high",
        "--requeue",
    ):
        assert opt in argv


@pytest.mark.parametrize(
    "cfg, limit, warn",
    [
        ({}, 60, 30),
        ({}, 86400, 600),
        ({}, 3600, 360),
        ({}, 600, 60),
        ({"warn": 45}, 60, 45),
        ({}, None, None),
    ],
)
def test_the_warning_comes_a_tenth_of_the_limit_before_it(cfg, limit, warn):
    assert warn_seconds(cfg, limit) == warn


def test_sbatch_refusals_read_as_one_line():
    r = subprocess.CompletedProcess(
        [],
        1,
        "",
        "sbatch: error: invalid partition specified: nope\n"
        "sbatch: error: Batch job submission failed: Invalid partition name specified\n",
    )
    assert (
        str(_why(r, "sbatch refused the job")) == "sbatch refused the job: Invalid partition name specified"
    )
    r = subprocess.CompletedProcess(
        [],
        1,
        "",
        "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)\n",
    )
    err = _why(r, "sbatch refused the job")
    assert isinstance(err, SlurmUnreachable) and "slurmctld is unreachable" in str(err)


def test_the_gaps_between_a_runs_jobs_are_pending_to_the_next_progress():
    from trainctl.core import events as E
    from trainctl.hosts.slurm.agent_part import gap_step

    evs = [
        E.Progress(1.0, 1, 1, 1, 9, {}),
        E.State(10.0, "PENDING", "next job"),
        E.Info(12.0, "x"),
        E.Progress(40.0, 1, 1, 2, 9, {}),
        E.Progress(41.0, 1, 1, 3, 9, {}),
        E.State(50.0, "PENDING", "next job"),
        E.Progress(55.0, 1, 1, 4, 9, {}),
    ]
    gaps, pending = [], None
    for ev in evs:
        gap, pending = gap_step(ev, pending)
        if gap is not None:
            gaps.append(gap)
    assert gaps == [30.0, 5.0] and pending is None
    assert gap_step(E.State(60.0, "PENDING", ""), None) == (None, 60.0)
