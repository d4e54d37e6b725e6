"""Issue 43: the GPU parsers and the run's-device rules on real outputs recorded from public
issue threads (tests/data/gpu/recorded/, each file named after its thread; README there):
rocm-smi's --showpids table (ROCm 5.x/6.x, "UNKNOWN" values, a pid per card), its JSON,
amd-smi's process list, and nvidia-smi's tables turned into the NVML module they came from
(a host, a container that lists no pid, two GPUs, MIG instances)."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest

from trainctl.core import gpu_devices, gpu_release
from trainctl.system.gpu import (
    GpuSample,
    amdsmi_processes,
    nvml_sample,
    parse_rocm_smi_pids_text,
    parse_rocm_smi_reading,
)

RECORDED = Path(__file__).resolve().parent.parent / "data" / "gpu" / "recorded"
MiB, GiB = 1 << 20, 1 << 30
pytestmark = pytest.mark.timeout(10)


def read(name: str) -> str:
    return (RECORDED / name).read_text(encoding="utf-8")


# ---------------------------------------------------------------------------- rocm-smi


def test_rocm_smi_showpids_table_lists_every_process_and_its_vram():
    pids = parse_rocm_smi_pids_text(read("rocm-smi_showpids_roc-smi-60.txt"))
    assert len(pids) == 8
    assert dict(pids)[1168514] == 177386942464  # pt_main_thread, the one on a GPU
    assert dict(pids)[3722222] == 0


def test_rocm_smi_showpids_unknown_values_are_none_and_held():
    """ROCm 5.7: a process that cannot see every GPU has UNKNOWN figures (rocm_smi_lib#166)."""
    pids = parse_rocm_smi_pids_text(read("rocm-smi_showpids_unknown_rocm_smi_lib-166.txt"))
    assert pids == ((55571, None), (55572, None), (55573, None), (55574, None))
    # killed and still listed without a figure: the memory wait holds ("an unknown amount")
    held = gpu_release.held_by_device((), pids, (), (55571,), {})
    assert held == {gpu_release.UNPLACED: None}
    assert gpu_release.may_start_all(held, 4.0) == (False, "unplaced an unknown amount still held")


def test_rocm_smi_showpids_details_a_pid_on_two_cards_is_summed_and_tabs_parse():
    assert parse_rocm_smi_pids_text(read("rocm-smi_showpids_details_rocm-systems-4405.txt")) == (
        (132174, 15053770752 + 16869904384),
    )
    assert parse_rocm_smi_pids_text(read("rocm-smi_showpids_mi300a_legacy-rocm-build-4411.txt")) == (
        (1684258, 0),
    )


def test_rocm_smi_product_name_json_of_an_mi200():
    reading = parse_rocm_smi_reading(read("rocm-smi_productname_mi200_rocm_smi_lib-159.json"))
    assert reading is not None and reading.unplaced == ()
    (card,) = reading.devices
    assert card.name == "AMD INSTINCT MI200 (MCM) OAM LC MBA HPE C2" and card.index == 0
    assert card.util_percent is None and card.mem_used_bytes is None  # not asked in that call


def test_rocm_smi_pids_without_their_card_choose_by_the_trainers_visible_devices():
    """rocm-smi says how many GPUs a process uses, not which: the HIP_VISIBLE_DEVICES rule."""
    reading = parse_rocm_smi_reading(
        '{"card0": {"GPU use (%)": "0"}, "card1": {"GPU use (%)": "99"}, '
        '"system": {"PID1168514": "pt_main_thread, 1, 177386942464, 0, 4"}}'
    )
    assert reading is not None and reading.unplaced == ((1168514, 177386942464),)
    run = gpu_devices.choose(reading.devices, (1168514,), {1168514: {"HIP_VISIBLE_DEVICES": "1"}}, (1168514,))
    assert run.indices == (1,) and run.rule == "visible-devices"
    assert "rocm-smi does not say which" in run.why
    # two cards and rocm-smi does not say which: card 1's 99% is not known to be the run's
    assert gpu_devices.run_activity(reading.devices, run, (1168514,), (1168514,))[0] is None
    # the seeds' box, one card: every listed process is the run's, the card's figure counts
    one = parse_rocm_smi_reading(read("../rocm-smi_1.4.1_rocm-5.7_rx5600xt.json"))
    assert one is not None and len(one.devices) == 1
    tree = tuple(pid for pid, _ in one.unplaced)
    alone = gpu_devices.choose(one.devices, tree, {}, tree)
    assert gpu_devices.run_activity(one.devices, alone, tree, tree)[0] == 99.0
    assert gpu_devices.run_activity(one.devices, alone, tree[:1], tree)[0] is None  # another's there


# ---------------------------------------------------------------------------- amd-smi


def test_amd_smi_process_list_values_with_units_parse():
    """amd-smi process --json (rocm-systems#6396): figures as {"value", "unit"}."""
    (entry,) = json.loads(read("amd-smi_process_by_pid_rocm-systems-6396.json"))
    per_gpu = [{"pid": entry["pid"], **g} for g in entry["gpus"]]
    assert amdsmi_processes(per_gpu) == ((2168274, 48000, 0), (2168274, 65588000, None))


# ---------------------------------------------------------------------------- nvidia-smi / NVML

_DEVICE = re.compile(r"^\|\s+(\d+)\s+(.+?)\s{2,}(?:On|Off)\s+\|")
_FIGURES = re.compile(r"(\d+)W / \d+W \|\s+(\d+)MiB /\s*(\d+)MiB \|\s+(\d+)%")
_PROCESS = re.compile(r"^\|\s+(\d+)\s+(?:\S+\s+\S+\s+)?(\d+)\s+[CG]\s+\S+\s+(\d+)MiB \|")


def nvml_from_nvidia_smi(text: str, fallback_devices: int = 1):
    """The NVML module that nvidia-smi read its table from: each device row, each
    process row (``GPU [GI CI] PID Type name MiB``)."""
    devices: list[dict] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if m := _DEVICE.match(line):
            f = _FIGURES.search(lines[i + 1])
            assert f, lines[i + 1]
            devices.append(
                {"name": m.group(2).strip(), "power": int(f.group(1)), "used": int(f.group(2)) * MiB}
                | {"total": int(f.group(3)) * MiB, "util": int(f.group(4))}
            )
    procs = [
        (int(m.group(1)), int(m.group(2)), int(m.group(3)) * MiB) for ln in lines if (m := _PROCESS.match(ln))
    ]
    if not devices:
        devices = [
            {"name": None, "power": None, "used": None, "total": None, "util": None}
        ] * fallback_devices
    ns = types.SimpleNamespace
    return ns(
        NVML_TEMPERATURE_GPU=0,
        nvmlDeviceGetCount=lambda: len(devices),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: devices[h]["name"],
        nvmlDeviceGetUtilizationRates=lambda h: ns(gpu=devices[h]["util"]),
        nvmlDeviceGetMemoryInfo=lambda h: ns(used=devices[h]["used"], total=devices[h]["total"]),
        nvmlDeviceGetPowerUsage=lambda h: None if devices[h]["power"] is None else devices[h]["power"] * 1000,
        nvmlDeviceGetTemperature=lambda h, s: None,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [
            ns(pid=pid, usedGpuMemory=mem) for gpu, pid, mem in procs if gpu == h
        ],
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [],
    )


def test_nvidia_smi_host_lists_the_pid_and_the_container_lists_none():
    text = read("nvidia-smi_host_and_container_nvidia-docker-179.txt")
    container, host = text.split("# on the host:")
    s = nvml_sample(nvml_from_nvidia_smi(host), 0)
    assert s.processes == ((28290, 1012 * MiB),)
    assert gpu_devices.choose((s,), (28290,), {}).rule == "pids"
    c = nvml_sample(nvml_from_nvidia_smi(container), 0)
    assert c.processes == ()
    run = gpu_devices.choose((c,), (4242,), {4242: {"CUDA_VISIBLE_DEVICES": "0"}})
    assert (run.indices, run.rule) == ((0,), "visible-devices")


def test_two_busy_gpus_without_processes_every_device_and_no_activity_of_another():
    """Two Tesla M40 at 78% with no process list (nvidia-docker#759): no pid, no variable:
    every device is the run's; whose 78% it is no one can say: not the run's activity."""
    nvml = nvml_from_nvidia_smi(read("nvidia-smi_2gpus_no_processes_nvidia-docker-759.txt"))
    devices = tuple(nvml_sample(nvml, i) for i in range(2))
    assert [d.name for d in devices] == ["Tesla M40 24GB"] * 2
    assert [d.mem_used_bytes for d in devices] == [814 * MiB, 558 * MiB] and devices[0].power_w == 113.0
    run = gpu_devices.choose(devices, (4242,), {4242: {}})
    assert (run.indices, run.rule) == ((0, 1), "all")
    assert gpu_devices.run_activity(devices, run, (4242,))[0] is None
    # the run's pid listed alone: the device's figure is the run's; with another's: not
    mine = GpuSample("M40", 78.0, None, None, None, None, index=0, processes=((4242, GiB),))
    assert gpu_devices.run_activity((mine,), run, (4242,))[0] == 78.0
    shared = GpuSample("M40", 78.0, None, None, None, None, index=0, processes=((4242, GiB), (9999, GiB)))
    assert gpu_devices.run_activity((shared,), run, (4242,))[0] is None


def test_mig_instances_named_by_uuid_in_cuda_visible_devices():
    """Three MIG instances of GPU 1 (nvitop#8's table), as NVML shows them to a process
    that sees them; the trainer's CUDA_VISIBLE_DEVICES names one by its MIG UUID."""
    rows = re.findall(
        r"\|\s+1\s+(\d+)\s+0\s+(\d)\s+\|\s+(\d+)MiB / (\d+)MiB", read("nvidia-smi_mig_devices_nvitop-8.txt")
    )
    assert len(rows) == 3
    devices = tuple(
        GpuSample(
            "A100 MIG 2g.20gb",
            None,
            int(used) * MiB,
            int(total) * MiB,
            None,
            None,
            index=int(dev),
            uuid=f"MIG-gi{gi}-1111-2222",
        )
        for gi, dev, used, total in rows
    )
    run = gpu_devices.choose(devices, (4242,), {4242: {"CUDA_VISIBLE_DEVICES": "MIG-gi5"}})
    assert (run.indices, run.rule) == ((1,), "visible-devices")
    # killed with no pid seen: the memory wait falls back to the device's used memory
    before = gpu_devices.used_bytes(devices, (1,))
    assert before == {1: 9880 * MiB}
    held = gpu_release.held_by_device(devices, (), (1,), (4242,), {1: 13 * MiB}, by_pids=False)
    assert held == {1: (9880 - 13) * MiB}


def test_rocm_smi_probe_reads_every_card_and_falls_back_to_the_text_table():
    """One JSON call per reading; where that JSON has no process section, the recorded
    text table of --showpids gives the processes."""
    from trainctl.system.gpu import RocmSmiProbe

    calls: list[list[str]] = []
    json_text = read("rocm-smi_productname_mi200_rocm_smi_lib-159.json")
    table = read("rocm-smi_showpids_roc-smi-60.txt")

    def run(argv):
        calls.append(list(argv))
        return json_text if "--json" in argv else table

    probe = RocmSmiProbe(exe="/opt/rocm/bin/rocm-smi", run=run)
    assert probe.available() == (True, "rocm-smi at /opt/rocm/bin/rocm-smi")
    calls.clear()
    reading = probe.read()
    assert reading is not None and [d.index for d in reading.devices] == [0]
    assert dict(reading.unplaced)[1168514] == 177386942464
    assert [c[1:] for c in calls] == [list(calls[0][1:]), ["--showpids"]] and "--json" in calls[0]
