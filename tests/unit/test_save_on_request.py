"""Save on request, replayed on the fake spawner and virtual time: a rescue save on a stall
whose main thread still runs Python, a bounded wait when it does not answer, planned
restarts that save first, and the next attempt resuming from the newest checkpoint."""

from __future__ import annotations

import asyncio
import json
import signal

import pytest

from tests.unit.test_attempt_loop import batches, of, run_agent, until_state
from trainctl.agent.stop import can_answer, can_answer_now
from trainctl.core import events as E
from trainctl.inside.report import SAVE_ON_REQUEST_KEY
from trainctl.system.diagnose import Diagnosis
from trainctl.system.probes import ProcSample

pytestmark = pytest.mark.timeout(20)

DECLARE = ("side", E.Info(0, "this trainer saves on request", SAVE_ON_REQUEST_KEY))


def answer(path, epoch, batch, kind, took=1.0) -> list:
    return [
        ("silence", took / 2),
        ("side", E.Phase(0, "save")),
        ("silence", took / 2),
        ("side", E.Checkpoint(0, str(path), epoch, True, "", batch, kind)),
        ("side", E.Phase(0, "train")),
    ]


def infos(events, key):
    return [e.text for e in of(events, "info") if e.key == key]


def test_a_deadlock_gets_a_rescue_save_then_the_restart_resumes_from_it(tmp_path):
    ckpt = tmp_path / "rescue.bin"
    ckpt.write_bytes(b"state")
    hang = [
        ("start", {"pid": 101}),
        DECLARE,
        ("answers", answer(ckpt, 1, 20, "rescue")),
        *batches(1, 1, 20),
        ("hang", {}),
    ]
    good = [("start", {"pid": 102}), *batches(1, 21, 22), ("exit", {"returncode": 0})]
    code, events, spawner, agent = run_agent(tmp_path, [hang, good], resume_args=["--resume", "{checkpoint}"])
    assert code == 0
    stall, signalled, kill = of(events, "stall")[0].ts, spawner.when("signal")[0], spawner.when("kill")[0]
    assert stall <= signalled <= stall + 0.2 and signalled + 1.0 <= kill <= signalled + 1.5
    assert [a for _t, k, _p, a in spawner.log if k == "signal"] == [signal.SIGUSR1]
    request = json.loads((agent.ctx.files.dir / "save-request.json").read_text())
    assert request["kind"] == "rescue" and request["id"] == 1
    assert (agent.ctx.files.dir / "save-request.json").stat().st_mode & 0o777 == 0o600
    done = infos(events, "save_request_done")
    assert done and "rescue save took 1." in done[0] and "epoch 1 batch 20" in done[0], done
    cp = of(events, "checkpoint")[0]
    assert (cp.kind, cp.epoch, cp.batch) == ("rescue", 1, 20)
    assert of(events, "restart")[0].resume_from == str(ckpt)
    assert spawner.trainers[1].argv[-2:] == ["--resume", str(ckpt)]


def test_a_trainer_that_does_not_answer_is_killed_after_the_bounded_wait(tmp_path):
    hang = [("start", {"pid": 201}), DECLARE, *batches(1, 1, 5), ("hang", {})]  # no answers
    good = [("start", {"pid": 202}), *batches(1, 6, 7), ("exit", {"returncode": 0})]
    code, events, spawner, _ = run_agent(tmp_path, [hang, good], rescue_wait_s=12.0)
    assert code == 0
    wait = spawner.when("kill")[0] - spawner.when("signal")[0]
    assert 12.0 <= wait <= 12.3, wait
    assert infos(events, "save_request_timeout")


def test_a_trainer_that_never_declared_it_is_not_asked(tmp_path):
    hang = [("start", {"pid": 301}), *batches(1, 1, 5), ("hang", {})]
    good = [("start", {"pid": 302}), ("exit", {"returncode": 0})]
    code, events, spawner, _ = run_agent(tmp_path, [hang, good])
    assert code == 0 and not spawner.when("signal") and not infos(events, "save_request")


@pytest.mark.parametrize(
    "command,args", [("restart", {}), ("fallback", {}), ("switch_preset", {"preset": "B"})]
)
def test_planned_restarts_save_first_and_resume_from_that_save(tmp_path, command, args):
    ckpt = tmp_path / "planned.bin"
    ckpt.write_bytes(b"state")
    steps = [
        ("start", {"pid": 401}),
        DECLARE,
        ("answers", answer(ckpt, 1, 10, "planned", took=3.0)),
        *batches(1, 1, 100),
    ]
    good = [("start", {"pid": 402}), *batches(1, 11, 12), ("exit", {"returncode": 0})]

    async def during(agent):
        await until_state(agent, "RUNNING")
        await asyncio.sleep(4.0)
        assert (await agent.commands(command, args))["ok"]

    code, events, spawner, _ = run_agent(
        tmp_path, [steps, good], during=during, resume_args=["--resume", "{checkpoint}"]
    )
    assert code == 0
    checkpoint_at = [t for t, k, _p, a in spawner.log if k == "side" and isinstance(a, E.Checkpoint)][0]
    assert spawner.when("signal")[0] < checkpoint_at <= spawner.when("kill")[0]
    assert of(events, "checkpoint")[0].kind == "planned"
    assert of(events, "restart")[0].resume_from == str(ckpt)
    assert spawner.trainers[1].argv[-2:] == ["--resume", str(ckpt)]


def _main(status: str, cpu: float | None) -> ProcSample:
    return ProcSample(7, 1, "main", "python", status, cpu, None, 1, None)


@pytest.mark.parametrize(
    "status,cpu,frame,answers",
    [
        ("sleeping", 0.0, "_try_get_data (torch/utils/data/dataloader.py:1133)", True),  # data deadlock
        ("stopped", 0.0, None, False),  # SIGSTOP
        ("disk-sleep", 0.0, None, False),
        ("running", 100.0, "spin (train_loop.py:42)", True),  # while True: pass
        ("running", 100.0, "sre_ucs1_match (_sre/sre_lib.h:538)", False),  # native spin
        ("running", 100.0, None, True),  # no stacks: ask
    ],
)
def test_who_can_answer_a_save_request(tmp_path, status, cpu, frame, answers):
    stacks = None
    if frame:
        stacks = tmp_path / "stall.txt"
        stacks.write_text(
            f"# stall\n=== pid 7 main (python) status={status} ===\n$ py-spy dump\n"
            f'Process 7: python\nThread 7 (active): "MainThread"\n    {frame}\n'
            "    main (train.py:10)\n\n=== pid 8 worker (python) ===\n"
        )
    diag = Diagnosis(
        "spin" if cpu else ("stopped" if status == "stopped" else "deadlock"),
        cpu,
        str(stacks) if stacks else None,
        "",
        (_main(status, cpu),),
    )
    assert can_answer(diag)[0] is answers


def test_the_projection_says_where_the_last_checkpoint_is_and_counts_batches_redone():
    from trainctl.core.projection import Projector
    from trainctl.core.projection_text import format_projection

    proj = Projector()

    def batch(ts, e, b):
        proj.on_event(E.Progress(ts, e, 3, b, 100, {"loss": 1.0}, None))

    proj.on_event(E.Start(0.0, 1, 11, "A", ("train.py",)))
    for b in range(1, 71):
        batch(float(b), 1, b)
    proj.on_event(E.Checkpoint(70.5, "p.pt", 1, True, "", 60, "periodic"))
    p = proj.project(71.0)
    assert p.checkpoint["lose"] == 10 and p.checkpoint["batch"] == 60
    lines = format_projection(p, 250.5)
    assert "last checkpoint 3 m ago, epoch 1 batch 60 (periodic)" in lines
    assert "a restart now loses 10 batches" in lines
    proj.on_event(E.Restart(72.0, 2, "stall", "B", "p.pt", 1.0))
    proj.on_event(E.Start(73.0, 2, 12, "B", ("train.py",)))
    batch(75.0, 1, 61)  # resumed at the periodic save: 10 batches redone
    assert proj.project(76.0).redone == (10,)
    assert "batches redone per restart: 10" in format_projection(proj.project(76.0), 76.0)


@pytest.mark.parametrize(
    "main, answers",
    [
        (_main("sleeping", 0.0), True),  # idle: a deadlock, ask at once
        (_main("stopped", 0.0), False),
        (_main("disk-sleep", 0.0), False),
        (_main("running", 100.0), None),  # busy: only its stacks tell a native spin
        (_main("sleeping", None), None),  # no CPU figure yet
        (None, None),  # never sampled
    ],
)
def test_whether_to_ask_for_a_save_before_the_diagnosis(main, answers):
    assert can_answer_now(main)[0] is answers


def _stall_then(tmp_path, main: tuple[str, float]):
    """A deadlock whose diagnosis takes 3 s; the trainer answers a rescue save in 1 s."""
    ckpt = tmp_path / "rescue.bin"
    ckpt.write_bytes(b"state")
    hang = [
        ("start", {"pid": 301}),
        DECLARE,
        ("diagnose_s", 3.0),
        ("main", main),
        ("answers", answer(ckpt, 1, 5, "rescue")),
        *batches(1, 1, 5),
        ("hang", {}),
    ]
    good = [("start", {"pid": 302}), *batches(1, 6, 7), ("exit", {"returncode": 0})]
    code, events, spawner, _ = run_agent(tmp_path, [hang, good])
    assert code == 0
    return events, spawner


def test_the_stall_goes_out_at_once_and_the_save_is_taken_while_the_stacks_are_read(tmp_path):
    events, spawner = _stall_then(tmp_path, ("sleeping", 0.0))
    stall, verdict = of(events, "stall")[0], of(events, "stall_diagnosis")[0]
    assert stall.diagnosis == "diagnosing" and verdict.diagnosis == "deadlock"
    (signalled,), (diagnosed,), (kill,) = (
        spawner.when("signal"),
        spawner.when("diagnosed"),
        spawner.when("kill"),
    )
    saved = [t for t, k, _p, a in spawner.log if k == "side" and isinstance(a, E.Checkpoint)][0]
    # asked after the diagnosis's CPU window, saved before the stacks were all read
    assert stall.ts + 1.0 <= signalled <= stall.ts + 1.3 and saved < diagnosed, (stall.ts, signalled, saved)
    assert stall.ts + 3.0 <= verdict.ts <= stall.ts + 3.3 and kill >= verdict.ts  # the kill waits for both


def test_a_busy_main_process_is_asked_only_after_its_verdict(tmp_path):
    events, spawner = _stall_then(tmp_path, ("running", 100.0))
    (signalled,), (diagnosed,) = spawner.when("signal"), spawner.when("diagnosed")
    assert signalled >= diagnosed  # a native spin would get no request (test_who_can_answer_...)
    assert of(events, "checkpoint")[0].kind == "rescue"
