"""Issue 43, end to end with a fake NVML (tests/helpers/fake_nvml/pynvml.py, first on the
agent's PYTHONPATH, read by the agent's real NvmlProbe): the run's device is the one whose
process list holds the trainer's pid, not GPU 0; another process busy on the run's own
device does not hide a hang; two "ranks" on two devices each get the memory wait; a
container whose driver lists the host's pids falls back to the trainer's
CUDA_VISIBLE_DEVICES.  The trainers are plain Python (tests/helpers/scripts/gpu_cases.py)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.e2e.conftest import PYTHON, run_trainctl
from tests.helpers.hangs import SCRIPTS

pytestmark = pytest.mark.e2e
CASES = SCRIPTS / "gpu_cases.py"
FAKE_NVML = Path(__file__).resolve().parents[1] / "helpers" / "fake_nvml"
GiB = 1 << 30


def scene(tmp_path: Path, **over) -> dict[str, str]:
    """Four GPUs; another user's process busy on GPU 0; the env that points the agent at it."""
    data = {
        "devices": [
            {"name": f"NVIDIA A100-SXM4-80GB #{i}", "util": 100 if i == 0 else 0, "mem_total": 80 * GiB}
            for i in range(4)
        ],
        "others": [{"pid": 999_991, "device": 0, "mem": 30 * GiB, "sm": 100}],
        "tree_mem": 2 * GiB,
        "tree_sm": 0,
        "per_process": True,
        "host_pids": False,
        "release_s": 0,
        **over,
    }
    path = tmp_path / "nvml_scene.json"
    path.write_text(json.dumps(data))
    pythonpath = os.pathsep.join(p for p in (str(FAKE_NVML), os.environ.get("PYTHONPATH")) if p)
    return {"TRAINCTL_TEST_NVML_SCENE": str(path), "PYTHONPATH": pythonpath}


def gpu_infos(result) -> list[str]:
    return [e.text for e in result.of_type("info") if e.key == "gpu_devices"]


@pytest.mark.timeout(60)
def test_the_runs_device_is_the_one_listing_its_pid_not_gpu_0(tmp_path):
    r = run_trainctl(
        ["run", "--json", "--", PYTHON, str(CASES), "on-gpu", "2", "train", "25"],
        timeout=50,
        env=scene(tmp_path),
    )
    assert r.returncode == 0, r.describe()
    said = gpu_infos(r)
    assert said, r.describe()
    assert said[-1].startswith("the run's GPUs: 2 (by pids: the driver lists the run's pid(s) "), said
    # before its first reading with the pid (the trainer's exec), at most every device
    by_pids = [s for s in said if "(by pids:" in s]
    assert by_pids and all(s.startswith("the run's GPUs: 2 (") for s in by_pids), said


@pytest.mark.timeout(60)
def test_another_process_busy_on_the_runs_device_does_not_hide_a_startup_deadlock(tmp_path):
    """GPU 2 at 100% from another user's process: the trainer's own SM share is 0, so the
    still-tree watch sees a still tree and says the deadlock within its 5 s window."""
    env = scene(
        tmp_path,
        devices=[{"name": "NVIDIA A100", "util": 100, "mem_total": 80 * GiB} for _ in range(3)],
        others=[{"pid": 999_992, "device": 2, "mem": 30 * GiB, "sm": 100}],
    )
    r = run_trainctl(
        ["run", "--json", "--max-restarts", "0", "--startup-idle", "5", "--", PYTHON, str(CASES)]
        + ["on-gpu", "2", "deadlock"],
        timeout=50,
        env=env,
    )
    assert r.returncode == 1, r.describe()
    stall = r.of_type("stall")
    assert len(stall) == 1 and stall[0].phase == "startup", r.describe()
    assert "deadlock before the first batch" in stall[0].detail, stall[0].detail
    late = stall[0].ts - float((r.run_dir / "hang_at").read_text())
    assert late < 5.0 + 8.0, late  # the window, a GPU reading's 2 s and the diagnosis
    verdict = r.of_type("stall_diagnosis")[0]
    assert "GPU reports" not in verdict.detail, verdict.detail  # the other's work is not the run's


@pytest.mark.timeout(90)
def test_two_ranks_on_two_devices_the_memory_wait_covers_both(tmp_path):
    """Two processes on GPUs 1 and 2 stall; killed, the fake driver lists their memory for
    3 s more: the restart waits for both devices, then the second attempt finishes."""
    r = run_trainctl(
        ["run", "--json", "--max-restarts", "1", "--stall-timeout", "4", "--", PYTHON, str(CASES), "ranks"],
        timeout=80,
        env=scene(tmp_path, release_s=3),
    )
    assert r.returncode == 0, r.describe()
    assert len(r.of_type("stall")) == 1 and len(r.of_type("start")) == 2, r.describe()
    assert any(s.startswith("the run's GPUs: 1, 2 (by pids:") for s in gpu_infos(r)), gpu_infos(r)
    waits = [e.text for e in r.of_type("info") if e.key == "gpu_release"]
    assert len(waits) == 1, waits
    m = re.fullmatch(r"waited (\d+) s for GPU memory on GPU 1, 2 \(released\)", waits[0])
    assert m and 2 <= int(m.group(1)) <= 8, waits  # the 3 s of the fake, polled every 2 s


@pytest.mark.timeout(60)
def test_a_container_without_pids_takes_the_trainers_visible_devices(tmp_path):
    r = run_trainctl(
        ["run", "--json", "--", PYTHON, str(CASES), "on-gpu", "1", "--visible", "train", "25"],
        timeout=50,
        env=scene(tmp_path, host_pids=True),
    )
    assert r.returncode == 0, r.describe()
    said = gpu_infos(r)
    assert said and said[-1].startswith("the run's GPUs: 1 (by visible-devices: no device lists a pid"), said
