"""Whether the next attempt may start on a GPU box: the killed attempt's device memory must
be released first, or the restart dies of OOM (NVRx waits the same way: under 512 MB, polled
every 2 s, up to 50 s).  Pure: the GPU reading and the time are arguments.

Every device the killed attempt used is waited for (:func:`held_by_device`): on each, the
memory its killed processes still hold; where the driver listed no pid of the attempt (a
container, whose NVML lists the host's pids), the device's used memory above what it was
before the attempt started."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from trainctl.core.gpu_devices import DeviceView

RELEASED_BYTES = 512 * 1024**2  # what the killed attempt may still hold: the restart starts
POLL_S = 2.0
LIMIT_S = 50.0


def held_bytes(processes: Iterable[tuple[int, int | None]], killed: Iterable[int]) -> int | None:
    """GPU memory the killed processes still hold, from a sample's (pid, bytes) list; None
    when one of them is still listed without a figure (the driver does not say): held."""
    gone = set(killed)
    total = 0
    for pid, used in processes:
        if pid not in gone:
            continue
        if used is None:
            return None
        total += used
    return total


def may_start(held: int | None, waited_s: float, limit_s: float = LIMIT_S) -> tuple[bool, str]:
    """(True, why) when the next attempt may start: the memory is released, or the wait is
    over (said); else (False, what is still held)."""
    if held is not None and held < RELEASED_BYTES:
        return True, "released"
    what = "an unknown amount" if held is None else f"{held / 1024**2:.0f} MB"
    if waited_s >= limit_s:
        return True, f"still {what} after {waited_s:.0f} s; starting anyway"
    return False, f"{what} still held"


#: the key of :func:`held_by_device` for processes the tool lists without a device (rocm-smi)
UNPLACED = -1


def held_by_device(
    devices: Sequence[DeviceView],
    unplaced: Iterable[tuple[int, int | None]],
    used: Sequence[int],
    killed: Iterable[int],
    baseline: Mapping[int, int],
    by_pids: bool = True,
) -> dict[int, int | None]:
    """device -> what the killed attempt still holds there (None: listed without a figure).
    ``used``: the attempt's devices (none read: every device); ``by_pids``: the attempt's
    pids were seen in the process lists (else each device's memory above ``baseline``).
    Processes listed without a device are under :data:`UNPLACED`."""
    gone = tuple(killed)
    want = set(used) or {d.index for d in devices}
    out: dict[int, int | None] = {}
    for d in devices:
        if d.index not in want:
            continue
        if any(pid in gone for pid, _ in d.processes) or by_pids:
            out[d.index] = held_bytes(d.processes, gone)
        elif d.index in baseline and d.mem_used_bytes is not None:
            out[d.index] = max(0, d.mem_used_bytes - baseline[d.index])
        else:
            out[d.index] = 0
    rest = tuple(unplaced)
    if any(pid in gone for pid, _ in rest):
        out[UNPLACED] = held_bytes(rest, gone)
    return out


def may_start_all(
    held: Mapping[int, int | None], waited_s: float, limit_s: float = LIMIT_S
) -> tuple[bool, str]:
    """:func:`may_start` over every device: released when each holds under 512 MB."""
    still = {i: h for i, h in held.items() if h is None or h >= RELEASED_BYTES}
    if not still:
        return True, "released"
    what = ", ".join(
        f"{'unplaced' if i == UNPLACED else f'GPU {i}'} "
        + ("an unknown amount" if h is None else f"{h / 1024**2:.0f} MB")
        for i, h in sorted(still.items())
    )
    if waited_s >= limit_s:
        return True, f"still {what} after {waited_s:.0f} s; starting anyway"
    return False, f"{what} still held"
