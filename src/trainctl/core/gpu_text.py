"""How one GPU of a run reads in a line: the dashboard's device rows and `trainctl status`'s,
and the run's devices in a stall's verdict.  Pure: a device's dict
(:meth:`trainctl.system.gpu.GpuSample.as_dict`) in, text out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

GIB = float(1 << 30)
GPU_IDLE = 5.0  # % utilisation at or under which a device is idle


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def gpu_row(device: Mapping[str, Any], wide: bool = True, named: bool = True) -> str:
    """``NVIDIA A100 util 97% · mem 30.1/80.0 GiB · 66 °C · 250 W`` (what the driver gives).
    ``named=False``: without the model (the dashboard says it once above the rows);
    narrow: ``97% · 30.1/80.0 GiB · 250 W`` (no labels, no temperature), for a 36-column
    panel."""
    util = _num(device.get("util"))
    shown = "—" if util is None else f"{util:.0f}%"
    parts = [f"util {shown}" if wide else shown]
    used, total = _num(device.get("mem_used")), _num(device.get("mem_total"))
    if used is not None:
        mem = f"{used / GIB:.1f}/{'?' if total is None else f'{total / GIB:.1f}'} GiB"
        parts.append(f"mem {mem}" if wide else mem)
    temp, power = _num(device.get("temperature_c")), _num(device.get("power_w"))
    if temp is not None and wide:
        parts.append(f"{temp:.0f} °C")
    if power is not None:
        parts.append(f"{power:.0f} W")
    row = " · ".join(parts)
    return f"{device.get('name') or 'GPU'} {row}" if named else row


def gpu_model_line(devices: Sequence[Mapping[str, Any]]) -> str:
    """The run's devices' model once: ``2× NVIDIA A100-SXM4-80GB`` (several models: each)."""
    names = [str(d.get("name") or "GPU") for d in devices]
    if len(set(names)) == 1:
        return names[0] if len(names) == 1 else f"{len(names)}× {names[0]}"
    return ", ".join(dict.fromkeys(names))


def verdict_devices(devices: Sequence[Mapping[str, Any]], in_collective: bool) -> str:
    """The run's devices in a stall's verdict, from their readings (``index``, ``util``,
    ``power_w``): ``GPU 2 idle at 60 W (3% util) while the host waits in a collective.``;
    ``GPU 0 at 97% util, 250 W.``  ``in_collective``: the ranks wait in a collective.  ""
    when no device gave a utilisation or a power figure."""
    parts = []
    for d in devices:
        util, power = _num(d.get("util")), _num(d.get("power_w"))
        if util is None and power is None:
            continue
        label = f"GPU {d.get('index', '?')}"
        watts = f" at {power:.0f} W" if power is not None else ""
        if util is not None and util <= GPU_IDLE:
            parts.append(f"{label} idle{watts} ({util:.0f}% util)")
        elif util is not None:
            parts.append(f"{label} at {util:.0f}% util{watts and ',' + watts[3:]}")
        else:
            parts.append(f"{label}{watts}")
    if not parts:
        return ""
    tail = " while the host waits in a collective" if in_collective else ""
    return f"{'; '.join(parts)}{tail}."
