"""torchrun jobs of 2 ranks (CPU, gloo, 1 DataLoader worker each; examples/ddp_resume.py):
a real worker deadlock in rank 1 is named, the job is killed whole and resumed from its
checkpoint; a rank SIGKILLed restarts the job; a healthy run raises no stall; nothing of
the job is left after either.

Each attempt starts torchrun and two ranks that import torch (about 5 s alone, 20 s on a
loaded 2-core box), so each test runs two attempts and no more."""

from __future__ import annotations

import json
import os
import re
import signal

import psutil
import pytest

from tests.e2e.conftest import PYTHON, ROOT, run_trainctl, start_trainctl, verdicts, wait_until
from tests.e2e.test_recovery import alive, of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(200)]

EXAMPLE = ROOT / "examples" / "ddp_resume.py"
SKIP_ALLREDUCE = ROOT / "tests" / "helpers" / "scripts" / "skip_allreduce.py"


def _left(tc) -> list[str]:
    """Processes of the job still alive: every one seen during the run, and any whose
    environment names the run directory."""
    return alive([*tc._seen.values(), *tc._run_dir_procs()])


def _ranks(tc) -> dict[int, psutil.Process]:
    """rank -> its process (RANK in its environment, none in its parent's)."""
    out = {}
    for p in tc.tree():
        try:
            rank = p.environ().get("RANK")
            if rank is not None and p.parent().environ().get("RANK") is None:
                out[int(rank)] = p
        except (psutil.Error, OSError):
            continue
    return out


def test_a_worker_deadlock_in_rank_1_is_named_and_the_whole_job_resumes_from_its_checkpoint(tmp_path):
    ckpts = tmp_path / "ckpts"
    job = tmp_path / "trainctl.toml"
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "B.toml").write_text(
        (ROOT / "src" / "trainctl" / "presets" / "B.toml").read_text()
    )
    job.write_text(
        'kind = "torchrun"\nmax_restarts = 2\nfallback = "B"\n'
        'resume_args = ["--resume", "{checkpoint}"]\n'
        "[stall]\ntrain_timeout = 5\n"
        f"[torchrun]\npython = {json.dumps(PYTHON)}\nscript = {json.dumps(str(EXAMPLE))}\n"
        f'nproc_per_node = 2\nargs = ["--epochs", "1", "--batches", "12", "--save-every", "5", '
        f'"--checkpoint-dir", {json.dumps(str(ckpts))}, "--hang-rank", "1", "--hang-at", "1:8", '
        '"--hang-attempt", "1"]\n'
    )
    with start_trainctl(["run", str(job), "--headless"]) as tc:
        res = tc.wait(180)
        left = _left(tc)
    assert res.returncode == 0, res.describe()
    stall = of(res.events, "stall")
    verdict = verdicts(res.events)  # the stall goes out at detection, its verdict after
    assert len(stall) == 1 and len(verdict) == 1 and verdict[0].culprits == (1,), (stall, verdict)
    assert "Culprit: rank 1 waits for a DataLoader batch" in verdict[0].detail
    assert "rank 0 waits in a collective" in verdict[0].detail
    # the ranks' Flight Recorder: rank 1 never entered DDP's all_reduce that rank 0 waits in
    (collective,) = verdict[0].collectives
    assert (collective["name"], collective["missing"], collective["entered"]) == ("gloo:all_reduce", [1], [0])
    restart = of(res.events, "restart")
    assert restart and restart[0].resume_from == str(ckpts / "periodic.pt"), restart
    assert restart[0].preset == "B"
    # the fallback preset reached every rank: B's workers = 0 (TRAINCTL_WORKERS)
    resumed = sorted(
        p.read_text().splitlines()[0] for p in (res.run_dir / "ranks-2").glob("*/attempt_0/*/stdout.log")
    )
    assert resumed == ["resume epoch=1 batch=5 workers=0"] * 2, resumed
    starts = of(res.events, "start")
    assert "--max-restarts" in starts[0].command and "0" in starts[0].command
    # both ranks' progress, with their ranks, in both attempts; the second went on from batch 5
    prog = of(res.events, "progress")
    assert {p.rank for p in prog} == {0, 1}
    second = [p for p in prog if p.seq > restart[0].seq]
    assert second and min(p.batch for p in second) == 6, [(p.rank, p.batch) for p in second]
    assert max(p.batch for p in second) == 12
    assert (res.run_dir / "ranks-1").is_dir() and (res.run_dir / "ranks-2").is_dir()
    assert left == []
    # --headless and status name the ranks
    # the stall names the stalled ranks, its verdict the culprit
    assert re.search(r"DIAG   \w+ \(culprit rank 1\) in train", res.stdout), res.stdout[-3000:]
    assert "PROG   rank 1 epoch 1/1 batch" in res.stdout
    status = run_trainctl(["status", str(res.run_dir)], 30)
    assert "ranks   0: epoch 1 batch 12/12 · 1: epoch 1 batch 12/12" in status.stdout, status.stdout


def test_a_healthy_run_raises_no_stall_and_a_rank_killed_restarts_the_job(tmp_path):
    ckpts = tmp_path / "ckpts"
    cmd = [
        "run",
        "--headless",
        "--resume-arg=--resume",
        "--resume-arg={checkpoint}",
        "--",
        PYTHON,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "3",
        str(EXAMPLE),
        "--epochs",
        "1",
        "--batches",
        "30",
        "--batch-time",
        "0.15",
        "--save-every",
        "5",
        "--checkpoint-dir",
        str(ckpts),
    ]
    with start_trainctl(cmd) as tc:
        tc.wait_event(
            lambda e: e.type == "progress" and e.rank == 1 and (e.batch or 0) >= 8, 150, "rank 1 at batch 8"
        )
        ranks = _ranks(tc)
        assert sorted(ranks) == [0, 1], ranks
        victim = ranks[1]
        os.kill(victim.pid, signal.SIGKILL)
        res = tc.wait(150)
        left = _left(tc)
    assert res.returncode == 0, res.describe()
    assert of(res.events, "stall") == []  # neither attempt stalled, nor the kill
    exits = of(res.events, "exit")
    assert exits[0].returncode != 0 and exits[-1].returncode == 0, exits
    restart = of(res.events, "restart")
    assert len(restart) == 1 and restart[0].resume_from == str(ckpts / "periodic.pt"), restart
    spec = of(res.events, "start")[0].command
    assert spec.count("--max-restarts") == 1 and spec[spec.index("--max-restarts") + 1] == "0"
    wait_until(lambda: not victim.is_running() or victim.status() == psutil.STATUS_ZOMBIE, 5)
    assert left == []


def test_two_nodes_on_loopback_a_hang_on_node_2_restarts_both(tmp_path):
    """Two "nodes" on this machine (one rank each, c10d rendezvous on 127.0.0.1), each
    started by trainctl from the same job with its own --node-rank: node 2's worker
    deadlocks; both nodes restart (node 2 on its stall, node 1 on its own stall or its rank's
    failure when its peer goes) from the checkpoint rank 0 wrote, and both finish."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ckpts = tmp_path / "ckpts"
    job = tmp_path / "trainctl.toml"
    job.write_text(
        'kind = "torchrun"\nname = "two-nodes"\nmax_restarts = 3\n'
        'resume_args = ["--resume", "{checkpoint}"]\n[stall]\ntrain_timeout = 5\n'
        f"[torchrun]\npython = {json.dumps(PYTHON)}\nscript = {json.dumps(str(EXAMPLE))}\n"
        f'nproc_per_node = 1\nnnodes = 2\nrdzv_endpoint = "127.0.0.1:{port}"\nrdzv_id = "e2e"\n'
        f'args = ["--epochs", "1", "--batches", "12", "--save-every", "5", "--checkpoint-dir", '
        f'{json.dumps(str(ckpts))}, "--hang-if-env", "HANG_THIS_NODE", "--hang-at", "1:8", '
        '"--hang-attempt", "1"]\n'
    )
    node1 = start_trainctl(["run", str(job), "--headless"])
    node2 = start_trainctl(
        ["run", str(job), "--headless", "--node-rank", "1"], env=dict(os.environ, HANG_THIS_NODE="1")
    )
    with node1, node2:
        # the second node of the same job is not refused: one run per (job, node rank)
        res1, res2 = node1.wait(180), node2.wait(180)
        left = _left(node1) + _left(node2)
    for res in (res1, res2):
        assert res.returncode == 0, res.describe()
        restart = of(res.events, "restart")
        assert restart and restart[0].resume_from == str(ckpts / "periodic.pt"), res.describe()
        assert "--nnodes" in of(res.events, "start")[0].command
    assert res1.run_dir.name != res2.run_dir.name
    verdict2 = verdicts(res2.events)[0]  # the stall goes out at detection, its verdict after
    assert "waits for a DataLoader batch" in verdict2.detail, verdict2
    assert left == []


@pytest.mark.timeout(60)
def test_a_rank_that_skips_an_all_reduce_is_named_by_the_flight_recorder(tmp_path):
    """A real deadlock: rank 1 skips the all_reduce of batch 6 and waits in its own code,
    rank 0 waits in the all_reduce for ever.  The verdict names the collective (from the
    ranks' Flight Recorder, asked through their FIFOs) and the rank that never entered it."""
    job = tmp_path / "trainctl.toml"
    job.write_text(
        'kind = "torchrun"\nmax_restarts = 0\n[stall]\ntrain_timeout = 5\n'
        f"[torchrun]\npython = {json.dumps(PYTHON)}\nscript = {json.dumps(str(SKIP_ALLREDUCE))}\n"
        'nproc_per_node = 2\nargs = ["1", "6"]\n'
    )
    with start_trainctl(["run", str(job), "--headless"]) as tc:
        res = tc.wait(50)
        left = _left(tc)
    (verdict,) = verdicts(res.events)
    assert verdict.collectives == (
        {
            "group": "default_pg",
            "seq": 6,
            "name": "gloo:all_reduce",
            "state": "scheduled",
            "entered": [0],
            "missing": [1],
        },
    ), verdict
    assert (
        "Flight Recorder: gloo:all_reduce #6 of default_pg did not complete: rank 1 never entered it; "
        "rank 0 waits in it (scheduled)." in verdict.detail
    ), verdict.detail
    assert verdict.culprits == (1,)  # its stack (rank 1 in its own code), else the recorder
    assert sorted(p.name for p in (res.run_dir / "flight").glob("rank*.json")) == ["rank0.json", "rank1.json"]
    assert left == []
