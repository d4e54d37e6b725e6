"""Probes: GPU tool outputs parse, no GPU is answered cleanly, the process tree sees real
DataLoader workers."""

from __future__ import annotations

import time
import types
from pathlib import Path

import pytest

from tests.helpers import hangs
from trainctl.system.gpu import (
    AmdSmiProbe,
    GpuSample,
    NoGpuProbe,
    NvmlProbe,
    RocmSmiProbe,
    detect_gpu_probe,
    parse_rocm_smi,
)
from trainctl.system.probes import TreeSampler, classify_role, process_tree

GPU_DATA = Path(__file__).resolve().parent.parent / "data" / "gpu"
GiB = 1 << 30


def read(name: str) -> str:
    return (GPU_DATA / name).read_text(encoding="utf-8")


# ---------------------------------------------------------------------------- rocm-smi


@pytest.mark.timeout(10)
def test_rocm_smi_1_4_on_rx5600xt_parses():
    s = parse_rocm_smi(read("rocm-smi_1.4.1_rocm-5.7_rx5600xt.json"))
    assert s == GpuSample(
        name="Navi 10 [Radeon RX 5600 OEM/5600 XT / 5700/5700 XT]",
        util_percent=99.0,
        mem_used_bytes=5862588416,
        mem_total_bytes=6425673728,
        power_w=128.0,
        temperature_c=71.0,
        index=0,
        source="rocm-smi",
        processes=((48330, 5593141248), (48412, 12582912)),
        devices=1,
    )
    d = s.as_dict()
    assert d["util"] == 99.0 and d["mem_total"] == 6425673728 and d["power_w"] == 128.0
    assert d["processes"][0] == {"pid": 48330, "mem_used": 5593141248}


@pytest.mark.timeout(10)
def test_rocm_smi_6_key_names_parse():
    s = parse_rocm_smi(read("rocm-smi_rocm-6.4_gfx1151.json"))
    assert s is not None
    assert s.power_w == pytest.approx(4.041)  # "Current Socket Graphics Package Power"
    assert s.util_percent == 0.0 and s.temperature_c == 27.0
    assert s.mem_total_bytes == 51539607552 and s.mem_used_bytes == 163110912
    assert s.name == "0x1586"  # "Device Name"/"Card Series" are N/A
    assert s.processes == ()


@pytest.mark.timeout(10)
def test_rocm_smi_warning_prefix_second_card_and_missing_values():
    text = read("rocm-smi_rocm-6.2_2cards_warning.txt")
    card0 = parse_rocm_smi(text, 0)
    card1 = parse_rocm_smi(text, 1)
    assert card0.power_w is None and card0.devices == 2  # "N/A"
    assert card1.util_percent == 100.0 and card1.power_w == 301.0
    assert card1.mem_used_bytes == 22662692864 and card1.processes == ((7001, 22548578304),)
    assert parse_rocm_smi(text, 2) is None
    assert parse_rocm_smi("") is None and parse_rocm_smi("{not json") is None
    assert parse_rocm_smi('["card0"]') is None


@pytest.mark.timeout(10)
def test_rocm_smi_probe_runs_the_tool_and_reports_a_missing_one():
    calls = []

    def run(argv):
        calls.append(list(argv))
        return read("rocm-smi_1.4.1_rocm-5.7_rx5600xt.json")

    probe = RocmSmiProbe(exe="/opt/rocm/bin/rocm-smi", run=run)
    assert probe.available()[0] is True
    assert probe.sample().util_percent == 99.0
    assert calls[0][0] == "/opt/rocm/bin/rocm-smi" and "--json" in calls[0] and "vram" in calls[0]

    def broken(argv):
        raise OSError("Exec format error")

    assert RocmSmiProbe(exe="/x/rocm-smi", run=broken).available() == (
        False,
        "rocm-smi (/x/rocm-smi) reports no card 0",
    )
    missing = RocmSmiProbe(exe=None)
    missing.exe = None
    assert missing.available() == (False, "no rocm-smi on PATH") and missing.sample() is None


# ---------------------------------------------------------------------------- NVML (fake module)


class FakeNVMLError(Exception):
    pass


def fake_nvml(*, init_error: str | None = None, power_error: bool = False):
    handle = object()

    def init():
        if init_error:
            raise FakeNVMLError(init_error)

    def power(h):
        if power_error:
            raise FakeNVMLError("Not Supported")
        return 61_500  # mW

    return types.SimpleNamespace(
        NVMLError=FakeNVMLError,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=init,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: handle,
        nvmlDeviceGetName=lambda h: b"NVIDIA GeForce RTX 3060",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=97, memory=40),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=9 * GiB, total=12 * GiB, free=3 * GiB),
        nvmlDeviceGetPowerUsage=power,
        nvmlDeviceGetTemperature=lambda h, sensor: 66,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [
            types.SimpleNamespace(pid=4242, usedGpuMemory=8 * GiB),
            types.SimpleNamespace(pid=4243, usedGpuMemory=None),
        ],  # NVML_VALUE_NOT_AVAILABLE
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [],
    )


@pytest.mark.timeout(10)
def test_nvml_probe_reads_a_device():
    probe = NvmlProbe(nvml=fake_nvml())
    assert probe.available() == (True, "NVML: 1 GPU(s)")
    s = probe.sample()
    assert s == GpuSample(
        name="NVIDIA GeForce RTX 3060",
        util_percent=97.0,
        mem_used_bytes=9 * GiB,
        mem_total_bytes=12 * GiB,
        power_w=61.5,
        temperature_c=66.0,
        index=0,
        source="nvml",
        processes=((4242, 8 * GiB), (4243, None)),
        devices=1,
    )


@pytest.mark.timeout(10)
def test_nvml_errors_become_missing_values_or_unavailable():
    assert NvmlProbe(nvml=fake_nvml(power_error=True)).sample().power_w is None
    probe = NvmlProbe(nvml=fake_nvml(init_error="Driver Not Loaded"))
    ok, why = probe.available()
    assert not ok and why == "no NVIDIA driver (NVML: FakeNVMLError: Driver Not Loaded)"
    assert probe.sample() is None
    assert NvmlProbe(index=3, nvml=fake_nvml()).available() == (
        False,
        "NVML sees 1 GPU(s), none with index 3",
    )


@pytest.mark.timeout(10)
def test_amdsmi_probe_with_a_fake_module():
    h = object()
    mod = types.SimpleNamespace(
        amdsmi_init=lambda: None,
        amdsmi_get_processor_handles=lambda: [h],
        amdsmi_get_gpu_asic_info=lambda d: {"market_name": "AMD Radeon RX 7900 XTX"},
        amdsmi_get_gpu_activity=lambda d: {"gfx_activity": 100, "umc_activity": 35, "mm_activity": "N/A"},
        amdsmi_get_gpu_vram_usage=lambda d: {"vram_total": 24560, "vram_used": 20000},
        amdsmi_get_power_info=lambda d: {"current_socket_power": "N/A", "average_socket_power": 290},
        amdsmi_get_temp_metric=lambda d, t, m: 71,
        AmdSmiTemperatureType=types.SimpleNamespace(EDGE=0),
        AmdSmiTemperatureMetric=types.SimpleNamespace(CURRENT=0),
        amdsmi_get_gpu_process_list=lambda d: [{"pid": 77, "memory_usage": {"vram_mem": 123}}],
    )
    s = AmdSmiProbe(amdsmi=mod).sample()
    assert s.name == "AMD Radeon RX 7900 XTX" and s.util_percent == 100.0
    assert s.mem_total_bytes == 24560 << 20 and s.mem_used_bytes == 20000 << 20
    assert s.power_w == 290.0 and s.temperature_c == 71.0 and s.processes == ((77, 123),)


# ---------------------------------------------------------------------------- this machine


@pytest.mark.timeout(30)
def test_no_gpu_here_is_answered_cleanly():
    """Real pynvml, no driver: unavailable with the reason; detect says what it tried."""
    real = NvmlProbe()
    ok, why = real.available()
    probe = detect_gpu_probe()
    if ok:  # a GPU box after all
        assert isinstance(probe, NvmlProbe) and isinstance(probe.sample(), GpuSample)
        return
    assert "NVML" in why or "nvidia-ml-py" in why
    assert real.sample() is None
    if isinstance(probe, NoGpuProbe):
        ok, reason = probe.available()
        assert not ok and probe.sample() is None
        assert "NVML" in reason and "rocm-smi" in reason and "amdsmi" in reason


# ---------------------------------------------------------------------------- process tree


@pytest.mark.timeout(10)
def test_role_heuristic():
    trainer = ["/v/bin/python", "train.py", "--epochs", "3"]
    spawn = [
        "/v/bin/python",
        "-c",
        "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=6, pipe_handle=8)",
        "--multiprocessing-fork",
    ]
    tracker = ["/v/bin/python", "-c", "from multiprocessing.resource_tracker import main;main(5)"]
    forkserver = [
        "/v/bin/python",
        "-c",
        "from multiprocessing.forkserver import main; main(7, 8, ['__main__'])",
    ]
    assert classify_role(10, 10, trainer, []) == "main"
    assert classify_role(11, 10, trainer, trainer) == "worker"  # fork: a copy
    assert classify_role(12, 10, spawn, trainer) == "worker"
    assert classify_role(13, 10, tracker, trainer) == "child"
    assert classify_role(14, 10, forkserver, trainer) == "child"
    assert classify_role(15, 14, forkserver, forkserver) == "worker"  # forked by the forkserver
    assert classify_role(16, 10, ["git", "rev-parse", "HEAD"], trainer) == "child"


@pytest.mark.timeout(90)
@pytest.mark.e2e
def test_process_tree_sees_real_spawned_dataloader_workers():
    proc = hangs.start_script(
        hangs.TRAIN_LOOP, "--mp-context", "spawn", "--epochs", "1", "--batches", "8", "--hang-at", "1:3"
    )
    try:
        hangs.wait_for_line(proc, r"batch=2/8", timeout=80)
        sampler = TreeSampler()
        first = sampler.sample(proc.pid)
        time.sleep(0.3)
        second = sampler.sample(proc.pid)
        roles = {s.pid: s.role for s in second}
        assert roles[proc.pid] == "main"
        workers = [s for s in second if s.role == "worker"]
        assert len(workers) == 2 and all(s.ppid == proc.pid for s in workers)
        assert all("spawn_main" in s.cmdline for s in workers)
        assert any("resource_tracker" in s.cmdline and s.role == "child" for s in second)
        assert all(s.cpu_percent is None for s in first)  # nothing to compare with yet
        assert all(isinstance(s.cpu_percent, float) for s in second)
        main = next(s for s in second if s.role == "main")
        assert main.status == "sleeping" and main.rss_bytes > 10 << 20 and main.num_threads >= 1
        assert set(main.as_dict()) == {
            "pid",
            "ppid",
            "role",
            "name",
            "status",
            "cpu_percent",
            "rss_bytes",
            "num_threads",
            "wchan",
        }
        assert sampler.worker_pids() == frozenset(s.pid for s in workers)
        assert {s.pid for s in process_tree(proc.pid)} == {s.pid for s in second}
    finally:
        hangs.kill_group(proc)
    assert process_tree(proc.pid) == ()
