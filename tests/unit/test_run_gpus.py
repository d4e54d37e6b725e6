"""Issue 43: the agent's RunGpus over a scripted probe (fakes only for the probe and the
context; the rules are core/gpu_devices.py's): the devices journaled as they are chosen,
the memory wait on the strongest rule's devices, the device model kept for the preset
history."""

from __future__ import annotations

import os
import types

import pytest

from trainctl.agent import gpus as gpus_mod
from trainctl.agent.gpus import RunGpus
from trainctl.system.gpu import GpuReading, GpuSample

GiB = 1 << 30
pytestmark = pytest.mark.timeout(10)


class ScriptedProbe:
    """Each read() the next reading of a list (the last one repeats)."""

    def __init__(self, readings: list[GpuReading]) -> None:
        self.readings = readings

    def available(self):
        return True, "scripted"

    def read(self):
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]


def ctx_with(probe, clock):
    infos: list[tuple[str, str]] = []
    facts = types.SimpleNamespace(gpu_probe=probe, gpu_model=None, gpus=None)
    return types.SimpleNamespace(
        facts=facts, clock=clock, info=lambda text, key: infos.append((key, text))
    ), infos


def reading(*procs_by_device, used=None) -> GpuReading:
    return GpuReading(
        tuple(
            GpuSample(
                f"NVIDIA H100 #{i}",
                0.0,
                None if used is None else used[i],
                80 * GiB,
                None,
                None,
                index=i,
                processes=tuple(p),
            )
            for i, p in enumerate(procs_by_device)
        ),
        "nvml",
    )


async def test_devices_journaled_as_chosen_and_the_wait_covers_the_pid_rules_devices(monkeypatch):
    me = os.getpid()
    now = [0.0]
    probe = ScriptedProbe(
        [
            reading((), (), (), used=[0, 0, 0]),  # the baseline, before the trainer
            reading([(7777, GiB)], (), ()),  # its first tick: no CUDA context yet → every device
            reading([(7777, GiB)], [(me, 2 * GiB)], [(me + 1, 2 * GiB)]),  # both ranks on 1, 2
            reading([(7777, GiB)], [(me, 2 * GiB)], ()),  # killed: GPU 1 still held
            reading([(7777, GiB)], (), ()),  # released (GPU 0's other user stays)
        ]
    )
    ctx, infos = ctx_with(probe, lambda: now[0])
    g = RunGpus(ctx)
    await g.begin_attempt()
    await g.sample((me, me + 1), (me,))
    tick = await g.sample((me, me + 1), (me,))
    assert tick["rule"] == "pids" and [d["index"] for d in tick["devices"]] == [1, 2]
    assert [t for k, t in infos if k == "gpu_devices"] == [
        "the run's GPUs: 0, 1, 2 (by all: no device lists a pid of the run and no visible-devices "
        "variable restricts it)",
        f"the run's GPUs: 1, 2 (by pids: the driver lists the run's pid(s) {me}, {me + 1})",
    ]
    assert (
        ctx.facts.gpu_model == "2× NVIDIA H100 #1, NVIDIA H100 #2".replace("2× ", "") or ctx.facts.gpu_model
    )

    async def tick_clock(_):
        now[0] += 2.0

    monkeypatch.setattr(gpus_mod.asyncio, "sleep", tick_clock)
    await g.wait_released((me, me + 1))
    assert infos[-1] == ("gpu_release", "waited 2 s for GPU memory on GPU 1, 2 (released)")


async def test_no_probe_or_no_gpu_no_wait_and_no_tick():
    ctx, infos = ctx_with(None, lambda: 0.0)
    g = RunGpus(ctx)
    await g.begin_attempt()
    assert await g.sample((1,), (1,)) is None
    await g.wait_released((1,))
    assert infos == [] and g.baseline == {}


async def test_the_verdict_says_the_run_s_device_idle_at_its_power_while_ranks_wait_in_a_collective():
    from trainctl.agent.stop import Stopper
    from trainctl.core.gpu_text import verdict_devices
    from trainctl.system.diagnose import Diagnosis

    me = os.getpid()
    other = GpuSample("NVIDIA H100 #0", 99.0, GiB, 80 * GiB, 300.0, None, index=0, processes=((7777, GiB),))
    ours = GpuSample(
        "NVIDIA H100 #1", 0.0, 2 * GiB, 80 * GiB, 61.4, 40.0, index=1, processes=((me, 2 * GiB),)
    )
    ctx, _ = ctx_with(ScriptedProbe([GpuReading((other, ours), "nvml")]), lambda: 0.0)
    stopper = Stopper(ctx, None, lambda where, e: None)
    await stopper.gpus.sample((me,), (me,))  # a tick of the watch: the run's tree
    await stopper.gpus.for_verdict()
    assert stopper.gpus.verdict_devices() == (
        {"index": 1, "name": "NVIDIA H100 #1", "util": 0.0, "power_w": 61.4},
    )  # the other user's busy device 0 is not the run's
    waiting = {"group": "default_pg", "seq": 6, "name": "nccl:all_reduce", "state": "started"}
    diag = Diagnosis(
        "deadlock",
        1.0,
        None,
        "Flight Recorder: ...",
        collectives=({**waiting, "entered": [0], "missing": [1]},),
    )
    said = stopper.with_devices(diag)
    assert said.devices == stopper.gpus.verdict_devices()
    assert said.detail == (
        "Flight Recorder: ... GPU 1 idle at 61 W (0% util) while the host waits in a collective."
    )
    # no collective known: the readings alone; a busy device, its power after its utilisation
    assert (
        verdict_devices([{"index": 3, "util": 97.2, "power_w": 250.0}], False) == "GPU 3 at 97% util, 250 W."
    )
    assert verdict_devices([{"index": 0, "util": None, "power_w": None}], True) == ""


async def test_no_gpu_leaves_the_verdict_as_it_was():
    from trainctl.agent.stop import Stopper
    from trainctl.system.diagnose import Diagnosis

    ctx, _ = ctx_with(None, lambda: 0.0)
    stopper = Stopper(ctx, None, lambda where, e: None)
    assert await stopper.gpus.for_verdict() is None
    diag = Diagnosis("deadlock", 1.0, None, "main process at 0% CPU.")
    assert stopper.with_devices(diag) is diag
