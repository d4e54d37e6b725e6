"""The attempt loop, replayed: recorded trainer histories through a fake spawner on a
virtual-time loop (tests/helpers/fake_spawner.py).  A whole recovery (stall → diagnose →
kill → policy → restart) runs in milliseconds; each test also checks the virtual times."""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers.fake_spawner import FakeSpawner, run_virtual
from trainctl.agent import EXIT_SUPERVISION_LOST, Agent
from trainctl.core import events as E
from trainctl.store.journal import read_events
from trainctl.store.spec import RunSpec
from trainctl.system.gpu import NoGpuProbe

pytestmark = pytest.mark.timeout(20)


def batch_line(epoch: int, b: int, of: int = 100) -> bytes:
    return f"epoch={epoch}/3 batch={b}/{of} loss=0.{b:02d}".encode()


def batches(epoch: int, first: int, last: int, every: float = 0.5) -> list:
    steps: list = []
    for b in range(first, last + 1):
        steps += [("line", batch_line(epoch, b)), ("silence", every)]
    return steps


def run_agent(tmp_path, histories, *, during=None, **spec_kw):
    """Run an agent over ``histories``; ``during(agent)``: a coroutine run beside it.
    Returns (exit code, journal events, spawner, agent)."""
    run_dir = tmp_path / "run"
    (run_dir / "presets").mkdir(parents=True)
    for name, workers in (("A", 2), ("B", 0)):
        (run_dir / "presets" / f"{name}.toml").write_text(
            f'description = "{name}"\n[dataloader]\nworkers = {workers}\n[env]\nWHICH = "{name}"\n'
        )
    spec_kw.setdefault("stall", {"train_timeout": 5.0, "startup_timeout": 30.0})
    spec = RunSpec(
        job_name=f"fake-{tmp_path.name}",
        kind="command",
        command=["train.py"],
        preset="A",
        fallback="B",
        kernel_log=False,
        **spec_kw,
    )
    spawner = FakeSpawner(histories)

    async def main(loop):
        agent = Agent(
            run_dir,
            spec,
            clock=loop.wall,
            gpu_probe=NoGpuProbe(),
            serve=False,
            subreaper=False,
            spawner=spawner,
        )
        side = asyncio.create_task(during(agent)) if during else None
        code = await agent.run()
        if side is not None:
            await side
        return code, agent

    code, agent = run_virtual(main)
    return code, list(read_events(run_dir / "events.jsonl")), spawner, agent


def of(events, kind):
    return [e for e in events if e.type == kind]


def states(events):
    return [e.state for e in of(events, "state")]


async def until_state(agent, state: str, attempt: int = 1, limit_s: float = 600.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    while agent.ctx.sm.state.value != state or agent.ctx.facts.attempt < attempt:
        assert loop.time() < end, f"never reached {state} in attempt {attempt}"
        await asyncio.sleep(0.05)


def test_a_stall_is_diagnosed_killed_and_restarted_under_the_fallback(tmp_path):
    hang = [("start", {"pid": 101}), *batches(1, 1, 20), ("hang", {})]
    good = [("start", {"pid": 102}), *batches(1, 21, 30), ("exit", {"returncode": 0})]
    code, events, spawner, _ = run_agent(tmp_path, [hang, good])
    assert code == 0
    stall = of(events, "stall")[0]  # said at detection, its verdict after
    assert stall.diagnosis == "diagnosing" and stall.phase == "train"
    assert of(events, "stall_diagnosis")[0].diagnosis == "deadlock"
    restart = of(events, "restart")[0]
    assert restart.preset == "B" and restart.attempt == 2
    assert [s.preset for s in of(events, "start")] == ["A", "B"]
    assert spawner.trainers[1].env["WHICH"] == "B"
    assert states(events)[-1] == "FINISHED"
    # caught within the 5 s threshold (+ the 0.5 s watch) of the last batch; killed after the diagnosis
    last_batch = spawner.when("silence")[19]
    kill = spawner.when("kill")[0]
    assert 5.0 <= stall.ts - last_batch <= 6.1, stall.ts - last_batch
    assert spawner.when("diagnose")[0] <= kill


def test_a_crash_restarts_and_the_exit_code_is_journaled(tmp_path):
    crash = [("start", {"pid": 201}), *batches(1, 1, 5), ("exit", {"returncode": 1})]
    good = [("start", {"pid": 202}), *batches(1, 6, 8), ("exit", {"returncode": 0})]
    code, events, _, _ = run_agent(tmp_path, [crash, good])
    assert code == 0
    assert [e.returncode for e in of(events, "exit")] == [1, 0]
    assert "exited with code 1" in of(events, "restart")[0].reason


def test_the_budget_runs_out_with_a_growing_backoff(tmp_path):
    histories = [
        [("start", {"pid": 300 + i}), *batches(1, 10 * i + 1, 10 * i + 3), ("exit", {"returncode": 1})]
        for i in range(4)
    ]
    code, events, spawner, _ = run_agent(tmp_path, histories, max_restarts=3, backoff_base_s=1.0)
    assert code == 1 and states(events)[-1] == "FAILED"
    delays = [r.delay_s for r in of(events, "restart")]
    assert delays == [0.0, 1.0, 2.0]  # the first restart of the incident at once
    starts, exits = spawner.when("start"), spawner.when("exited")
    gaps = [starts[i + 1] - exits[i] for i in range(3)]
    assert all(g >= d for g, d in zip(gaps, delays)), (gaps, delays)
    assert "budget spent" in of(events, "warning")[-1].text


def test_attempts_without_a_new_batch_end_the_run(tmp_path):
    first = [("start", {"pid": 401}), *batches(1, 1, 5), ("exit", {"returncode": 1})]
    again = [[("start", {"pid": 402 + i}), *batches(1, 1, 3), ("exit", {"returncode": 1})] for i in range(2)]
    code, events, _, _ = run_agent(tmp_path, [first, *again], max_restarts=10)
    assert code == 1
    assert "made no new batch" in of(events, "state")[-1].reason


def test_a_restart_waits_for_the_checkpoint_save_to_end(tmp_path):
    steps = [
        ("start", {"pid": 501}),
        *batches(1, 1, 3),
        ("side", E.Phase(0, "save")),
        ("silence", 8.0),
        ("side", E.Phase(0, "train")),
        *batches(1, 4, 40),
    ]
    good = [("start", {"pid": 502}), ("exit", {"returncode": 0})]

    async def during(agent):
        await asyncio.sleep(2.0)  # inside the save (it runs from ~1.5 s to ~9.5 s)
        reply = await agent.commands("restart", {})
        assert reply["ok"], reply

    code, events, spawner, _ = run_agent(tmp_path, [steps, good], during=during)
    assert code == 0
    save_end = [t for t, k, _p, a in spawner.log if k == "side" and getattr(a, "phase", "") == "train"][0]
    assert spawner.when("kill")[0] >= save_end
    assert any(e.key == "save_wait" for e in of(events, "info"))


def test_commands_during_backoff_pick_the_next_preset_or_stop(tmp_path):
    crash = [("start", {"pid": 601}), *batches(1, 1, 3), ("exit", {"returncode": 1})]
    again = [("start", {"pid": 602}), *batches(1, 4, 6), ("exit", {"returncode": 1})]

    async def switch_then_stop(agent):  # the first restart goes at once: the second backs off
        await until_state(agent, "BACKOFF", attempt=2)
        assert (await agent.commands("switch_preset", {"preset": "A"}))["ok"]
        await until_state(agent, "BACKOFF", attempt=3)
        assert (await agent.commands("stop", {}))["ok"]

    code, events, spawner, _ = run_agent(
        tmp_path,
        [crash, again, [("start", {"pid": 603}), *batches(1, 7, 9), ("exit", {"returncode": 1})]],
        during=switch_then_stop,
        backoff_base_s=30.0,
        max_restarts=9,
    )
    assert code == 130 and states(events)[-1] == "STOPPED"
    assert [r.delay_s for r in of(events, "restart")] == [0.0, 30.0, 60.0]
    assert [s.preset for s in of(events, "start")] == ["A", "B", "A"]  # the user's pick beat the fallback
    assert len(spawner.trainers) == 3


def test_a_user_stop_ends_in_stopped_not_finished(tmp_path):
    async def stop(agent):
        await until_state(agent, "RUNNING")
        await agent.commands("stop", {})

    code, events, _, _ = run_agent(tmp_path, [[("start", {"pid": 701}), *batches(1, 1, 50)]], during=stop)
    assert code == 130
    assert states(events)[-1] == "STOPPED" and "FINISHED" not in states(events)


def test_a_failed_diagnosis_never_holds_up_recovery(tmp_path):
    hang = [("start", {"pid": 801}), ("fail_diagnose", True), *batches(1, 1, 4), ("hang", {})]
    good = [("start", {"pid": 802}), *batches(1, 5, 6), ("exit", {"returncode": 0})]
    code, events, _, _ = run_agent(tmp_path, [hang, good])
    assert code == 0
    assert of(events, "stall_diagnosis")[0].diagnosis == "unknown"
    assert of(events, "error")[0].where == "diagnose"
    assert of(events, "restart")[0].preset == "B"


def test_a_task_that_keeps_failing_fails_the_run_loudly(tmp_path):
    broken = [("start", {"pid": 901}), ("fail_output", True), ("silence", 3600)]
    code, events, spawner, _ = run_agent(tmp_path, [broken], stall={"startup_timeout": 7200.0})
    assert code == EXIT_SUPERVISION_LOST
    errors = of(events, "error")
    assert {e.where for e in errors} == {"output"} and 2 <= len(errors) <= 5  # repeats are counted
    assert "times more" in errors[-1].text
    gave_up = [e.ts for e in of(events, "warning") if e.id == "trainctl.supervision_lost"][0]
    assert 120 <= gave_up - errors[0].ts <= 600  # ridden out for minutes (pauses grow), not seconds
    assert states(events)[-1] == "FAILED" and "kept failing" in of(events, "state")[-1].reason
    assert spawner.when("kill"), "the trainer is stopped, not left unwatched"


def test_a_command_that_cannot_start_fails_at_once(tmp_path):
    code, events, _, _ = run_agent(tmp_path, [[("spawn_error", "No such file or directory")]])
    assert code == 1
    assert of(events, "warning")[0].id == "trainctl.spawn_failed"
    assert "could not start" in of(events, "state")[-1].reason


def test_every_runner_kind_has_its_job_table_and_every_command_a_handler(tmp_path):
    """One registry each: the runner kinds (argv, resume rule, job-file table) and the
    commands (the agent's handlers, `trainctl ctl`'s choices, the fakes' check)."""
    from trainctl.agent.handlers import CommandHandlers
    from trainctl.agent.launch import RUNNERS
    from trainctl.cli.parser import build_parser
    from trainctl.config.kinds import JOB_TABLES
    from trainctl.core.commands import COMMANDS, CTL_COMMANDS

    assert set(RUNNERS) == set(JOB_TABLES)
    assert all(r.table is JOB_TABLES[k] for k, r in RUNNERS.items())
    assert all(hasattr(CommandHandlers, f"cmd_{name}") for name in COMMANDS)
    ctl = build_parser().parse_args(["ctl", "RUN", "stop"])
    assert ctl.command == "stop" and set(CTL_COMMANDS) <= set(COMMANDS)


def test_a_user_dump_on_a_moving_run_is_a_snapshot_not_a_verdict(tmp_path):
    async def dump(agent):
        await until_state(agent, "RUNNING")
        reply = await agent.commands("dump_stacks", {})
        assert reply["ok"] and reply["result"]["diagnosis"] == "snapshot", reply
        await agent.commands("stop", {})

    code, events, _, _ = run_agent(tmp_path, [[("start", {"pid": 1001}), *batches(1, 1, 40)]], during=dump)
    info = [e.text for e in of(events, "info") if e.key == "stacks"]
    assert info and "snapshot" in info[0] and "deadlock" not in info[0], info


def test_requests_of_the_wrong_shape_get_one_line_errors(tmp_path):
    async def ask(agent):
        await until_state(agent, "RUNNING")
        for name, args, words in (
            ("nope", {}, "unknown command"),
            (["stop"], {}, "unknown command"),
            ("auto_recover", {"on": "false"}, "must be a bool"),
            ("stop", [1], "must be an object"),
            ("switch_preset", {"preset": "../x"}, "preset name"),
        ):
            reply = await agent.commands(name, args)
            assert not reply["ok"] and words in reply["error"], (name, args, reply)
        await agent.commands("stop", {})

    code, events, _, agent = run_agent(tmp_path, [[("start", {"pid": 1101}), *batches(1, 1, 40)]], during=ask)
    assert code == 130 and agent.ctx.policy.auto_recover  # "false" did not turn it on/off


def test_a_run_directory_deleted_in_the_back_off_is_made_again_before_the_next_start(tmp_path):
    """Issue 27: the next attempt's start makes a deleted run directory again first (the
    agent's keeper, which looks every second, does not run in an agent without a socket:
    only the start can), with its presets: the restart's fallback B is read from it."""
    import shutil

    crash = [("start", {"pid": 201}), *batches(1, 1, 5), ("exit", {"returncode": 1})]
    again = [("start", {"pid": 202}), *batches(1, 6, 7), ("exit", {"returncode": 1})]
    good = [("start", {"pid": 203}), *batches(1, 8, 9), ("exit", {"returncode": 0})]
    seen = []

    async def delete_in_backoff(agent):  # the second restart's: the first one has none
        while sum(isinstance(ev, E.Restart) for ev in seen) < 2:
            await asyncio.sleep(0.01)
        while (tmp_path / "run").exists():  # a writer in a thread may add a file meanwhile
            shutil.rmtree(tmp_path / "run", ignore_errors=True)

    def watch(agent):
        agent.ctx.bus.on_journaled.append(seen.append)
        return delete_in_backoff(agent)

    code, events, spawner, _ = run_agent(tmp_path, [crash, again, good], during=watch, max_restarts=9)
    assert code == 0, [(e.type, getattr(e, "text", getattr(e, "state", ""))) for e in events][-8:]
    assert [e.returncode for e in of(events, "exit")] == [1, 1, 0]
    assert [e.key for e in of(events, "info") if e.key == "run_dir.remade"] == ["run_dir.remade"]
