"""How one GPU of a run reads in a line: the dashboard's device rows and `trainctl status`'s.
Pure: a device's dict (:meth:`trainctl.system.gpu.GpuSample.as_dict`) in, text out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GIB = float(1 << 30)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def gpu_row(device: Mapping[str, Any], wide: bool = True) -> str:
    """``NVIDIA A100 util 97% · mem 30.1/80.0 GiB · 66 °C · 250 W`` (what the driver gives;
    narrow: no temperature, the model cut to 18 characters)."""
    name = str(device.get("name") or "GPU")
    if not wide and len(name) > 18:
        name = name[:17] + "…"
    util = _num(device.get("util"))
    parts = [f"{name} util {'—' if util is None else f'{util:.0f}%'}"]
    used, total = _num(device.get("mem_used")), _num(device.get("mem_total"))
    if used is not None:
        parts.append(f"mem {used / GIB:.1f}/{'?' if total is None else f'{total / GIB:.1f}'} GiB")
    temp, power = _num(device.get("temperature_c")), _num(device.get("power_w"))
    if temp is not None and wide:
        parts.append(f"{temp:.0f} °C")
    if power is not None:
        parts.append(f"{power:.0f} W")
    return " · ".join(parts)
