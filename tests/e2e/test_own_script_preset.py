"""Issue 40, item 3: a preset acts on a plain PyTorch script, no line of it changed
(src/trainctl/inside/plain_torch.py): B's ``workers = 0`` turns the script's 2 DataLoader
workers into none (counted in the trainer's process tree), ``[train] compile = false``
turns torch.compile off, and the preset is read when the DataLoader is built: a warm spare
that imported torch under A and was released for the B attempt runs B.

A real agent, a real script (tests/helpers/scripts/own_loaders.py), real forked workers."""

from __future__ import annotations

import psutil
import pytest

from tests.e2e.conftest import PYTHON, start_trainctl, wait_until
from tests.helpers.hangs import SCRIPTS
from trainctl.core import events as E

pytestmark = pytest.mark.e2e


def workers_of(pid: int) -> int:
    """The live processes under the trainer (its DataLoader workers)."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return -1
    return sum(1 for k in kids if k.is_running() and k.status() != psutil.STATUS_ZOMBIE)


@pytest.mark.timeout(150)
def test_preset_b_turns_the_scripts_two_workers_into_none_on_the_warm_spare(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAINCTL_LOADER_OVERRIDE")  # the override is what is tested here
    a, b = tmp_path / "A.toml", tmp_path / "B.toml"
    a.write_text('description = "test A"\n[dataloader]\nworkers = 2\nmultiprocessing_context = "fork"\n')
    b.write_text(
        'description = "test B"\nargs = ["40"]\n[dataloader]\nworkers = 0\n[train]\ncompile = false\n'
    )
    script = str(SCRIPTS / "own_loaders.py")
    args = ["run", "--json", "--preset", str(a), "--fallback", str(b), "--", PYTHON, script, "400"]
    with start_trainctl(args, env={"TRAINCTL_SPARE_AFTER": "0"}) as tc:
        first = tc.wait_event(lambda e: e.type == "start" and e.attempt == 1, 60, "attempt 1")
        tc.wait_event(lambda e: e.type == "progress", 60, "attempt 1's first batch")
        wait_until(lambda: workers_of(first.pid) == 2, 20, what="attempt 1's 2 workers")
        tc.wait_event(lambda e: e.type == "info" and e.key == "spare.parked", 90, "the parked spare")
        ctl = start_trainctl(["ctl", str(tc.run_dir), "fallback"])
        assert ctl.wait(30).returncode == 0
        second = tc.wait_event(lambda e: e.type == "start" and e.attempt == 2, 60, "attempt 2")
        tc.wait_event(lambda e: e.type == "progress" and e.ts > second.ts, 60, "attempt 2's first batch")
        assert workers_of(second.pid) == 0
        res = tc.wait(60)
    assert res.returncode == 0, res.describe()
    events = res.events
    assert [e for e in events if isinstance(e, E.Info) and e.key == "spare.used"], "attempt 2 ran cold"
    two = [e for e in events if e.ts >= second.ts]
    [said] = [e for e in two if e.type == "warning" and e.id == "trainctl.preset_overrides"]
    assert said.text == "preset B changes the script's DataLoader: num_workers 2 -> 0", said.text
    assert any(e.type == "info" and e.key == "preset.compile_off" for e in two)
    log = (res.run_dir / "train.log").read_text()
    assert log.count("compiled True") == 1 and log.count("compiled False") == 1, log
