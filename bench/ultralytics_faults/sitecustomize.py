"""Faults and batch stamps for a real Ultralytics run under trainctl (bench_incidents.py).

Put this directory on PYTHONPATH: Python imports ``sitecustomize`` at start-up in every
process (the agent, the holder, the trainer, its spawned DataLoader workers).  It does
nothing until Ultralytics itself is imported, and nothing at all without BENCH_STAMPS.
Then, in attempt 1 only (TRAINCTL_ATTEMPT), with BENCH_FAULT and BENCH_FAULT_BATCH (1-based,
epoch 1):

* ``worker``: the DataLoader worker that loads that batch blocks forever in ``__getitem__``
  (a worker deadlock; the main thread waits in ``_try_get_data``);
* ``worker-exit``: that worker dies (``os._exit``), as the OOM killer would do it;
* ``spin``: after that batch (once the runner has reported it: at the next batch's start),
  the main thread spins in native code (a catastrophic regex).

The worker is found from the order DataLoader hands out batches: worker ``b % W`` loads
batch ``b`` (0-based), its ``b // W``-th; BENCH_WORKERS (W) and BENCH_BATCH_SIZE say the
preset's figures.  BENCH_STAMPS gets ``resume epoch=E batch=B t=T`` once per trainer (T:
this process's start) and ``epoch=E/EE batch=B/BB t=T`` per batch, the format of
examples/midepoch_resume.py's ``--stamp`` lines.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import re
import sys
import threading
import time

STARTED = time.time()  # this trainer's start: its process's, or a warm spare's release (below)
try:  # a trainctl warm spare (agent/spare.py) starts long before its attempt: at its release
    with open("/proc/self/cmdline", "rb") as _f:
        SPARE = b"trainctl-warm-spare" in _f.read()
except OSError:
    SPARE = False
STAMPS = os.environ.get("BENCH_STAMPS", "")
FAULT = os.environ.get("BENCH_FAULT", "") if os.environ.get("TRAINCTL_ATTEMPT") == "1" else ""
AT = int(os.environ.get("BENCH_FAULT_BATCH", "0") or 0)
WORKERS = int(os.environ.get("BENCH_WORKERS", "2") or 2)
BATCH_SIZE = int(os.environ.get("BENCH_BATCH_SIZE", "4") or 4)


def _stamp(text: str, t: float | None = None) -> None:
    with open(STAMPS, "a") as f:
        f.write(f"{text} t={time.time() if t is None else t:.3f}\n")


def _patch_callbacks(module) -> None:
    seen = {"first": True}

    def on_batch_end(trainer) -> None:
        epoch, batch = trainer.epoch + 1, getattr(trainer, "trainctl_batch", None)
        if batch is None:
            return
        if seen["first"]:
            seen["first"] = False
            _stamp(f"resume epoch={epoch} batch={batch - 1}", STARTED)
        _stamp(f"epoch={epoch}/{trainer.epochs} batch={batch}/{len(trainer.train_loader)}")

    def on_batch_start(trainer) -> None:  # trainctl_batch: still the batch before this one
        if FAULT == "spin" and (trainer.epoch + 1, getattr(trainer, "trainctl_batch", None)) == (1, AT):
            re.match(r"(a+)+$", "a" * 64 + "b")  # native: no Python runs until it ends

    module.default_callbacks["on_train_batch_end"].append(on_batch_end)
    module.default_callbacks["on_train_batch_start"].append(on_batch_start)


def _patch_dataset(module) -> None:
    if FAULT not in ("worker", "worker-exit"):
        return
    calls = {"n": 0}
    target = (AT - 1) // WORKERS * BATCH_SIZE + 1  # the first sample of that batch
    getitem = module.BaseDataset.__getitem__

    def __getitem__(self, index):
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        if info is not None and info.id == (AT - 1) % WORKERS:
            calls["n"] += 1
            if calls["n"] == target:
                if FAULT == "worker":
                    threading.Event().wait()  # blocks forever
                os._exit(9)
        return getitem(self, index)

    module.BaseDataset.__getitem__ = __getitem__


def _released(module) -> None:
    """The runner's first import of its own: a warm spare was released (its attempt starts)."""
    global STARTED
    STARTED = time.time()


PATCHES = {"ultralytics.utils.callbacks.base": _patch_callbacks, "ultralytics.data.base": _patch_dataset}
if SPARE:
    PATCHES["trainctl.inside.ultralytics_setup"] = _released


class _Finder(importlib.abc.MetaPathFinder):
    """Runs the patch of a module right after the module itself ran."""

    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def run(module):
            exec_module(module)
            PATCHES[name](module)

        spec.loader.exec_module = run
        return spec


if STAMPS:
    sys.meta_path.insert(0, _Finder())
