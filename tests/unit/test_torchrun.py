"""torchrun jobs, the pure parts: the command line trainctl runs, the job table, the rank
files, and the culprit of a stall from recorded stacks of a real 2-rank DDP deadlock."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainctl.config import job_problems, load_job, torchrun_command
from trainctl.core import events as E
from trainctl.core import torchrun as T
from trainctl.core.runview import RunView
from trainctl.system.diagnose import blame_ranks, rank_wait

DATA = Path(__file__).resolve().parents[1] / "data" / "stacks"


def test_the_launcher_is_found_as_torchrun_or_as_a_python_module():
    assert T.launcher_end(["torchrun", "--nproc-per-node", "2", "t.py"]) == 1
    assert T.launcher_end(["/opt/v/bin/torchrun", "t.py"]) == 1
    assert T.launcher_end(["python", "-u", "-m", "torch.distributed.run", "t.py"]) == 4
    assert (
        T.launcher_end(
            [
                "bash",
                "-c",
                'source x\nexec "$@"',
                T.SETUP_MARK,
                "python",
                "-m",
                "torch.distributed.run",
                "t.py",
            ]
        )
        == 7
    )
    assert T.launcher_end(["python", "train.py", "--launcher", "torchrun"]) is None
    assert T.launcher_end(["python", "train.py"]) is None


def test_trainctl_runs_torchrun_with_its_own_restart_policy_and_per_rank_files():
    argv = [
        "torchrun",
        "--nproc_per_node=2",
        "--max-restarts",
        "3",
        "--tee",
        "3",
        "--log_dir=/tmp/x",
        "--standalone",
        "train.py",
        "--max-restarts",
        "9",
    ]
    out = T.supervised(argv, "/run/ranks-2")
    assert out == [
        "torchrun",
        "--max-restarts",
        "0",
        "--redirects",
        "3",
        "--log-dir",
        "/run/ranks-2",
        "--nproc_per_node=2",
        "--standalone",
        "train.py",
        "--max-restarts",
        "9",
    ]
    lay = T.layout(out)
    assert (lay.log_dir, lay.nproc, lay.nnodes_max, lay.node_rank) == (Path("/run/ranks-2"), 2, 1, 0)
    two = T.layout(
        T.supervised(["torchrun", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "t.py"], "D")
    )
    assert [two.global_rank(r) for r in (0, 1)] == [2, 3]
    assert T.supervised(["python", "t.py"], "D") == ["python", "t.py"]


def test_rank_files_are_read_from_torchruns_layout():
    found = T.rank_files(
        [
            "abc_x1/attempt_0/0/stdout.log",
            "abc_x1/attempt_0/1/stderr.log",
            "abc_x1/attempt_0/error.json",
            "abc_x1/attempt_0/filtered_stdout.log",
        ]
    )
    assert found == {"abc_x1/attempt_0/0/stdout.log": 0, "abc_x1/attempt_0/1/stderr.log": 1}


def test_a_torchrun_job_builds_its_command(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(
        'kind = "torchrun"\nresume_args = ["--resume", "{checkpoint}"]\n'
        '[torchrun]\nscript = "train.py"\nargs = ["--epochs", "2"]\nnproc_per_node = 2\n'
    )
    job = load_job(path)
    assert job.command == (
        "python",
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--nnodes",
        "1",
        "--standalone",
        "train.py",
        "--epochs",
        "2",
    )
    assert job.resume_args == ("--resume", "{checkpoint}")
    multi = dict(job.settings, nnodes=2, rdzv_endpoint="127.0.0.1:29400", rdzv_id="j")
    assert torchrun_command(multi, node_rank=1)[3:15] == (
        "--nproc-per-node",
        "2",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "127.0.0.1:29400",
        "--rdzv-id",
        "j",
    )


@pytest.mark.parametrize(
    "text, key, message",
    [
        ("[torchrun]\nnproc_per_node = 2\n", "[torchrun] script", "required"),
        ('[torchrun]\nscript = "t.py"\nnnodes = 2\n', "[torchrun] rdzv_endpoint", "required when nnodes > 1"),
        ('[torchrun]\nscript = "t.py"\nnode_rank = 1\n', "[torchrun] node_rank", "must be below nnodes"),
        ('[torchrun]\nscript = "t.py"\nnproc_per_node = 0\n', "[torchrun] nproc_per_node", ">= 1"),
        ('[torchrun]\nscript = "t.py"\nmax_restarts = 3\n', "[torchrun] max_restarts", "unknown key"),
        ('command = ["x"]\n[torchrun]\nscript = "t.py"\n', "command", "use [torchrun] script"),
        ("", "[torchrun]", "required"),
    ],
)
def test_a_bad_torchrun_job_is_refused_with_its_key(tmp_path, text, key, message):
    problems = job_problems('kind = "torchrun"\n' + text, tmp_path / "job.toml")
    assert any(e.key == key and message in e.message for e in problems), problems


def _dumps(path: Path) -> tuple[dict[int, int], dict[int, str]]:
    """pid -> rank and pid -> its py-spy dump, from a trainctl stall dump file."""
    ranks, dumps = {}, {}
    for part in re.split(r"^(?==== pid )", path.read_text(), flags=re.M)[1:]:
        m = re.match(r"=== pid (\d+) (\w+(?: \d+)?)", part)
        pid = int(m.group(1))
        if m.group(2).startswith("rank "):
            ranks[pid] = int(m.group(2).split()[1])
        dumps[pid] = part
    return ranks, dumps


def test_the_culprit_of_a_real_ddp_deadlock_is_the_rank_waiting_for_its_batch():
    """Recorded: rank 1's DataLoader worker blocked; rank 1 waits in _try_get_data, rank 0
    in DDP's backward (c10d::Reducer::finalize_backward) for rank 1's gradients."""
    ranks, dumps = _dumps(DATA / "ddp_worker_deadlock_rank1.txt")
    assert sorted(ranks.values()) == [0, 1]
    waits = {ranks[p]: rank_wait(dumps[p]) for p in ranks}
    assert waits == {0: "collective", 1: "data"}
    culprits, note = blame_ranks(ranks, dumps)
    assert culprits == (1,)
    assert "rank 1 waits for a DataLoader batch" in note and "rank 0 waits in a collective" in note


def test_every_rank_in_a_collective_names_no_culprit_and_a_rank_in_its_own_code_is_one():
    collective = 'Thread 1 (idle): "MainThread"\n    gloo::transport::tcp::Pair::recv (libgloo.so)\n'
    own = 'Thread 2 (active): "MainThread"\n    slow_augment (train.py:40)\n    main (train.py:90)\n'
    assert blame_ranks({1: 0, 2: 1}, {1: collective, 2: collective})[0] == ()
    assert blame_ranks({1: 0, 2: 1}, {1: collective, 2: own}) == (
        (1,),
        "Culprit: rank 1 is in its own code; rank 0 waits in a collective (victim).",
    )
    assert blame_ranks({1: 0}, {})[0] == ()


def test_the_stall_names_the_stalled_ranks_its_verdict_the_culprits_and_old_journals_still_read():
    ev = E.Stall(1.0, "train", 5.0, E.DIAGNOSING, ranks=(0, 1))
    assert E.decode(E.encode(ev)) == ev
    verdict = E.StallDiagnosis(2.0, "train", "deadlock", culprits=(1,))
    assert E.decode(E.encode(verdict)) == verdict and '"culprits":[1]' in E.encode(verdict)
    old = '{"ts": 1, "type": "stall", "phase": "train", "idle_s": 5, "diagnosis": "deadlock"}'
    assert E.decode(old).ranks == ()
    # a journal written before the field had its name: the culprits were "ranks"
    former = '{"ts": 2, "type": "stall_diagnosis", "phase": "train", "diagnosis": "deadlock", "ranks": [1]}'
    assert E.decode(former).culprits == (1,)
    view = RunView()
    for line in (
        '{"ts": 1, "type": "stall", "phase": "train", "idle_s": 5, "diagnosis": "diagnosing", "ranks": [0, 1]}',
        former,
    ):
        view.apply(E.decode(line))
    assert view.stall is not None and view.stall.ranks == (0, 1) and view.stuck_ranks == (1,)


NCCL_TIMEOUT = (
    "[rank1]:[E1002 18:16:40.662691402 ProcessGroupNCCL.cpp:756] [Rank 1] Work "
    "WorkNCCL(SeqNum=2521, OpType=ALLREDUCE, NumelIn=160672064, NumelOut=160672064, "
    "Timeout(ms)=600000) timed out in blocking wait."
)
NCCL_WATCHDOG = (
    "[E816 01:45:40.184373931 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 3] "
    "Exception (either an error or timeout) detected by watchdog at work: 80078, last "
    "enqueued NCCL work: 80078, last completed NCCL work: 80077."
)


def test_watchdog_lines_name_their_rank():
    from trainctl.core.parse import line_rank

    assert line_rank(NCCL_TIMEOUT) == 1
    assert line_rank(NCCL_WATCHDOG) == 3
    assert line_rank("[PG 0 (default_pg) Rank 7] Exception (either an error or timeout) detected") == 7
    assert line_rank("epoch 1 batch 3") is None


def _intake(tmp_path):
    from trainctl.agent import Agent
    from trainctl.store.spec import RunSpec

    (tmp_path / "run").mkdir()
    return Agent(
        tmp_path / "run",
        RunSpec(job_name="t", kind="torchrun", command=["torchrun", "t.py"]),
        serve=False,
        gpu_probe=None,
    )


def test_rank_output_tags_progress_lines_and_warnings_with_the_rank(tmp_path):
    """Recorded NCCL lines (no GPU here): one read from rank 2's own file, one from a shared
    console that carries its own [Rank N] tag; progress from each rank's file has its rank."""
    from trainctl.store.journal import read_events

    agent = _intake(tmp_path)
    intake = agent.intake
    intake.on_rank_output(2, "x/attempt_0/0/stdout.log", b"epoch=1/2 batch=3/20 loss=0.5\n")
    intake.on_rank_output(3, "x/attempt_0/1/stdout.log", b"epoch=1/2 batch=3/20 loss=0.7\n")
    intake.on_rank_output(2, "x/attempt_0/0/stderr.log", NCCL_TIMEOUT.encode() + b"\n")
    intake.on_output(NCCL_WATCHDOG.encode() + b"\n")
    intake.flush_progress(1e12, force=True)
    events = list(read_events(agent.ctx.files.events))
    prog = [e for e in events if e.type == "progress"]
    assert sorted(p.rank for p in prog) == [2, 3]
    warns = [e for e in events if e.type == "warning" and e.id.startswith("nccl.")]
    assert [(w.rank, w.text.split(":")[0]) for w in warns] == [(2, "rank 2"), (3, "rank 3")]
    assert {line.split("]")[0] for line in intake.tail} >= {"[rank2", "[rank3"}


def test_a_ranks_traceback_from_its_own_file_is_the_exit_exception():
    from trainctl.core.tracebacks import last_exception

    tail = [
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "t.py", line 3, in <module>',
        "[rank1]:     x()",
        "[rank1]: ValueError: bad",
        "W1125 torchrun: failed",
    ]
    exc, tb = last_exception(tail)
    assert exc == "ValueError: bad" and tb[0] == "Traceback (most recent call last):"


def test_the_readme_torchrun_job_example_is_a_valid_job(tmp_path):
    root = Path(__file__).resolve().parents[2]
    readme = (root / "docs" / "torchrun.md").read_text(encoding="utf-8")
    example = readme.split("# torchrun jobs", 1)[1].split("```toml", 1)[1].split("```", 1)[0]
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "B.toml").write_text(
        (root / "src" / "trainctl" / "presets" / "B.toml").read_text()
    )
    (tmp_path / "trainctl.toml").write_text(example)
    job = load_job(tmp_path / "trainctl.toml")
    assert (job.kind, job.fallback, job.resume_args) == ("torchrun", "B", ("--resume", "{checkpoint}"))
    assert job.command[-3:] == ("train.py", "--checkpoint-dir", "ckpts")


def test_the_node_rank_comes_from_the_cli_the_job_or_the_torchrun_command(tmp_path):
    import argparse

    from trainctl.agent.prepare import node as _node
    from trainctl.cli.common import UsageError

    path = tmp_path / "job.toml"
    path.write_text(
        'kind = "torchrun"\n[torchrun]\nscript = "t.py"\nnnodes = 2\nnode_rank = 1\n'
        'rdzv_endpoint = "127.0.0.1:29400"\n'
    )
    job = load_job(path)

    def args(node_rank=None, argv=()):
        return argparse.Namespace(node_rank=node_rank, command_argv=list(argv))

    rank, cmd = _node(args(), job)
    assert rank == 1 and cmd[cmd.index("--node-rank") + 1] == "1"
    rank, cmd = _node(args(0), job)
    assert rank == 0 and cmd[cmd.index("--node-rank") + 1] == "0"
    with pytest.raises(UsageError, match="must be 0 to 1"):
        _node(args(2), job)
    assert _node(args(argv=["torchrun", "--nnodes=2", "--node-rank", "1", "t.py"]), None)[0] == 1
    assert _node(args(argv=["torchrun", "--standalone", "t.py"]), None) == (
        None,
        ["torchrun", "--standalone", "t.py"],
    )
    with pytest.raises(UsageError, match="only for a kind"):
        _node(args(1, ["python", "t.py"]), None)


def test_an_adopting_agent_reads_the_rank_layout_and_offsets_back():
    """intake.json keeps the rank layout and each rank file's offset; an adopting agent
    (held_spawner.adopt) rebuilds the layout from it; garbage gives none."""
    from trainctl.agent.holder_spawner import _layout_from

    lay = T.layout(
        T.supervised(
            ["torchrun", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "4", "t.py"], "/r/ranks-3"
        )
    )
    saved = [str(lay.log_dir), lay.nproc, lay.nnodes_max, lay.node_rank]
    assert _layout_from(saved) == lay
    assert _layout_from(None) is None and _layout_from(["x"]) is None


def test_the_still_tree_watch_takes_the_ranks_activity_not_the_launchers(monkeypatch):
    """Issue 26: torchrun's launcher polls its workers and its store for ever (a few KB of
    I/O every second, measured on a real job): the watcher feeds the detector the rank
    processes and their DataLoader workers only, and nothing while no rank exists (the
    launcher at its rendezvous)."""
    import asyncio
    from types import SimpleNamespace

    from trainctl.agent.watch import Watcher
    from trainctl.system import diagnose
    from trainctl.system.probes import ProcSample

    def sample(pid, ppid, role, cpu, io):
        return ProcSample(pid, ppid, role, "python", "sleeping", cpu, None, None, None, "", io)

    fed = []
    detector = SimpleNamespace(
        on_tree=lambda now, cpu, io, gpu=None: fed.append((now, cpu, io)),
        on_evidence=lambda now, kind: None,
        idle=lambda now: 0.0,
        threshold=lambda now: None,
    )
    samples: list[tuple] = []

    class Trainer:
        returncode = None

        async def sample(self):
            return samples[-1]

    ctx = SimpleNamespace(
        facts=SimpleNamespace(trainer=Trainer(), gpu_probe=None),
        spec=SimpleNamespace(kind="torchrun"),
        detector=detector,
        policy=SimpleNamespace(auto_recover=True),
        ladder=None,
        emit=lambda ev: None,
    )
    w = Watcher(ctx, SimpleNamespace(phase="startup"), on_stall=None)
    ranks = {}
    monkeypatch.setattr(
        diagnose, "find_ranks", lambda s: {p: r for p, r in ranks.items() if p in {x.pid for x in s}}
    )
    launcher = sample(10, 1, "main", 3.0, 1_000_000)
    samples.append((launcher,))  # at its rendezvous: no rank
    asyncio.run(w.tick(1.0))
    assert fed == [(1.0, None, None)]  # not known, so not still: the launcher's figures are not fed
    fed.clear()
    ranks.update({11: 0, 12: 1})
    samples.append(
        (
            sample(10, 1, "main", 3.0, 1_002_000),
            sample(11, 10, "child", 0.5, 100),
            sample(12, 10, "child", 0.5, 200),
            sample(13, 12, "worker", 0.0, 50),
        )
    )
    asyncio.run(w.tick(2.0))
    assert fed == [(2.0, 1.0, 350)]  # ranks 0, 1 and rank 1's worker
    assert {d["pid"]: d.get("rank") for d in w.with_ranks(samples[-1])} == {10: None, 11: 0, 12: 1, 13: 1}
