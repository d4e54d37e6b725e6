"""A Slurm job of several nodes, its pure parts: the [slurm]/[torchrun] keys it allows, the
batch script's srun line, each node's place (rank, rendezvous endpoint on the first node's
address), the torchrun command of one node, the nodes' run directories and last states."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from trainctl.config import ConfigError, load_job
from trainctl.core import events as E
from trainctl.core.recovery import RunState
from trainctl.core.torchrun import across_nodes, layout
from trainctl.hosts.slurm import nodes as slurm_nodes
from trainctl.hosts.slurm import queue as slurm
from trainctl.store.journal import Journal
from trainctl.store.spec import RunSpec

SHOW_NODE = (
    "NodeName=node1 Arch=x86_64 CoresPerSocket=2 CPUAlloc=0 Gres=(null) NodeAddr=10.1.2.3 "
    "NodeHostName=gpu-a01 Port=6821 Version=22.05.8\n"
)


def torchrun_job(tmp_path: Path, slurm_text: str, torchrun: str = "") -> Path:
    p = tmp_path / "trainctl.toml"
    p.write_text(
        'kind = "torchrun"\n[torchrun]\nscript = "train.py"\nnproc_per_node = 2\n'
        f"{torchrun}\n[slurm]\n{slurm_text}\n"
    )
    return p


def test_a_torchrun_job_may_ask_for_several_nodes(tmp_path):
    assert load_job(torchrun_job(tmp_path, "nodes = 2")).slurm == {"nodes": 2}


@pytest.mark.parametrize(
    "torchrun, key",
    [
        ('rdzv_endpoint = "10.0.0.1:29400"', "rdzv_endpoint"),
        ("nnodes = 2", "nnodes"),
        ("node_rank = 1\nnnodes = 2", "node_rank"),
        ('rdzv_id = "x"', "rdzv_id"),
    ],
)
def test_the_nodes_and_rendezvous_are_trainctls_on_slurm(tmp_path, torchrun, key):
    with pytest.raises(ConfigError) as e:
        load_job(torchrun_job(tmp_path, "nodes = 2", torchrun))
    assert f"[torchrun] {key}: set by trainctl on Slurm" in str(e.value)


def test_one_slurm_node_refuses_a_torchrun_of_several(tmp_path):
    with pytest.raises(ConfigError, match=r"\[torchrun\] nnodes: set by trainctl on Slurm"):
        load_job(torchrun_job(tmp_path, "nodes = 1", 'nnodes = 2\nrdzv_endpoint = "h:1"'))


def test_one_node_runs_the_agent_as_the_batch_shell(tmp_path):
    text = slurm.write_batch_script(tmp_path, "", 1).read_text()
    assert text.splitlines()[-1] == f"exec /bin/bash {tmp_path}/slurm-agent.sh" and "srun" not in text
    keeper = (tmp_path / "slurm-agent.sh").read_text()
    assert f"-m trainctl agent {tmp_path} --slurm $adopt &" in keeper


def test_several_nodes_run_one_agent_per_node_through_srun(tmp_path):
    path = slurm.write_batch_script(tmp_path, "module load cuda", 2)
    lines = path.read_text().splitlines()
    assert lines[2] == "module load cuda"
    assert lines[3].startswith(f"export {slurm.PORT_ENV}=$(")
    last = lines[-1]
    assert last.startswith("exec srun ") and last.endswith(f" /bin/bash {tmp_path}/slurm-agent.sh")
    for opt in (
        "--nodes=$SLURM_JOB_NUM_NODES",
        "--ntasks=$SLURM_JOB_NUM_NODES",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=0",
        "${SLURM_CPUS_PER_TASK:+--cpus-per-task=$SLURM_CPUS_PER_TASK}",
    ):
        assert opt in last.split()
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    # the port line, run as the job runs it: a free port on this node
    port = subprocess.run(
        ["bash", "-c", lines[3] + f"; echo ${slurm.PORT_ENV}"], capture_output=True, text=True, timeout=30
    ).stdout.strip()
    assert port.isdigit() and 0 < int(port) < 65536


def test_several_nodes_ask_for_no_warning_signal(tmp_path):
    """srun, their batch shell, would pass it on to the trainers: the agents time the save."""
    one = slurm.sbatch_argv({"nodes": 1}, tmp_path, "trainctl-x", 30)
    two = slurm.sbatch_argv({"nodes": 2}, tmp_path, "trainctl-x", 30)
    assert "--signal=B:USR1@30" in one and "--nodes=2" in two
    assert not [a for a in two if a.startswith("--signal")]


def test_the_first_node_and_a_nodes_address():
    assert slurm_nodes.first_host("\nnode1\nnode2\n") == "node1"
    with pytest.raises(ValueError):
        slurm_nodes.first_host("")
    assert slurm_nodes.node_addr(SHOW_NODE, "node1") == "10.1.2.3"
    assert slurm_nodes.node_addr("NodeName=n NodeAddr=(null) X=1", "n") == "n"
    assert slurm_nodes.node_addr("NodeName=n", "n") == "n"


def env(rank: str, **more) -> dict[str, str]:
    return {
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NODEID": rank,
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURMD_NODENAME": f"node{int(rank) + 1}",
        slurm.PORT_ENV: "29411",
        **more,
    }


def fake_scontrol(*args):
    if args[:2] == ("show", "hostnames"):
        return "node1\nnode2\n"
    name = args[-1]
    return f"NodeName={name} NodeAddr=10.0.0.{name[-1]} State=ALLOCATED\n"


def test_each_node_meets_at_the_first_nodes_address(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm_nodes, "_scontrol", fake_scontrol)
    lead = slurm_nodes.place(tmp_path, env("0"))
    other = slurm_nodes.place(tmp_path, env("1"))
    assert lead.lead and not other.lead and lead.nnodes == other.nnodes == 2
    assert lead.endpoint == other.endpoint == "10.0.0.1:29411"  # NodeAddr, not the name
    assert (lead.local_addr, other.local_addr) == ("10.0.0.1", "10.0.0.2")
    assert lead.rdzv_id == other.rdzv_id == "slurm-77"
    assert lead.run_dir == tmp_path and other.run_dir == tmp_path / "node1"


def test_one_node_has_no_place_and_a_missing_port_is_said(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm_nodes, "_scontrol", fake_scontrol)
    assert slurm_nodes.place(tmp_path, {"SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_ID": "3"}) is None
    assert slurm_nodes.place(tmp_path, {}) is None
    bad = env("1")
    del bad[slurm.PORT_ENV]
    with pytest.raises(slurm.SlurmError, match=slurm.PORT_ENV):
        slurm_nodes.place(tmp_path, bad)


def test_a_torchrun_command_becomes_one_node_of_the_job():
    argv = [
        "python",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "--nnodes=1",
        "--rdzv-endpoint",
        "old:1",
        "--max-restarts",
        "3",
        "train.py",
        "--nnodes",
        "9",
    ]
    out = across_nodes(argv, 2, 1, "10.0.0.1:29411", "slurm-77", "10.0.0.2")
    assert out == [
        "python",
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "10.0.0.1:29411",
        "--rdzv-id",
        "slurm-77",
        "--local-addr",
        "10.0.0.2",
        "--nproc_per_node",
        "2",
        "--max-restarts",
        "3",
        "train.py",
        "--nnodes",
        "9",
    ]  # the script's own kept
    assert across_nodes(["python", "train.py"], 2, 1, "h:1", "x") == ["python", "train.py"]


def test_a_node_of_the_job_lays_out_its_ranks():
    argv = across_nodes(["torchrun", "--nproc-per-node", "2", "t.py"], 2, 1, "h:1", "i")
    lay = layout(["torchrun", "--log-dir", "/d", *argv[1:]])
    assert (lay.nnodes_max, lay.node_rank, lay.global_rank(1)) == (2, 1, 3)


def test_a_nodes_run_directory_is_made_once_from_the_leads(tmp_path):
    lead = tmp_path / "run"
    (lead / "presets").mkdir(parents=True, mode=0o700)
    lead.chmod(0o700)
    (lead / "presets" / "B.toml").write_text("name = 'B'\n")
    RunSpec(job_name="big", kind="torchrun", command=["torchrun", "t.py"]).save(lead / "spec.json")
    path, spec = slurm_nodes.prepare_node_dir(lead, 1)
    assert path == lead / "node1" and spec.job_name == "big-node1"
    assert (path / "presets" / "B.toml").is_file() and (path.stat().st_mode & 0o777) == 0o700
    spec.preset = "B"
    spec.save(path / "spec.json")  # the next job's agent finds it as it was
    assert slurm_nodes.prepare_node_dir(lead, 1)[1].preset == "B"
    assert slurm_nodes.node_dirs(lead) == [(1, path)]


def test_a_nodes_last_state_is_read_from_its_journals_end(tmp_path):
    assert slurm_nodes.last_state(tmp_path) is None
    j = Journal(tmp_path / "events.jsonl")
    j.append(E.State(1.0, "RUNNING", "progress"))
    for i in range(3000):  # far more than the tail read
        j.append(E.Progress(2.0 + i, 1, 1, i + 1, 5000, {"loss": 1.0}, None))
    j.append(E.State(9000.0, "FAILED", "gave up"))
    j.append(E.Info(9001.0, "bye", "x"))
    j.close()
    assert slurm_nodes.last_state(tmp_path) == ("FAILED", 9000.0)
    (tmp_path / "events.jsonl").write_text(
        json.dumps({"type": "state", "state": "PENDING", "ts": 5}) + "\n{torn"
    )
    assert slurm_nodes.last_state(tmp_path) == ("PENDING", 5.0)


# ---------------------------------------------------------------- the nodes follow each other
def node_part(tmp_path: Path, rank: int, monkeypatch, now: list[float]):
    """A SlurmPart of node ``rank`` of a 2-node job (its own run directory, a real journal),
    on a clock the test moves."""
    import types

    from trainctl.agent.context import RunConfig, RunContext
    from trainctl.core.signatures import Catalog
    from trainctl.hosts.slurm import agent_part as slurm_job
    from trainctl.store.paths import RunFiles

    monkeypatch.setattr(slurm_job, "NODE_WATCH_S", 0.01)
    monkeypatch.setattr(slurm_job, "NODE_GRACE_S", 30.0)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    lead = tmp_path / "run"
    place = slurm_nodes.NodePlace(rank, 2, "77", "10.0.0.1:1", "10.0.0.1", lead)
    place.run_dir.mkdir(parents=True, exist_ok=True)
    spec = RunSpec(
        job_name="big" if rank == 0 else "big-node1",
        kind="torchrun",
        command=["torchrun", "t.py"],
        slurm={"nodes": 2},
    )
    files = RunFiles(place.run_dir)
    ctx = RunContext(RunConfig(files, spec, lambda: now[0]), Journal(files.events), Catalog([]))
    part = slurm_job.SlurmPart(place)
    part.attach(ctx, types.SimpleNamespace())
    return part, ctx


def write_state(run_dir: Path, state: str, ts: float) -> None:
    j = Journal(run_dir / "events.jsonl")
    j.append(E.State(ts, state, "test"))
    j.close()


def test_a_node_stops_when_the_lead_ends_after_it_began(tmp_path, monkeypatch):
    now = [100.0]
    part, ctx = node_part(tmp_path, 1, monkeypatch, now)
    write_state(tmp_path / "run", "STOPPED", 50.0)  # an earlier job's end: not this one's

    async def go():
        watch = asyncio.ensure_future(part._watch_nodes())
        await asyncio.sleep(0.1)
        assert not ctx.requests.stop_requested.is_set()
        write_state(tmp_path / "run", "PENDING", 101.0)
        write_state(tmp_path / "run", "STOPPED", 102.0)
        await asyncio.wait_for(watch, 5)

    asyncio.run(go())
    assert ctx.requests.stop_requested.is_set()
    assert ctx.requests.stop_reason == "node 0 ended STOPPED: every node of Slurm job 77 stops"


def test_the_lead_stops_when_a_node_gives_up_and_the_others_outwait_a_finish(tmp_path, monkeypatch):
    now = [100.0]
    lead, lead_ctx = node_part(tmp_path, 0, monkeypatch, now)
    node, node_ctx = node_part(tmp_path, 1, monkeypatch, now)
    (tmp_path / "run" / "node1" / "spec.json").write_text(
        json.dumps({"job_name": "big-node1", "kind": "torchrun"})
    )
    write_state(tmp_path / "run" / "node1", "FAILED", 101.0)
    write_state(tmp_path / "run", "FINISHED", 101.0)

    async def go():
        await asyncio.wait_for(lead._watch_nodes(), 5)
        watch = asyncio.ensure_future(node._watch_nodes())
        await asyncio.sleep(0.1)
        assert not node_ctx.requests.stop_requested.is_set()  # the lead finished: its grace first
        now[0] += 31
        await asyncio.wait_for(watch, 5)

    asyncio.run(go())
    assert lead_ctx.requests.stop_reason.startswith("node 1 ended FAILED")
    assert node_ctx.requests.stop_reason.startswith("the lead node finished the run 30 s ago")


def test_only_the_lead_submits_the_next_job(tmp_path, monkeypatch):
    part, ctx = node_part(tmp_path, 1, monkeypatch, [100.0])
    ctx.sm.to(RunState.RUNNING)
    assert asyncio.run(part.submit_next()) == 0  # no sbatch (none would answer here)
    assert ctx.sm.state.value == "PENDING" and not slurm.read_jobs(tmp_path / "run")
