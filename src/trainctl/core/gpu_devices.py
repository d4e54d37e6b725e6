"""Which GPUs are a run's, and what on them is the run's own work.  Pure: a reading of the
devices (:class:`trainctl.system.gpu.GpuReading`'s devices, seen through
:class:`DeviceView`), the run's pids and their environments are arguments.

The run's devices, by the first rule that finds any:

* ``pids``: the devices whose process list holds a pid of the run's tree (every rank's
  under torchrun);
* ``visible-devices``: where the driver lists no pid of the tree (a container: NVML lists
  the host's pids), the devices each trainer process may use by its
  ``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES`` / ``ROCR_VISIBLE_DEVICES``
  (indices, or NVML UUIDs);
* ``all``: every device, when no process of the tree restricts itself.

The run's activity on them (:func:`run_activity`): the run's processes' own utilisation
where the driver gives it per process; a device's utilisation only where the run has the
device to itself (its pids and no other's listed); never another process's work, nor a
figure no one can attribute (a container's host pids).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

#: the environment variables that restrict a process's GPUs, in the order they are read
VISIBLE_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


class DeviceView(Protocol):
    """What the rules read of one device (:class:`trainctl.system.gpu.GpuSample`)."""

    @property
    def index(self) -> int: ...

    @property
    def uuid(self) -> str | None: ...

    @property
    def util_percent(self) -> float | None: ...

    @property
    def mem_used_bytes(self) -> int | None: ...

    @property
    def processes(self) -> tuple[tuple[int, int | None], ...]: ...

    @property
    def process_util(self) -> tuple[tuple[int, float], ...] | None: ...


@dataclass(frozen=True)
class RunDevices:
    """The run's devices and the rule that chose them (``pids``, ``visible-devices``,
    ``all``, or ``none``: no device read)."""

    indices: tuple[int, ...]
    rule: str
    why: str


def visible_devices(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    """The devices a process may use by its environment (indices or UUIDs, as written);
    None when no variable restricts it; () when one hides every device ("", "-1")."""
    for var in VISIBLE_VARS:
        value = environ.get(var)
        if value is None:
            continue
        out: list[str] = []
        for item in value.split(","):
            item = item.strip()
            if not item or item.startswith("-"):  # CUDA stops at the first invalid entry
                break
            out.append(item)
        return tuple(out)
    return None


def _matches(device: DeviceView, names: Iterable[str]) -> bool:
    for name in names:
        if name.isdigit() and int(name) == device.index:
            return True
        if device.uuid and not name.isdigit() and device.uuid.startswith(name):
            return True
    return False


def choose(
    devices: Sequence[DeviceView],
    tree_pids: Iterable[int],
    environs: Mapping[int, Mapping[str, str]],
    unplaced: Iterable[int] = (),
) -> RunDevices:
    """The run's devices by the first rule that finds any (module docstring).
    ``environs``: the trainer processes' environments (pid -> environ; unreadable ones
    left out); ``unplaced``: pids the tool lists without a device (rocm-smi)."""
    if not devices:
        return RunDevices((), "none", "no GPU read")
    tree = set(tree_pids)
    held = tuple(d.index for d in devices if any(pid in tree for pid, _ in d.processes))
    if held:
        pids = sorted({pid for d in devices for pid, _ in d.processes if pid in tree})
        return RunDevices(held, "pids", f"the driver lists the run's pid(s) {', '.join(map(str, pids))}")
    listed_elsewhere = bool(tree & set(unplaced))
    chosen: set[int] = set()
    restricted = False
    for pid in sorted(environs):
        names = visible_devices(environs[pid])
        if names is None:
            continue
        restricted = True
        chosen.update(d.index for d in devices if _matches(d, names))
    if restricted:
        return RunDevices(
            tuple(sorted(chosen)),
            "visible-devices",
            "no device lists a pid of the run"
            + (" (rocm-smi does not say which)" if listed_elsewhere else "")
            + "; the trainer's visible-devices variables",
        )
    return RunDevices(
        tuple(d.index for d in devices),
        "all",
        "no device lists a pid of the run and no visible-devices variable restricts it",
    )


def run_activity(
    devices: Sequence[DeviceView],
    run: RunDevices,
    tree_pids: Iterable[int],
    unplaced: Iterable[int] = (),
) -> tuple[float | None, str]:
    """(the run's own GPU utilisation, %, the highest of its devices'; how it was read).
    A device's own figure counts only where the run has the device to itself: its process
    list holds the run's pids and no other's, or (rocm-smi, processes without their card)
    it is the only device and every process the tool lists is the run's.  None when no
    figure is the run's own: another process's work, a device shared without per-process
    figures, a container whose driver lists the host's pids."""
    tree = set(tree_pids)
    others = set(unplaced) - tree
    alone_unplaced = len(devices) == 1 and bool(set(unplaced)) and not others
    best: float | None = None
    how: list[str] = []
    for d in devices:
        if d.index not in run.indices:
            continue
        value: float | None
        listed = {pid for pid, _ in d.processes}
        if d.process_util is not None and listed & tree:
            value = sum((u for pid, u in d.process_util if pid in tree), 0.0)
            how.append(f"GPU {d.index}: the run's processes' own")
        elif (listed and listed <= tree) or (not listed and alone_unplaced):
            value = d.util_percent
            how.append(f"GPU {d.index}: the device's (the run's alone)")
        else:
            value = None
            how.append(f"GPU {d.index}: not known to be the run's alone: not counted")
        if value is not None:
            best = value if best is None else max(best, value)
    return best, "; ".join(how)


def used_bytes(devices: Sequence[DeviceView], indices: Iterable[int]) -> dict[int, int]:
    """Each device's used memory (those that say): the baseline before an attempt."""
    want = set(indices)
    out: dict[int, int] = {}
    for d in devices:
        if d.index in want and d.mem_used_bytes is not None:
            out[d.index] = d.mem_used_bytes
    return out
