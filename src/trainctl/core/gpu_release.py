"""Whether the next attempt may start on a GPU box: the killed attempt's device memory must
be released first, or the restart dies of OOM (NVRx waits the same way: under 512 MB, polled
every 2 s, up to 50 s).  Pure: the GPU sample and the time are arguments."""

from __future__ import annotations

from collections.abc import Iterable

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
