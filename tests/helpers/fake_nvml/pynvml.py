"""A fake ``pynvml`` (nvidia-ml-py's module) for the e2e tests of the run's own GPUs: put
this folder first on the agent's PYTHONPATH and the agent's real NvmlProbe reads it.

The scene is the JSON file named by ``TRAINCTL_TEST_NVML_SCENE``, read again at every call
(a test may change it while the run goes on)::

    {"devices": [{"name": "...", "util": 100, "mem_total": N, "mem_used": N}, ...],
     "others": [{"pid": P, "device": 0, "mem": N, "sm": 100}],  # another user's processes
     "tree_mem": N,           # what each of the run's GPU processes holds
     "tree_sm": 0,            # their own SM %
     "per_process": true,     # nvmlDeviceGetProcessUtilization answers (else NotSupported)
     "host_pids": false,      # a container: the run's processes are listed under other pids
     "release_s": 0}          # a run's process that ended is still listed this long

A process is the run's on device D when its environment has ``TRAINCTL_TEST_GPU=D`` (and
this scene's path: another test's runs are not this one's) and its parent's has not the same (a DataLoader worker inherits it and is not on the GPU).
Processes that ended are remembered in ``<scene>.state`` for ``release_s``."""

from __future__ import annotations

import json
import os
import time
import types

NVML_TEMPERATURE_GPU = 0


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_NotFound(NVMLError):
    pass


def _scene() -> dict:
    with open(os.environ["TRAINCTL_TEST_NVML_SCENE"]) as f:
        return json.load(f)


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _tree_on_gpus() -> dict[int, int]:
    """pid -> device of each live process of a run on the fake GPUs, and of each that
    ended less than ``release_s`` ago (remembered in the state file)."""
    scene = _scene()
    mine = os.environ["TRAINCTL_TEST_NVML_SCENE"]
    live: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        env = _environ(pid)
        want = env.get("TRAINCTL_TEST_GPU")
        if want is None or not want.isdigit() or env.get("TRAINCTL_TEST_NVML_SCENE") != mine:
            continue  # not a process of this test's run (another test's, in parallel)
        parent = _ppid(pid)
        if parent is not None and _environ(parent).get("TRAINCTL_TEST_GPU") == want:
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # a zombie holds no device memory, but is not yet released
        except OSError:
            continue
        live[pid] = int(want)
    path = os.environ["TRAINCTL_TEST_NVML_SCENE"] + ".state"
    try:
        with open(path) as f:
            state = {int(k): v for k, v in json.load(f).items()}
    except (OSError, ValueError):
        state = {}
    now = time.time()
    for pid, device in live.items():
        state[pid] = {"device": device, "gone": None}
    for pid, seen in list(state.items()):
        if pid in live:
            continue
        if seen["gone"] is None:
            seen["gone"] = now
        if now - seen["gone"] >= float(scene.get("release_s", 0)):
            del state[pid]
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, path)
    return {pid: seen["device"] for pid, seen in state.items()}


def nvmlInit() -> None:
    _scene()


def nvmlDeviceGetCount() -> int:
    return len(_scene()["devices"])


def nvmlDeviceGetHandleByIndex(index: int):
    if index >= nvmlDeviceGetCount():
        raise NVMLError("Invalid Argument")
    return index


def nvmlDeviceGetName(h):
    return _scene()["devices"][h]["name"]


def nvmlDeviceGetUUID(h):
    return _scene()["devices"][h].get("uuid", f"GPU-fake-{h}")


def nvmlDeviceGetUtilizationRates(h):
    return types.SimpleNamespace(gpu=_scene()["devices"][h].get("util", 0), memory=0)


def _processes(h) -> list[tuple[int, int, float]]:
    """(pid as the driver lists it, memory, SM %) of every process on device ``h``."""
    scene = _scene()
    out = [(o["pid"], o.get("mem", 0), o.get("sm", 0)) for o in scene.get("others", ()) if o["device"] == h]
    for pid, device in _tree_on_gpus().items():
        if device == h:
            shown = pid + 4_000_000 if scene.get("host_pids") else pid  # a container: the host's pid
            out.append((shown, scene.get("tree_mem", 1 << 30), scene.get("tree_sm", 0)))
    return out


def nvmlDeviceGetMemoryInfo(h):
    d = _scene()["devices"][h]
    used = d.get("mem_used", 0) + sum(mem for _, mem, _ in _processes(h))
    return types.SimpleNamespace(used=used, total=d.get("mem_total", 16 << 30), free=0)


def nvmlDeviceGetPowerUsage(h):
    return 60_000


def nvmlDeviceGetTemperature(h, sensor):
    return 50


def nvmlDeviceGetComputeRunningProcesses(h):
    return [types.SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem, _ in _processes(h)]


def nvmlDeviceGetGraphicsRunningProcesses(h):
    return []


def nvmlDeviceGetProcessUtilization(h, since):
    if not _scene().get("per_process", True):
        raise NVMLError_NotSupported("Not Supported")
    now = int(time.time() * 1e6)
    found = [
        types.SimpleNamespace(pid=pid, timeStamp=now, smUtil=sm, memUtil=0, encUtil=0, decUtil=0)
        for pid, _, sm in _processes(h)
    ]
    if not found:
        raise NVMLError_NotFound("Not Found")
    return found
