"""How long verifying a command's checkpoint takes (prints figures; asserts nothing).

Usage: .venv/bin/python bench/bench_checkpoint_verify.py [--sizes 50,500] [--dir DIR]

For each size (MB) it writes a torch.save file of that size (float32 tensors: half model,
half optimizer state) in DIR (default: a temporary directory), times
``verify_path`` (zip complete, every CRC, data.pkl's opcodes walked), the same file
cut at 99% (refused from the zip's end alone), the legacy format, and ``torch.load`` for
comparison; then deletes the files.  The page cache is warm (the file was just written),
so the figures are CPU cost (CRC32 over every byte), not disk reads.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from trainctl.store.checkpoint_verify import verify_path


def timed(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def state(mb: int) -> dict:
    n = mb * 2**20 // 4 // 2 // 64  # rows of 64 float32, model and optimizer halves
    layers = max(1, n // 4096)
    return {
        "epoch": 1,
        "model": {f"layer{i}.weight": torch.randn(n // layers, 64) for i in range(layers)},
        "optimizer": {
            "state": {i: {"exp_avg": torch.randn(n // layers, 64)} for i in range(layers)},
            "param_groups": [{"lr": 1e-3, "params": list(range(layers))}],
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="50,500", help="file sizes in MB, comma-separated")
    ap.add_argument("--dir", default=None, help="where to write the files (deleted after)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=a.dir))
    try:
        for mb in map(int, a.sizes.split(",")):
            sd = state(mb)
            path, legacy, cut = work / f"{mb}.pt", work / f"{mb}-legacy.pt", work / f"{mb}-cut.pt"
            torch.save(sd, path)
            torch.save(sd, legacy, _use_new_zipfile_serialization=False)
            del sd
            size = path.stat().st_size
            with open(path, "rb") as src, open(cut, "wb") as dst:
                dst.write(src.read(int(size * 0.99)))
            v = verify_path(path)
            t_ok = timed(lambda: verify_path(path))
            t_cut = timed(lambda: verify_path(cut))
            t_legacy = timed(lambda: verify_path(legacy))
            t_load = timed(lambda: torch.load(path, map_location="cpu", weights_only=True), 2)
            print(
                f"{size / 2**20:7.1f} MiB torch zip: verify {t_ok * 1000:7.1f} ms "
                f"({size / 2**20 / t_ok:6.0f} MiB/s, {v.status}); cut at 99% refused in "
                f"{t_cut * 1000:.2f} ms; legacy format {t_legacy * 1000:.1f} ms "
                f"({verify_path(legacy).status}); torch.load {t_load * 1000:.0f} ms"
            )
            for p in (path, legacy, cut):
                p.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
