"""Trainers for issue 16's start-up and unknown-format tests (plain Python, no torch).

Usage: python startup_cases.py MODE [SECONDS ...]
  unknown-hang N   prints "working on chunk K" (a format trainctl does not know) about once
                   a second for N chunks, then blocks forever on a lock (~0% CPU)
  steady-hang N S  prints "tick K" (a format trainctl does not know) every S seconds N times
                   (a steady printer: never a pause), then blocks forever on a lock
  deadlock         prints "loading the model", then blocks forever on a lock before any batch
  busy CPU_S IO_S  silent start-up: CPU-bound for CPU_S seconds, then I/O-bound for IO_S
                   seconds (a cache file written in 64 KiB pieces, ~0% CPU, then read back),
                   then 5 progress lines, exit 0
  import-error     imports a module that does not exist (ModuleNotFoundError, exit 1)
"""

from __future__ import annotations

import sys
import threading
import time


def hang() -> None:
    """Block forever; first note when, in $TRAINCTL_RUN_DIR/hang_at (for the test)."""
    import os

    run_dir = os.environ.get("TRAINCTL_RUN_DIR")
    if run_dir:
        with open(os.path.join(run_dir, "hang_at"), "w") as f:
            f.write(repr(time.time()))
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()  # never returns


def main() -> int:
    mode = sys.argv[1]
    if mode == "unknown-hang":
        for k in range(1, int(sys.argv[2]) + 1):
            print(f"working on chunk {k}", flush=True)
            time.sleep(0.8 + 0.1 * (k % 3))
        hang()
    if mode == "steady-hang":
        for k in range(1, int(sys.argv[2]) + 1):
            print(f"tick {k}", flush=True)
            time.sleep(float(sys.argv[3]))
        hang()
    if mode == "deadlock":
        print("loading the model", flush=True)
        hang()
    if mode == "busy":
        cpu_s, io_s = float(sys.argv[2]), float(sys.argv[3])
        end = time.monotonic() + cpu_s
        x = 0
        while time.monotonic() < end:
            x += 1
        import tempfile

        end = time.monotonic() + io_s
        with tempfile.TemporaryFile() as cache:  # a dataset cache: written, read back
            while time.monotonic() < end:
                cache.write(b"x" * 65536)
                cache.flush()
                time.sleep(0.2)
            cache.seek(0)
            while cache.read(65536):
                time.sleep(0.01)
        for batch in range(1, 6):
            print(f"epoch=1/1 batch={batch}/5 loss={1.0 / batch:.3f}", flush=True)
            time.sleep(0.05)
        return 0
    if mode == "import-error":
        import trainctl_missing_module_for_tests  # noqa: F401
    return 2


if __name__ == "__main__":
    sys.exit(main())
