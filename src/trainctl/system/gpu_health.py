"""A short health check of the run's GPUs before a restart: in a subprocess of the trainer's
own Python (its torch), for each device a memory allocation (64 MiB), a small kernel on
it (``mul_`` and ``sum``), a synchronize, and the sum checked; the whole bounded by
``timeout_s`` (a hung device never answers).  ``torch.cuda`` is CUDA's or ROCm's (HIP).

A device that fails is one not to train on (the attempt loop stops the restart: it says
which and why).  Where the check cannot run (no torch in that Python, no GPU torch
build), it says so and no device is taken as failed."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

TIMEOUT_S = 30.0
ALLOC_MIB = 64

_CHECK = f"""
import json, sys
try:
    import torch
except Exception as e:
    print(json.dumps({{"skip": "torch does not import: " + repr(e)}})); sys.exit(0)
if not torch.cuda.is_available():
    print(json.dumps({{"skip": "torch " + torch.__version__ + " sees no GPU"}})); sys.exit(0)
for i in [int(a) for a in sys.argv[1:]]:
    try:
        n = {ALLOC_MIB} * (1 << 20) // 4
        x = torch.ones(n, device=f"cuda:{{i}}")
        total = float(x.mul_(2.0).sum().item())
        torch.cuda.synchronize(i)
        ok = total == 2.0 * n
        print(json.dumps({{"index": i, "ok": ok, "error": "" if ok else f"sum {{total}} != {{2.0 * n}}"}}), flush=True)
        del x
    except Exception as e:
        print(json.dumps({{"index": i, "ok": False, "error": type(e).__name__ + ": " + str(e)[:300]}}), flush=True)
"""


@dataclass(frozen=True)
class Health:
    """The check's answer: ``failed`` (device -> why), ``passed`` devices, ``skipped`` (why
    it could not run; then neither list says anything)."""

    passed: tuple[int, ...] = ()
    failed: dict[int, str] | None = None
    skipped: str = ""
    seconds: float = 0.0

    def said(self) -> str:
        if self.skipped:
            return f"GPU health check skipped: {self.skipped}"
        parts = [f"GPU {i} FAILED ({why})" for i, why in sorted((self.failed or {}).items())]
        if self.passed:
            parts.append(f"GPU {', '.join(map(str, self.passed))} passed")
        return f"GPU health check ({self.seconds:.1f}s): {'; '.join(parts)}"


def read(stdout: str, indices: Sequence[int], seconds: float = 0.0) -> Health:
    """The check's answer from its output lines (pure): a device it gave no line for failed."""
    passed, failed = [], {}
    seen = set()
    for line in stdout.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict):
            continue
        if "skip" in row:
            return Health(skipped=str(row["skip"]), seconds=seconds)
        index = row.get("index")
        if not isinstance(index, int) or index not in indices:
            continue
        seen.add(index)
        if row.get("ok") is True:
            passed.append(index)
        else:
            failed[index] = str(row.get("error") or "failed")
    for i in indices:
        if i not in seen:
            failed[i] = "no answer"
    return Health(tuple(sorted(passed)), failed, "", seconds)


def check(
    python: str,
    indices: Sequence[int],
    timeout_s: float = TIMEOUT_S,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    clock: Callable[[], float] | None = None,
) -> Health:
    """Run the check of ``indices`` (the driver's device numbers, as the trainer's torch
    sees them with no visible-devices variable set) with ``python``."""
    import os
    import time

    clock = clock or time.monotonic
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")}
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # the driver's numbers, as the probe reads them
    t0 = clock()
    try:
        done = run(
            [python, "-c", _CHECK, *map(str, indices)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return Health((), {i: f"no answer within {timeout_s:.0f}s" for i in indices}, "", clock() - t0)
    except OSError as e:
        return Health(skipped=f"{python} cannot run ({e.strerror or e})", seconds=clock() - t0)
    health = read(done.stdout, indices, clock() - t0)
    if done.returncode != 0 and not health.skipped:
        tail = (done.stderr or "").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        failed = {
            i: (why if why != "no answer" else tail[0][:200]) for i, why in (health.failed or {}).items()
        }
        health = Health(health.passed, failed, "", health.seconds)
    return health
