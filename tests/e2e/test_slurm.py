"""trainctl on a real Slurm (munged, slurmctld, two slurmds started by .ci/slurm-up.sh;
skipped without it, a failure when TRAINCTL_REQUIRE_SLURM=1 as in CI): a supervised run in
an allocation; a DataLoader hang caught and restarted inside the same job; a training longer
than its 1-minute time limit going on across Slurm jobs from each save; `s` on a running and
on a queued job; sbatch's refusals; an unreachable slurmctld; someone else's scancel; a
requeued job; `trainctl ls` with a local, an ssh and a Slurm run."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import PYTHON, ROOT, of_type, read_journal, run_trainctl, start_trainctl, wait_until
from tests.e2e.test_example_midepoch import attempts
from tests.e2e.test_remote_run import box  # noqa: F401  (the loopback ssh box fixture)
from tests.helpers.slurm import (
    SlurmctldStopped,
    cancel_all,
    job_field,
    lift_requeue_hold,
    queue_of,
    require_slurm,
    scontrol,
    slurm_env,
    wait_node_only,
    wait_queue_empty,
)
from trainctl.hosts.slurm.queue import read_jobs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

EXAMPLE = ROOT / "examples" / "midepoch_resume.py"


@pytest.fixture(autouse=True)
def slurm_up(request):
    require_slurm()
    names: list[str] = []
    yield names
    for name in names:
        cancel_all(f"trainctl-{name}")


def slurm_job(
    tmp_path: Path,
    name: str,
    names: list[str],
    *,
    slurm: str = "",
    stall: str = "",
    example: tuple[str, ...] = (),
) -> Path:
    """A command job running examples/midepoch_resume.py as a Slurm job."""
    names.append(name)
    argv = [PYTHON, "-u", str(EXAMPLE), "--checkpoint-dir", str(tmp_path / "ckpts"), *example]
    tmp_path.mkdir(parents=True, exist_ok=True)
    job = tmp_path / "trainctl.toml"
    job.write_text(
        f'kind = "command"\nname = "{name}"\ncommand = {json.dumps(argv)}\n'
        'resume_args = ["--resume", "{checkpoint}"]\n'
        + (f"[stall]\n{stall}\n" if stall else "")
        + f"[slurm]\n{slurm}\n"
    )
    return job


def test_a_dataloader_hang_in_the_allocation_is_restarted_inside_the_same_job(tmp_path, slurm_up):
    """A supervised Slurm run: a DataLoader worker deadlock inside the allocation is caught,
    rescued and restarted inside the same job, and the run finishes."""
    job = slurm_job(
        tmp_path,
        "sl-hang",
        slurm_up,
        slurm='time = "5:00"',
        stall="train_timeout = 4",
        example=(
            "--epochs",
            "1",
            "--batches",
            "24",
            "--batch-time",
            "0.03",
            "--workers",
            "2",
            "--hang-at",
            "1:12",
            "--hang-kind",
            "worker",
            "--hang-attempt",
            "1",
        ),
    )
    res = run_trainctl(["run", str(job), "--json"], timeout=120)
    assert res.returncode == 0, res.describe()
    starts = res.of_type("start")
    assert len(starts) == 2 and starts[0].slurm_job == starts[1].slurm_job == read_jobs(res.run_dir)[0]
    stall = res.of_type("stall")
    verdict = res.of_type("stall_diagnosis")  # the stall goes out at detection, its verdict after
    assert stall and verdict[0].diagnosis == "deadlock", (stall, verdict)
    rescue = [c for c in res.of_type("checkpoint") if c.kind == "rescue"]
    assert rescue and res.of_type("restart")[0].resume_from == rescue[0].path
    assert of_type(res.events, "state")[-1].state == "FINISHED"
    # a supervised run in an allocation that finishes: where it ran said, its job gone
    assert any(i.key == "slurm.job" and "time limit 5 min" in i.text for i in res.of_type("info"))
    assert (res.run_dir / f"slurm-{starts[0].slurm_job}.out").exists()  # the agent's own output
    assert not wait_queue_empty("trainctl-sl-hang", 15)


# the hang guard above the run's own bound (290 s): three jobs of Slurm's 1-minute limits,
# each waiting for the one before to end, took over 150 s beside two trainings
@pytest.mark.timeout(320)
def test_a_training_longer_than_its_time_limit_goes_on_across_jobs(tmp_path, slurm_up):
    """1-minute limit, ~67 s of batches: each job saves 30 s before its limit (the default
    warning for a 1-minute limit), so two jobs hold at most 60 s of batches and at least
    three are needed; each goes on from the save before it (afterany), one journal, at most
    30 batches redone per job boundary."""
    job = slurm_job(
        tmp_path,
        "sl-limit",
        slurm_up,
        slurm='time = "1"',
        example=(
            "--epochs",
            "1",
            "--batches",
            "240",
            "--batch-time",
            "0.28",
            "--workers",
            "0",
            "--save-every",
            "0",
        ),
    )
    t0 = time.monotonic()
    res = run_trainctl(["run", str(job), "--json"], timeout=290)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.describe()
    jobs = read_jobs(res.run_dir)
    starts = res.of_type("start")
    assert len(jobs) >= 3 and [s.slurm_job for s in starts] == jobs, (jobs, starts)
    assert [e.seq for e in res.events] == list(range(len(res.events)))  # one journal
    states = [s.state for s in res.of_type("state")]
    assert states.count("PENDING") == len(jobs) - 1 and states[-1] == "FINISHED", states
    planned = [c for c in res.of_type("checkpoint") if c.kind == "planned"]
    assert len(planned) >= len(jobs) - 1 and all(c.ok for c in planned)
    runs = attempts((res.run_dir / "train.log").read_text())
    assert len(runs) == len(jobs)
    for (_, furthest), (start, _) in zip(runs, runs[1:]):
        assert start[0] == furthest[0] and 0 <= furthest[1] - start[1] <= 30, runs
    assert runs[-1][1] == (1, 240)
    assert not wait_queue_empty("trainctl-sl-limit", 15)
    goodput = json.loads(run_trainctl(["status", str(res.run_dir), "--json"], timeout=30).stdout)["goodput"]
    b = goodput["buckets"]
    assert abs(goodput["productive_s"] + sum(b.values()) - goodput["wall_s"]) <= 0.01 * goodput["wall_s"]
    pending = [e for e in res.of_type("state") if e.state == "PENDING"]
    assert b["queue"] > 0 and b["restart"] > 0 and goodput["productive_s"] >= 60, goodput
    assert b["queue"] <= sum(s.ts - p.ts for p, s in zip(pending, starts[1:])) + 1, goodput
    print(f"{len(jobs)} Slurm jobs, {took:.0f} s, attempts {runs}, goodput {goodput}")


def a_long_detached_run(tmp_path: Path, name: str, names: list[str]) -> Path:
    """A 5-minute Slurm job of 2000 batches, detached, once its progress shows: its run dir."""
    job = slurm_job(
        tmp_path,
        name,
        names,
        slurm='time = "5:00"',
        example=("--epochs", "1", "--batches", "2000", "--batch-time", "0.05", "--workers", "0"),
    )
    res = run_trainctl(["run", str(job), "--detach"], timeout=30)
    assert res.returncode == 0, res.describe()
    wait_until(lambda: any(e.type == "progress" for e in read_journal(res.run_dir)), 60, what="progress")
    return res.run_dir


def test_s_stops_a_running_job_with_nothing_left_in_the_queue(tmp_path, slurm_up):
    run_dir = a_long_detached_run(tmp_path, "sl-stop", slurm_up)
    r = run_trainctl(["ctl", str(run_dir), "stop"], timeout=30)
    assert r.returncode == 0, r.describe()
    wait_until(
        lambda: any(e.type == "state" and e.state == "STOPPED" for e in read_journal(run_dir)),
        30,
        what="STOPPED",
    )
    assert not wait_queue_empty("trainctl-sl-stop", 20)


def test_s_cancels_a_queued_job(tmp_path, slurm_up):
    """A job that waits (here: --begin an hour from now) shows PENDING with squeue's reason;
    stop scancels it and ends the run STOPPED."""
    job = slurm_job(
        tmp_path,
        "sl-queued",
        slurm_up,
        slurm='time = "5:00"\noptions = ["--begin=now+3600"]',
        example=("--epochs", "1", "--batches", "5"),
    )
    res = run_trainctl(["run", str(job), "--detach"], timeout=30)
    assert res.returncode == 0, res.describe()
    st = run_trainctl(["status", str(res.run_dir), "--json"], timeout=30)
    status = json.loads(st.stdout)
    assert status["state"] == "PENDING" and status["slurm"]["reason"] == "BeginTime", status
    text = run_trainctl(["status", str(res.run_dir)], timeout=30).stdout
    assert "PENDING (BeginTime)" in text, text
    r = run_trainctl(["ctl", str(res.run_dir), "stop"], timeout=60)
    assert r.returncode == 0, r.describe()
    assert not queue_of("trainctl-sl-queued")
    assert of_type(read_journal(res.run_dir), "state")[-1].state == "STOPPED"


def test_a_job_cancelled_by_someone_else_is_reported_as_such(tmp_path, slurm_up):
    job = slurm_job(
        tmp_path,
        "sl-scancel",
        slurm_up,
        slurm='time = "5:00"',
        example=("--epochs", "1", "--batches", "2000", "--batch-time", "0.05", "--workers", "0"),
    )
    with start_trainctl(["run", str(job), "--json"]) as tc:
        tc.wait_event("progress", 60)
        subprocess.run(["scancel", read_jobs(tc.run_dir)[0]], check=True, env=slurm_env(), timeout=15)
        res = tc.wait(60)
    final = of_type(res.events, "state")[-1]
    assert final.state == "STOPPED" and "cancelled outside trainctl" in final.reason, res.describe()
    assert res.returncode == 130
    assert not res.of_type("restart")


@pytest.mark.parametrize(
    "slurm, said",
    [
        ('partition = "nope"', "Invalid partition name specified"),
        ('partition = "short"\ntime = "10:00"', "Requested time limit is invalid"),
        ('gres = "gpu:1"', "Invalid generic resource (gres) specification"),
    ],
)
def test_sbatch_refusals_are_one_line_and_exit_2(tmp_path, slurm_up, slurm, said):
    job = slurm_job(tmp_path, "sl-refused", slurm_up, slurm=slurm, example=("--epochs", "1"))
    run_dir = tmp_path / "run"
    res = run_trainctl(["run", str(job), "--json", "--run-dir", str(run_dir)], timeout=60)
    assert res.returncode == 2, res.describe()
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0] and lines[0].startswith("trainctl: sbatch refused"), lines
    assert not (run_dir / "slurm.json").exists() and not queue_of("trainctl-sl-refused")


def test_an_unreachable_slurmctld_is_a_clear_error(tmp_path, slurm_up, monkeypatch):
    conf = Path(slurm_env()["SLURM_CONF"]).read_text()
    bad = tmp_path / "slurm.conf"
    bad.write_text(re.sub(r"SlurmctldPort=\d+", "SlurmctldPort=1", conf))
    monkeypatch.setenv("SLURM_CONF", str(bad))
    job = slurm_job(tmp_path, "sl-down", [], slurm='time = "5:00"', example=("--epochs", "1"))
    res = run_trainctl(["run", str(job), "--json"], timeout=60)
    assert res.returncode == 2, res.describe()
    assert "slurmctld is unreachable" in res.stderr, res.stderr


def test_ls_shows_a_local_an_ssh_and_a_slurm_run_together(tmp_path, slurm_up, box):  # noqa: F811 - the fixture, imported above
    """`trainctl ls`: a local run (finished), a run on a box over ssh (hosts.toml), and a Slurm
    run waiting in the queue, each with its state, where, progress and last incident."""
    from tests.e2e.test_remote_run import cli, start_remote
    from trainctl.store.paths import config_dir

    script = tmp_path / "steps.py"
    script.write_text(
        "import time\nfor i in range(1, 4):\n    print(f'step {i}/3 loss=0.5', flush=True)\n"
        "    time.sleep(0.1)\n"
    )
    local = run_trainctl(["run", "--json", "--", PYTHON, "-u", str(script)], timeout=60)
    assert local.returncode == 0, local.describe()
    remote_dir = start_remote(box, None, [PYTHON, "-u", str(script)])
    queued = run_trainctl(
        [
            "run",
            str(slurm_job(tmp_path / "q", "sl-ls", slurm_up, slurm='options = ["--begin=now+3600"]')),
            "--detach",
        ],
        timeout=30,
    )
    assert queued.returncode == 0, queued.describe()
    config_dir().mkdir(parents=True, exist_ok=True)
    (config_dir() / "hosts.toml").write_text(f'hosts = ["{box.dest}"]\n')

    def rows():
        r = cli(["ls", "--json"], box.client_env, timeout=60)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    got = wait_until(
        lambda: (
            lambda rs: rs if any(r["where"] == box.dest and r["state"] == "FINISHED" for r in rs) else None
        )(rows()),
        60,
        what="ssh run",
    )
    by = {(r["where"], r["run_dir"]): r for r in got}
    mine = by[("local", str(local.run_dir.resolve()))]
    assert mine["state"] == "FINISHED" and mine["progress"]["batch"] == 3
    theirs = by[(box.dest, str(remote_dir))]
    assert theirs["state"] == "FINISHED" and theirs["job"] == "steps"
    waiting = by[("local", str(queued.run_dir.resolve()))]
    assert waiting["state"] == "PENDING" and waiting["slurm"]["reason"] == "BeginTime"
    text = cli(["ls"], box.client_env, timeout=60).stdout
    assert "PENDING (BeginTime)" in text and f"{box.dest}:{remote_dir}" in text, text
    print(text)
    assert run_trainctl(["ctl", str(queued.run_dir), "stop"], timeout=60).returncode == 0


def test_a_requeued_job_goes_on_with_the_run(tmp_path, slurm_up):
    """A node failure or a preemption requeues the job (here `scontrol requeue`, its
    two-minute hold lifted): the same job starts again and its agent goes on with the run
    from the last good checkpoint; one journal."""
    job = slurm_job(
        tmp_path,
        "sl-requeue",
        slurm_up,
        slurm='time = "5:00"',
        example=(
            "--epochs",
            "1",
            "--batches",
            "60",
            "--batch-time",
            "0.1",
            "--workers",
            "0",
            "--save-every",
            "10",
        ),
    )
    with start_trainctl(["run", str(job), "--json"]) as tc:
        tc.wait_event(lambda e: e.type == "checkpoint" and e.ok and (e.batch or 0) >= 10, 90, "a save")
        job_id = read_jobs(tc.run_dir)[0]
        env = slurm_env()
        subprocess.run(["scontrol", "requeue", job_id], check=True, env=env, timeout=15)
        tc.wait_event(lambda e: e.type == "state" and e.state == "PENDING", 30, "PENDING")
        lift_requeue_hold(job_id)  # no two-minute hold
        res = tc.wait(120)
    assert res.returncode == 0, res.describe()
    starts = res.of_type("start")
    assert len(starts) == 2 and starts[0].slurm_job == starts[1].slurm_job == job_id
    assert any(i.key == "slurm.requeued" for i in res.of_type("info"))
    runs = attempts((res.run_dir / "train.log").read_text())
    assert len(runs) == 2 and runs[1][0][1] >= 10 and runs[-1][1] == (1, 60), runs
    assert [e.seq for e in res.events] == list(range(len(res.events)))


def test_status_ctl_and_attach_reach_the_agent_on_its_node_over_ssh(tmp_path, slurm_up):
    """The agent records its node; a client elsewhere goes over ssh to that node (`trainctl
    bridge` there).  The test's nodes are this machine, so TRAINCTL_NODE_SSH=always takes the
    ssh path, through a real sshd on loopback that an ssh config names node1 and node2;
    an unreachable node is one line (exit 4)."""
    from tests.helpers.sshd import LocalSshd
    from trainctl.hosts.ssh import SshHost

    run_dir = a_long_detached_run(tmp_path, "sl-ssh", slurm_up)
    info = json.loads((run_dir / "agent.json").read_text())
    assert info["node"] in ("node1", "node2") and info["boot_id"], info
    assert info["slurm_job"] == read_jobs(run_dir)[0] and "trainctl" not in info
    xdg = Path(tempfile.mkdtemp(prefix="tcn-", dir="/tmp"))  # ssh's ControlPath: short
    with LocalSshd(tmp_path) as sshd:
        config = sshd.write_client_config(tmp_path / "nodes_ssh", alias="node1 node2")
        env = {"TRAINCTL_NODE_SSH": "always", "TRAINCTL_SSH_CONFIG": str(config), "XDG_RUNTIME_DIR": str(xdg)}
        try:
            st = run_trainctl(["status", str(run_dir), "--json"], timeout=60, env=env)
            assert st.returncode == 0 and json.loads(st.stdout)["live"] is True, st.describe()
            assert sshd.accepted_logins() >= 1 and "trainctl bridge" not in st.stderr
            bad = sshd.write_client_config(tmp_path / "down_ssh", alias="node1 node2", port=1)
            down = run_trainctl(
                ["status", str(run_dir)], timeout=60, env={**env, "TRAINCTL_SSH_CONFIG": str(bad)}
            )
            lines = down.stderr.strip().splitlines()
            assert down.returncode == 4 and len(lines) == 1, down.describe()
            assert lines[0].startswith(f"trainctl: cannot reach the agent on node {info['node']} over ssh")
            with start_trainctl(["attach", str(run_dir), "--json"], env=env) as att:
                wait_until(lambda: '"type":"progress"' in att.stdout, 60, what="progress over ssh")
                # the node unreachable for `ctl stop`: the run is stopped through Slurm
                stop = run_trainctl(
                    ["ctl", str(run_dir), "stop"], timeout=60, env={**env, "TRAINCTL_SSH_CONFIG": str(bad)}
                )
                assert stop.returncode == 0 and "stopping the run through Slurm" in stop.stderr, (
                    stop.describe()
                )
                got = att.wait(60)
            states = [json.loads(ln) for ln in got.stdout.splitlines() if '"type":"state"' in ln]
            assert got.returncode == 130 and states[-1]["state"] == "STOPPED", got.describe()
            assert "cancelled by trainctl" in states[-1]["reason"], states[-1]
            stopped = [e for e in read_journal(run_dir) if e.type == "state" and e.state == "STOPPED"]
            assert len(stopped) == 1, stopped  # the agent's, not a second one from the client
        finally:
            for node in ("node1", "node2"):
                SshHost(node, ssh_config=config, control_dir=xdg / "trainctl-ssh").close()
            shutil.rmtree(xdg, ignore_errors=True)
    assert not wait_queue_empty("trainctl-sl-ssh", 20)


def redone_at_boundaries(run_dir: Path) -> list[int]:
    """Batches trained again at each restart (the furthest before, minus where it resumed)."""
    runs = attempts((run_dir / "train.log").read_text())
    return [furthest[1] - start[1] for (_, furthest), (start, _) in zip(runs, runs[1:])]


def resumed_at(events) -> int:
    """The seq of the run's second start (a big number before it)."""
    starts = [e.seq for e in events if e.type == "start"]
    return starts[1] if len(starts) > 1 else 10**9


def test_a_preemption_saves_in_its_grace_time_and_the_requeued_job_goes_on(tmp_path, slurm_up):
    """A job of the `urgent` partition (PriorityTier 10, PreemptMode REQUEUE) takes the
    run's node.  With a grace time on the run's partition (set live here, put back after)
    Slurm sends a batch job nothing until the grace's end: the agent sees the preemption
    (scontrol's PreemptTime), saves at once, waits for the requeue (SIGTERM), and the
    requeued job goes on from that save; one journal."""
    before = dict(
        kv.split("=", 1) for kv in scontrol("-o", "show", "partition", "debug").split() if "=" in kv
    ).get("GraceTime", "0")
    scontrol("update", "PartitionName=debug", "GraceTime=6")
    try:
        job = slurm_job(
            tmp_path,
            "sl-preempt",
            slurm_up,
            slurm='time = "5:00"',
            example=(
                "--epochs",
                "1",
                "--batches",
                "3000",
                "--batch-time",
                "0.03",
                "--workers",
                "0",
                "--save-every",
                "0",
            ),
        )
        with start_trainctl(["run", str(job), "--json"]) as tc:
            tc.wait_event(lambda e: e.type == "progress" and (e.batch or 0) >= 20, 60, "progress")
            job_id = read_jobs(tc.run_dir)[0]
            node = job_field(job_id, "NodeList")
            wait_node_only(node, job_id)
            cpus = dict(kv.split("=", 1) for kv in scontrol("-o", "show", "node", node).split() if "=" in kv)[
                "CPUTot"
            ]
            urgent = subprocess.run(
                [
                    "sbatch",
                    "--parsable",
                    "-p",
                    "urgent",
                    "-w",
                    node,
                    "-c",
                    cpus,
                    "-J",
                    "trainctl-sl-preempt-urgent",
                    "-o",
                    "/dev/null",
                    "--wrap",
                    "sleep 1",
                ],
                env=slurm_env(),
                capture_output=True,
                text=True,
                timeout=15,
                check=True,
            ).stdout.strip()
            slurm_up.append("sl-preempt-urgent")
            tc.wait_event(lambda e: e.type == "info" and e.key == "slurm.preempted", 30, "preempted")
            lift_requeue_hold(job_id, 40)
            tc.wait_event(
                lambda e: e.type == "progress" and e.seq > resumed_at(tc.events()),
                60,
                "progress after the requeue",
            )
            stop = run_trainctl(["ctl", str(tc.run_dir), "stop"], timeout=60)
            assert stop.returncode == 0, stop.describe()
            res = tc.wait(60)
    finally:
        scontrol("update", "PartitionName=debug", f"GraceTime={before}")
    assert res.returncode == 130, res.describe()
    assert urgent and [s.slurm_job for s in res.of_type("start")] == [job_id, job_id]
    planned = [c for c in res.of_type("checkpoint") if c.kind == "planned"]
    assert len(planned) == 1 and planned[0].ok and res.of_type("restart") == []
    assert any(i.key == "slurm.requeued" for i in res.of_type("info"))
    redone = redone_at_boundaries(res.run_dir)
    assert len(redone) == 1 and 0 <= redone[0] <= 5, redone  # from the save, not the start
    assert [e.seq for e in res.events] == list(range(len(res.events)))
    print(f"preempted on {node}; batches redone: {redone}")


def sinfo_state(node: str) -> str:
    return subprocess.run(
        ["sinfo", "-h", "-N", "-n", node, "-o", "%T"],
        capture_output=True,
        text=True,
        timeout=15,
        env=slurm_env(),
    ).stdout.upper()


WAITS_FOR_LOCK = "is still held by an earlier agent of this run"  # its output says


def job_out(run_dir: Path, job_id: str) -> str:
    """The job's own output (sbatch --output: its agents', each start of it appended)."""
    try:
        return (run_dir / f"slurm-{job_id}.out").read_text(errors="replace")
    except FileNotFoundError:
        return ""


class DeadNode:
    """The node dies under the job: everything of the job frozen at once, without a signal
    it could answer (its slurmstepd, the agent as the batch shell, the trainer and its
    workers); the slurmstepd killed (its slurmd sees the job gone), the others left frozen,
    holding what they held (the run's locks, its journal open), as a node that stopped
    answering does, until :meth:`kill`.  Killed on leaving the block in any case."""

    def __init__(self, job_id: str, run_dir: Path) -> None:
        self.job_id, self.run_dir = job_id, run_dir
        self.procs: dict[int, object] = {}

    def __enter__(self) -> DeadNode:
        import psutil

        for p in psutil.process_iter():
            try:
                if self._stepd(p) or p.environ().get("TRAINCTL_RUN_DIR") == str(self.run_dir):
                    self.procs[p.pid] = p
                    self.procs.update({c.pid: c for c in p.children(recursive=True)})
            except (psutil.Error, OSError):
                continue
        self._signal(signal.SIGSTOP, self.procs.values())
        stepds = [p for p in self.procs.values() if self._stepd(p)]
        self._signal(signal.SIGKILL, stepds)
        psutil.wait_procs(stepds, timeout=10)
        return self

    def _stepd(self, p) -> bool:
        import psutil

        with contextlib.suppress(psutil.Error, OSError):
            return " ".join(p.cmdline()).startswith(f"slurmstepd: [{self.job_id}.")
        return False

    @staticmethod
    def _signal(sig: int, procs) -> None:
        import psutil

        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)

    def kill(self, only: str = "") -> None:
        """Its processes whose command line has ``only`` (all by default) end at last."""
        import psutil

        procs = []
        for p in self.procs.values():
            with contextlib.suppress(psutil.Error, OSError):
                if only in " ".join(p.cmdline()):
                    procs.append(p)
        self._signal(signal.SIGKILL, procs)
        psutil.wait_procs(procs, timeout=10)

    def __exit__(self, *exc) -> None:
        self.kill()


def test_a_node_failure_requeues_and_the_run_goes_on_from_its_last_good_checkpoint(tmp_path, slurm_up):
    """The node dies under the job: every process of it killed at once (slurmstepd, agent,
    trainer: no signal, no save), then the node marked DOWN as slurmctld does when its
    slurmd stops answering (a real slurmd is not stopped: the others share it).  Slurm
    requeues the job (NODE_FAIL, --requeue); the node is resumed, the hold lifted, and the
    job's next start adopts the run from its last good checkpoint; one journal."""
    job = slurm_job(
        tmp_path,
        "sl-nodefail",
        slurm_up,
        slurm='time = "5:00"',
        example=(
            "--epochs",
            "1",
            "--batches",
            "3000",
            "--batch-time",
            "0.03",
            "--workers",
            "0",
            "--save-every",
            "25",
        ),
    )
    with start_trainctl(["run", str(job), "--json"]) as tc:
        tc.wait_event(lambda e: e.type == "checkpoint" and e.ok and (e.batch or 0) >= 50, 60, "saves")
        job_id = read_jobs(tc.run_dir)[0]
        node = job_field(job_id, "NodeList")
        wait_node_only(node, job_id)
        with DeadNode(job_id, tc.run_dir) as dead:
            assert len(dead.procs) >= 3
            scontrol("update", f"NodeName={node}", "State=DOWN", "Reason=trainctl test: node failure")
            try:
                lift_requeue_hold(job_id, 40)
            finally:  # its slurmd answers: Slurm returns it to service itself (ReturnToService=2)
                if "DOWN" in sinfo_state(node):
                    scontrol("update", f"NodeName={node}", "State=RESUME")
            # the requeued job's agent starts while the dead node's processes hold the run:
            # it waits for them (the agent's agent.lock, then the holder's job lock) to end
            for held, ends in (("agent.lock", " agent "), ("job lock", "")):
                wait_until(
                    lambda held=held: f"its {held} {WAITS_FOR_LOCK}" in job_out(tc.run_dir, job_id),
                    60,
                    what=f"the new agent waiting for the {held}",
                )
                dead.kill(ends)
        tc.wait_event(
            lambda e: e.type == "progress" and e.seq > resumed_at(tc.events()),
            60,
            "progress after the requeue",
        )
        stop = run_trainctl(["ctl", str(tc.run_dir), "stop"], timeout=60)
        assert stop.returncode == 0, stop.describe()
        res = tc.wait(60)
    assert res.returncode == 130, res.describe()
    starts = res.of_type("start")
    assert [s.slurm_job for s in starts] == [job_id, job_id], starts
    assert any(i.key == "slurm.continue" for i in res.of_type("info")), [
        (i.key, i.text) for i in res.of_type("info")
    ][-4:]
    saved = [c for c in res.of_type("checkpoint") if c.ok and c.seq < starts[1].seq]
    runs = attempts((res.run_dir / "train.log").read_text())
    assert runs[1][0][1] == saved[-1].batch, (runs, saved[-1])  # from the last good one
    redone = redone_at_boundaries(res.run_dir)
    # -1: the dead node's holder was killed before it copied the last printed batch to
    # train.log (the trainer prints a batch before saving it), not a batch skipped
    assert len(redone) == 1 and -1 <= redone[0] <= 25 + 20, redone
    assert [e.seq for e in res.events] == list(range(len(res.events)))
    print(f"node {node} failed; batches redone: {redone}")


def test_a_job_goes_on_while_slurmctld_does_not_answer(tmp_path, slurm_up):
    """slurmctld stopped (SIGSTOP, ~15 s, then SIGCONT: never killed, the others share it)
    while the run's job runs: the agent needs it for nothing then, the training goes on."""
    run_dir = a_long_detached_run(tmp_path, "sl-ctld", slurm_up)

    def batch() -> int:
        return max((e.batch or 0) for e in read_journal(run_dir) if e.type == "progress")

    with SlurmctldStopped(20):  # at most 20 s, even if this test dies meanwhile
        before = batch()
        probe = subprocess.Popen(
            ["squeue", "-h"], env=slurm_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            time.sleep(15)
            during = batch()
            assert probe.poll() != 0  # slurmctld really did not answer
        finally:
            probe.kill()
            probe.wait()
    assert during - before >= 100, (before, during)  # 0.05 s batches: ~300 in 15 s
    events = read_journal(run_dir)
    assert not [e for e in events if e.type in ("stall", "error", "restart")], events
    assert run_trainctl(["ctl", str(run_dir), "stop"], timeout=60).returncode == 0
    wait_until(lambda: of_type(read_journal(run_dir), "state")[-1].state == "STOPPED", 30, what="STOPPED")
    assert not wait_queue_empty("trainctl-sl-ctld", 20)


def test_an_agent_killed_in_its_job_is_started_again_and_adopts_the_trainer(tmp_path, slurm_up):
    """kill -9 of the agent inside its Slurm job (the OOM killer, say): its keeper
    (slurm-agent.sh, holding the job's step) starts a new agent at once, which adopts the
    trainer that went on meanwhile; no batch redone, one journal, the run finishes."""
    job = slurm_job(
        tmp_path,
        "sl-kill9",
        slurm_up,
        slurm='time = "5:00"',
        example=(
            "--epochs",
            "1",
            "--batches",
            "80",
            "--batch-time",
            "0.08",
            "--workers",
            "0",
            "--save-every",
            "20",
        ),
    )
    with start_trainctl(["run", str(job), "--json"]) as tc:
        tc.wait_event(lambda e: e.type == "progress" and (e.batch or 0) >= 10, 90, "progress")
        first = json.loads((tc.run_dir / "agent.json").read_text())["pid"]
        os.kill(first, signal.SIGKILL)
        res = tc.wait(120)
    assert res.returncode == 0, res.describe()
    assert len(res.of_type("start")) == 1  # the trainer was adopted, never started again
    killed = [i for i in res.of_type("info") if i.key == "slurm.agent_killed"]
    assert killed and f"(pid {first}) was killed (SIGKILL)" in killed[0].text, res.of_type("info")
    assert json.loads((res.run_dir / "agent.json").read_text())["pid"] != first
    runs = attempts((res.run_dir / "train.log").read_text())
    assert len(runs) == 1 and runs[0][1] == (1, 80), runs
    assert [e.seq for e in res.events] == list(range(len(res.events)))
    assert of_type(res.events, "state")[-1].state == "FINISHED"
    assert not wait_queue_empty("trainctl-sl-kill9", 15)
