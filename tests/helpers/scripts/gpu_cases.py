"""Trainers for the e2e tests of the run's own GPUs (plain Python, no torch), read by the
fake NVML of tests/helpers/fake_nvml/pynvml.py through TRAINCTL_TEST_GPU.

Usage: python gpu_cases.py MODE [ARGS ...]
  on-gpu D [--visible] MODE ...  runs MODE with TRAINCTL_TEST_GPU=D in its environment (a
                   process of its own: the fake lists it on device D); --visible also sets
                   CUDA_VISIBLE_DEVICES=D (a container's trainer: its only device rule)
  train N          N progress lines 0.2 s apart, exit 0
  deadlock         prints "loading the model", then blocks forever before any batch
  ranks            two children on devices 1 and 2 ("ranks"), 8 progress lines each; in the
                   first attempt each stops after 3 and blocks forever (a stall)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from startup_cases import hang


def train(n: int, hang_after: int | None = None) -> int:
    for batch in range(1, n + 1):
        if hang_after is not None and batch > hang_after:
            hang()
        print(f"epoch=1/1 batch={batch}/{n} loss={1.0 / batch:.3f}", flush=True)
        time.sleep(0.2)
    return 0


def main(argv: list[str]) -> int:
    mode = argv[0]
    if mode == "on-gpu":
        device, rest = argv[1], argv[2:]
        env = {**os.environ, "TRAINCTL_TEST_GPU": device}
        if rest and rest[0] == "--visible":
            env["CUDA_VISIBLE_DEVICES"], rest = device, rest[1:]
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *rest], env)
    if mode == "train":
        return train(int(argv[1]))
    if mode == "deadlock":
        print("loading the model", flush=True)
        hang()
    if mode == "rank":
        first = os.environ.get("TRAINCTL_ATTEMPT", "1") == "1"
        return train(8, hang_after=3 if first else None)
    if mode == "ranks":
        me = os.path.abspath(__file__)
        children = [subprocess.Popen([sys.executable, me, "on-gpu", d, "rank"]) for d in ("1", "2")]
        return max(c.wait() for c in children)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
