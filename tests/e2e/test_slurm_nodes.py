"""A torchrun job of two Slurm nodes (the test Slurm's node1 and node2, both this machine:
one agent per node through srun, one rank each, gloo on CPU; examples/ddp_resume.py): it
finishes as one run with both nodes' ranks seen; a DataLoader deadlock on node 2's rank
restarts every node inside the same job, from the checkpoint rank 0 wrote; stop ends every
node.  Each attempt imports torch in two launchers and two ranks: ~10 s on a quiet box."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import PYTHON, ROOT, of_type, read_journal, run_trainctl, verdicts, wait_until
from tests.e2e.test_slurm import slurm_up  # noqa: F401  (autouse: Slurm up, our jobs cancelled after)
from tests.helpers.slurm import wait_queue_empty
from trainctl.hosts.slurm.queue import read_jobs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

EXAMPLE = ROOT / "examples" / "ddp_resume.py"


def two_node_job(tmp_path: Path, name: str, names: list[str], *args: str) -> Path:
    names.append(name)
    job = tmp_path / "trainctl.toml"
    job.write_text(
        f'kind = "torchrun"\nname = "{name}"\nmax_restarts = 2\n'
        'resume_args = ["--resume", "{checkpoint}"]\n[stall]\ntrain_timeout = 5\n'
        f"[torchrun]\npython = {json.dumps(PYTHON)}\nscript = {json.dumps(str(EXAMPLE))}\n"
        f"nproc_per_node = 1\nargs = {json.dumps(['--checkpoint-dir', str(tmp_path / 'ckpts'), *args])}\n"
        '[slurm]\nnodes = 2\ntime = "5:00"\n'
    )
    return job


def node_journal(node_dir: Path) -> list:
    """A node's journal once it ended (its agent may end a moment after the lead's)."""
    wait_until(
        lambda: any(
            e.type == "state" and e.state in ("FINISHED", "FAILED", "STOPPED") for e in read_journal(node_dir)
        ),
        30,
        what=f"{node_dir} ended",
    )
    return read_journal(node_dir)


def left(*run_dirs: Path) -> list[str]:
    """Processes of these runs still alive (agents, holders, launchers, ranks, workers)."""
    want = {str(d) for d in run_dirs}
    out = []
    for p in psutil.process_iter():
        try:
            cmd = p.cmdline()
            if p.environ().get("TRAINCTL_RUN_DIR") in want or (
                "agent" in cmd and any(d in cmd for d in want)
            ):
                out.append(f"{p.pid} {' '.join(cmd)[:100]}")
        except (psutil.Error, OSError):
            continue
    return out


def test_a_job_of_two_nodes_finishes_as_one_run(tmp_path, slurm_up):  # noqa: F811 - the fixture, imported above
    job = two_node_job(tmp_path, "sl-nodes", slurm_up, "--epochs", "1", "--batches", "12", "--workers", "0")
    res = run_trainctl(["run", str(job), "--json"], timeout=120)
    assert res.returncode == 0, res.describe()
    lead, node1 = res.run_dir, res.run_dir / "node1"
    other = node_journal(node1)
    assert of_type(res.events, "state")[-1].state == of_type(other, "state")[-1].state == "FINISHED"
    # one Slurm job; each node started its own torchrun node of the same rendezvous
    assert read_jobs(lead) == [res.of_type("start")[0].slurm_job] and not read_jobs(node1)
    cmds = [of_type(evs, "start")[0].command for evs in (res.events, other)]
    for rank, cmd in enumerate(cmds):
        at = {k: cmd[cmd.index(k) + 1] for k in ("--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-id")}
        assert at["--nnodes"] == "2" and at["--node-rank"] == str(rank), cmd
        assert at["--rdzv-endpoint"].startswith("127.0.0.1:")  # node1's NodeAddr, not its name
    assert cmds[0][cmds[0].index("--rdzv-endpoint") + 1] == cmds[1][cmds[1].index("--rdzv-endpoint") + 1]
    # one rank each, numbered by the c10d rendezvous (rank 0 need not be node 0's)
    ranks = [{p.rank for p in of_type(evs, "progress")} for evs in (res.events, other)]
    assert len(ranks[0]) == len(ranks[1]) == 1 and ranks[0] | ranks[1] == {0, 1}, ranks
    assert [i.key for i in res.of_type("info")].count("slurm.nodes") == 1
    # the user sees one run: status names both nodes' ranks and node 1's agent, ls one row
    status = json.loads(run_trainctl(["status", str(lead), "--json"], 30).stdout)
    assert sorted(status["ranks"]) == ["0", "1"] and status["ranks"]["1"]["batch"] == 12, status
    assert [(n["node"], n["state"]) for n in status["nodes"]] == [(1, "FINISHED")], status
    rows = json.loads(run_trainctl(["ls", "--here", "--json"], 60).stdout)
    mine = [r for r in rows if r["run_dir"].startswith(str(lead))]
    assert [r["run_dir"] for r in mine] == [str(lead)], mine
    assert not wait_queue_empty("trainctl-sl-nodes", 15)
    wait_until(lambda: not left(lead, node1), 15, what="nothing of the run left")


def test_a_hang_on_node_2_restarts_every_node_inside_the_same_job(tmp_path, slurm_up):  # noqa: F811 - the fixture, imported above
    """Node 2's rank deadlocks in its DataLoader (attempt 1): node 2's agent names it, node 1
    stalls in the collective (or its rank fails when its peer is killed); both restart in the
    same Slurm job from the periodic save, meet at the rendezvous again and finish."""
    job = two_node_job(
        tmp_path,
        "sl-nodes-hang",
        slurm_up,
        "--epochs",
        "1",
        "--batches",
        "12",
        "--save-every",
        "5",
        "--workers",
        "1",
        "--hang-if-env",
        "SLURM_NODEID=1",
        "--hang-at",
        "1:8",
        "--hang-attempt",
        "1",
    )
    res = run_trainctl(["run", str(job), "--json"], timeout=140)
    assert res.returncode == 0, res.describe()
    lead, node1 = res.run_dir, res.run_dir / "node1"
    other = node_journal(node1)
    stall = of_type(other, "stall")
    # the rendezvous numbers the ranks, anew at each restart: node 2's before its stall
    (its_rank,) = {p.rank for p in of_type(other, "progress") if stall and p.seq < stall[0].seq}
    verdict = verdicts(other)
    assert stall and verdict and verdict[0].culprits == (its_rank,), verdict
    assert f"Culprit: rank {its_rank} waits for a DataLoader batch" in verdict[0].detail, verdict
    ckpt = str(tmp_path / "ckpts" / "periodic.pt")
    for evs in (res.events, other):
        starts = of_type(evs, "start")
        assert len(starts) == 2 and {s.slurm_job for s in starts} == set(read_jobs(lead)), starts
        assert of_type(evs, "restart")[0].resume_from == ckpt
        assert of_type(evs, "state")[-1].state == "FINISHED"
        assert max(p.batch for p in of_type(evs, "progress")) == 12
    assert not wait_queue_empty("trainctl-sl-nodes-hang", 15)
    wait_until(lambda: not left(lead, node1), 15, what="nothing of the run left")


def test_stop_ends_every_node(tmp_path, slurm_up):  # noqa: F811 - the fixture, imported above
    job = two_node_job(
        tmp_path,
        "sl-nodes-stop",
        slurm_up,
        "--epochs",
        "1",
        "--batches",
        "2000",
        "--batch-time",
        "0.05",
        "--workers",
        "0",
        "--save-every",
        "0",
    )
    res = run_trainctl(["run", str(job), "--detach"], timeout=30)
    assert res.returncode == 0, res.describe()
    lead, node1 = res.run_dir, res.run_dir / "node1"
    wait_until(
        lambda: all(any(e.type == "progress" for e in read_journal(d)) for d in (lead, node1)),
        90,
        what="progress on both nodes",
    )
    r = run_trainctl(["ctl", str(lead), "stop"], timeout=30)
    assert r.returncode == 0, r.describe()
    for d in (lead, node1):
        wait_until(
            lambda d=d: any(e.type == "state" and e.state == "STOPPED" for e in read_journal(d)),
            30,
            what=f"{d.name} STOPPED",
        )
    said = [e.reason for e in read_journal(node1) if e.type == "state" and e.state == "STOPPED"]
    assert "node 0 ended STOPPED" in said[0], said
    assert not wait_queue_empty("trainctl-sl-nodes-stop", 20)
    wait_until(lambda: not left(lead, node1), 15, what="nothing of the run left")
