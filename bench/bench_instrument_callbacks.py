"""What the Transformers and Lightning callbacks cost a training step (prints figures;
asserts nothing).

Usage: .venv/bin/python bench/bench_instrument_callbacks.py [--steps 20000]

Calls each integration's per-step hook (Transformers ``on_step_end`` + ``on_log``,
Lightning ``on_train_batch_end``) ``--steps`` times in this process, on the real callback
classes with the Trainer's state stood in for (a global step, a control, Lightning's
batch counter and a loss tensor in ``callback_metrics``), with the side channel writing to
a temp file as under trainctl (a progress line at most every 0.5 s), and prints the time
per call.  That is the whole per-step cost of an integration; a real step is milliseconds
to seconds.  Whole-run comparisons (a plain run against an attached one) drown this in
start-up noise on a shared machine.

Measured (2 loaded cores, load average ~5-9, Python 3.11, torch 2.14 CPU, two runs):
Transformers 3.0-3.5 us a step, Lightning 2.1-2.6 us (the loss tensor is read only when a progress
line is due).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import types
from pathlib import Path

import torch


def per_call(fn, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20000)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        side = Path(tmp) / "side.jsonl"
        side.touch()
        os.environ["TRAINCTL_EVENTS_PATH"] = str(side)
        from trainctl.inside import lightning as L
        from trainctl.inside import transformers as T

        hf = T.TrainctlCallback(types.SimpleNamespace(state=None))
        hf.per_epoch, hf.epochs = 1000, 3
        hf.throttle.fresh = 0
        state = types.SimpleNamespace(global_step=0, max_steps=3000)
        control = types.SimpleNamespace(should_save=False, should_evaluate=False)
        args = types.SimpleNamespace()

        def hf_step(i: int) -> None:
            state.global_step = i + 1
            hf.on_step_end(args, state, control)
            hf.on_log(args, state, control, logs={"loss": 1.0 / (i + 1), "learning_rate": 1e-4})

        lt = L.TrainctlCallback()
        lt.throttle.fresh = 0
        progress = types.SimpleNamespace(processed=0)
        trainer = types.SimpleNamespace(
            num_training_batches=1000,
            max_epochs=3,
            max_steps=-1,
            accumulate_grad_batches=1,
            current_epoch=0,
            callback_metrics={"train_loss": torch.tensor(0.5)},
            fit_loop=types.SimpleNamespace(
                epoch_loop=types.SimpleNamespace(batch_progress=types.SimpleNamespace(current=progress))
            ),
        )

        def lt_step(i: int) -> None:
            progress.processed = i % 1000 + 1
            lt.on_train_batch_end(trainer, None, None, None, i % 1000)

        before = len(side.read_bytes().splitlines())
        hf_us = per_call(hf_step, a.steps)
        lt_us = per_call(lt_step, a.steps)
        lines = len(side.read_bytes().splitlines()) - before
    print(f"transformers on_step_end + on_log: {hf_us:.1f} us a step ({a.steps} steps)")
    print(f"lightning on_train_batch_end:      {lt_us:.1f} us a step ({a.steps} steps)")
    print(f"side channel lines written: {lines} (progress at most every 0.5 s, and at epoch ends)")


if __name__ == "__main__":
    main()
