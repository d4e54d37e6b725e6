"""Issue 43: the run's own GPUs (core/gpu_devices.py), the memory wait over every device of
the attempt (core/gpu_release.py), and the per-process readings of NVML and amdsmi
(system/gpu.py) with fake modules; pure."""

from __future__ import annotations

import types

import pytest

from trainctl.core import gpu_devices as gd
from trainctl.core import gpu_release as gr
from trainctl.core.events import Progress
from trainctl.core.stall import StallDetector
from trainctl.system.gpu import GpuSample, engine_util, nvml_process_util

GiB = 1 << 30
pytestmark = pytest.mark.timeout(10)


def dev(index, util=0.0, procs=(), per_process=None, used=None, uuid=None) -> GpuSample:
    return GpuSample(
        "GPU",
        util,
        used,
        80 * GiB,
        None,
        None,
        index=index,
        processes=tuple(procs),
        process_util=per_process,
        uuid=uuid,
    )


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, None),
        ({"CUDA_VISIBLE_DEVICES": "2,3"}, ("2", "3")),
        ({"CUDA_VISIBLE_DEVICES": ""}, ()),
        ({"CUDA_VISIBLE_DEVICES": "1,-1,2"}, ("1",)),  # CUDA stops at an invalid entry
        ({"HIP_VISIBLE_DEVICES": "0"}, ("0",)),
        ({"ROCR_VISIBLE_DEVICES": "GPU-abc"}, ("GPU-abc",)),
    ],
)
def test_visible_devices(env, want):
    assert gd.visible_devices(env) == want


def test_torchrun_ranks_on_devices_1_and_2_with_another_users_job_on_0():
    devices = (
        dev(0, 100.0, [(7777, 30 * GiB)]),
        dev(1, 90.0, [(101, GiB)]),
        dev(2, 80.0, [(102, GiB)]),
        dev(3),
    )
    run = gd.choose(devices, (100, 101, 102, 103), {})
    assert (run.indices, run.rule) == ((1, 2), "pids")
    assert run.why == "the driver lists the run's pid(s) 101, 102"
    # no per-process figures, each of the run's devices its alone: the busier one
    assert gd.run_activity(devices, run, (100, 101, 102, 103))[0] == 90.0


def test_another_process_busy_on_the_runs_device_is_never_the_runs_activity():
    tree = (4242,)
    busy_other = dev(2, 100.0, [(4242, GiB), (9999, GiB)], per_process=((9999, 100.0),))
    run = gd.choose((dev(0), dev(1), busy_other), tree, {})
    assert run.indices == (2,)
    assert gd.run_activity((busy_other,), run, tree) == (0, "GPU 2: the run's processes' own")
    no_per_process = dev(2, 100.0, [(4242, GiB), (9999, GiB)])
    assert gd.run_activity((no_per_process,), run, tree)[0] is None


def test_a_hung_collective_keeps_the_gpu_busy_and_the_train_threshold_still_decides():
    """A device busy while every rank waits in a collective is no progress: in train the
    batch threshold fires whatever the GPU reports."""
    d = StallDetector(train_timeout=5.0)
    d.reset(0.0)
    d.on_phase("train", 0.5)
    for t in range(1, 4):
        d.on_progress(Progress(float(t), epoch=1, epochs=1, batch=t, batches=100), float(t))
    verdict = None
    for t in range(4, 20):
        d.on_tree(float(t), 0.0, 1000, gpu_percent=100.0)
        verdict = verdict or d.check(float(t))
    assert verdict is not None and verdict.phase == "train" and not verdict.still


def test_container_pids_of_the_host_fall_back_to_each_trainers_visible_devices():
    devices = (dev(0, procs=[(4_004_242, GiB)]), dev(1, procs=[(4_004_243, GiB)]), dev(2, uuid="GPU-77aa"))
    run = gd.choose(
        devices, (10, 11), {10: {"CUDA_VISIBLE_DEVICES": "1"}, 11: {"CUDA_VISIBLE_DEVICES": "GPU-77"}}
    )
    assert (run.indices, run.rule) == ((1, 2), "visible-devices")
    assert gd.run_activity(devices, run, (10, 11))[0] is None  # the host's pids: no one's known
    assert gd.choose(devices, (10,), {10: {}}).rule == "all"
    assert gd.choose((), (10,), {}).rule == "none"


def test_the_memory_wait_covers_both_ranks_devices_and_says_which_still_hold():
    devices = (dev(0, procs=[(7777, 30 * GiB)]), dev(1, procs=[(101, 2 * GiB)]), dev(2, procs=[(102, None)]))
    held = gr.held_by_device(devices, (), (1, 2), (100, 101, 102), {})
    assert held == {1: 2 * GiB, 2: None}  # GPU 0's other user is not waited for
    assert gr.may_start_all(held, 2.0) == (False, "GPU 1 2048 MB, GPU 2 an unknown amount still held")
    assert gr.may_start_all(held, 50.0)[0] is True
    released = (dev(0, procs=[(7777, 30 * GiB)]), dev(1, procs=[(101, 100 << 20)]), dev(2))
    assert gr.may_start_all(gr.held_by_device(released, (), (1, 2), (101, 102), {}), 4.0) == (
        True,
        "released",
    )


def test_without_pids_the_wait_is_for_the_used_memory_to_fall_back_to_its_baseline():
    before = gd.used_bytes((dev(0, used=GiB), dev(1, used=3 * GiB)), (0, 1))
    assert before == {0: GiB, 1: 3 * GiB}
    after = (dev(0, used=GiB), dev(1, used=10 * GiB, procs=[(4_000_001, 7 * GiB)]))
    held = gr.held_by_device(after, (), (1,), (55,), before, by_pids=False)
    assert held == {1: 7 * GiB}
    back = (dev(0, used=GiB), dev(1, used=3 * GiB + (100 << 20)))
    assert gr.may_start_all(gr.held_by_device(back, (), (1,), (55,), before, by_pids=False), 2.0)[0] is True


class NotFoundError(Exception):
    pass


def test_nvml_per_process_utilisation_newest_sample_since_the_last_read():
    def samples(handle, since):
        return [
            types.SimpleNamespace(pid=1, timeStamp=10, smUtil=99),  # before `since`: old
            types.SimpleNamespace(pid=2, timeStamp=30, smUtil=40),
            types.SimpleNamespace(pid=2, timeStamp=40, smUtil=60),
        ]

    assert nvml_process_util(types.SimpleNamespace(nvmlDeviceGetProcessUtilization=samples), 0, 20) == (
        (2, 60.0),
    )

    def none_found(handle, since):
        raise NotFoundError("Not Found")

    def unsupported(handle, since):
        raise RuntimeError("Not Supported")

    assert nvml_process_util(types.SimpleNamespace(nvmlDeviceGetProcessUtilization=none_found), 0, 0) == ()
    assert nvml_process_util(types.SimpleNamespace(nvmlDeviceGetProcessUtilization=unsupported), 0, 0) is None
    assert nvml_process_util(types.SimpleNamespace(), 0, 0) is None


def test_amdsmi_engine_time_becomes_each_processes_share_between_readings():
    before: dict[int, tuple[float, int]] = {}
    assert engine_util(before, {7: 1_000_000_000, 8: None}, 10.0) is None  # nothing to compare yet
    assert engine_util(before, {7: 1_500_000_000}, 11.0) == ((7, 50.0),)
    assert engine_util(before, {}, 12.0) is None and before == {}  # gone: forgotten
