"""The health check of the run's GPUs before a restart (issue 43): its answer read, the
bounded subprocess (a fake run for the GPU cases; the real one on this CPU box skips), and
the attempt loop's refusal to restart on a failed device."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from tests.unit.test_run_gpus import ScriptedProbe, ctx_with, reading
from trainctl.agent import gpus as gpus_mod
from trainctl.agent.attempt import AttemptLoop
from trainctl.agent.gpus import RunGpus
from trainctl.system import gpu_health
from trainctl.system.gpu_health import Health

pytestmark = pytest.mark.timeout(30)


def test_a_device_that_gave_no_line_or_a_wrong_sum_failed():
    out = (
        '{"index": 1, "ok": true, "error": ""}\n{"index": 2, "ok": false, "error": "sum 0.0 != 2.0"}\nnoise\n'
    )
    health = gpu_health.read(out, [1, 2, 3], 1.25)
    assert health.passed == (1,) and health.failed == {2: "sum 0.0 != 2.0", 3: "no answer"}
    assert (
        health.said()
        == "GPU health check (1.2s): GPU 2 FAILED (sum 0.0 != 2.0); GPU 3 FAILED (no answer); GPU 1 passed"
    )
    assert gpu_health.read('{"skip": "torch 2.14.1 sees no GPU"}\n', [0]).failed is None


def test_a_hung_device_fails_by_the_bound_and_a_crash_says_its_last_line():
    def hangs(argv, **kw):
        assert kw["timeout"] == 7 and kw["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert "CUDA_VISIBLE_DEVICES" not in kw["env"] and argv[-2:] == ["0", "3"]
        raise subprocess.TimeoutExpired(argv, 7)

    assert gpu_health.check("python", [0, 3], 7, run=hangs).failed == {
        0: "no answer within 7s",
        3: "no answer within 7s",
    }

    def crashes(argv, **kw):
        return subprocess.CompletedProcess(argv, -6, "", "...\nCUDA error: an illegal memory access\n")

    assert gpu_health.check("python", [0], run=crashes).failed == {0: "CUDA error: an illegal memory access"}


def test_the_real_check_on_this_cpu_box_skips():
    health = gpu_health.check(sys.executable, [0], 60)
    assert health.skipped and health.failed is None, health  # CPU torch, or no torch


async def test_no_gpu_no_check_and_a_failed_device_is_journaled(monkeypatch):
    ctx, infos = ctx_with(None, lambda: 0.0)
    assert await RunGpus(ctx).health_check("python") is None and infos == []  # CPU: silent
    ctx, infos = ctx_with(ScriptedProbe([reading([(12345, 1 << 30)])]), lambda: 0.0)
    g = RunGpus(ctx)
    await g.sample((12345,), (12345,))
    monkeypatch.setattr(
        gpus_mod.asyncio, "get_running_loop", lambda: types.SimpleNamespace(run_in_executor=_inline)
    )
    monkeypatch.setattr(gpu_health, "check", lambda python, devices: Health((), {0: "Xid 79"}, "", 0.5))
    health = await g.health_check("python")
    assert health.failed == {0: "Xid 79"}
    assert infos[-1] == ("gpu_health", "GPU health check (0.5s): GPU 0 FAILED (Xid 79)")


async def _inline(executor, fn, *args):
    return fn(*args)


async def test_the_restart_is_refused_on_a_failed_device_and_goes_on_otherwise():
    said = Health((), {1: "Xid 79"}, "", 0.5)

    def loop_with(health, command=("python", "train.py"), remote=False):
        async def health_check(python):
            assert python == "python"
            return health

        gpus = types.SimpleNamespace(health_check=health_check)
        spec = types.SimpleNamespace(remote=remote, command=command)
        return types.SimpleNamespace(
            ctx=types.SimpleNamespace(spec=spec), stopper=types.SimpleNamespace(gpus=gpus), report=None
        )

    why = await AttemptLoop.unhealthy_devices(loop_with(said))
    assert (
        why
        == "not restarting on a GPU that failed its health check: GPU health check (0.5s): GPU 1 FAILED (Xid 79)"
    )
    assert await AttemptLoop.unhealthy_devices(loop_with(Health((1,), {}, "", 0.5))) == ""
    assert await AttemptLoop.unhealthy_devices(loop_with(None)) == ""  # no GPU
    assert await AttemptLoop.unhealthy_devices(loop_with(said, remote=True)) == ""  # not checked from here
