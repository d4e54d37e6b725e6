"""Writes handmade_run.jsonl: a HAND-MADE journal (not recorded) for the TUI tests.

To be replaced by a real one recorded with `trainctl demo --json`.  It follows the
journal rules: progress about once a second plus each epoch's last batch, seq = line
number.  The story: preset A (workers 2) runs epoch 1 and hangs in epoch 2 (a DataLoader
deadlock); trainctl dumps stacks, falls back to preset B and resumes from the epoch-1
checkpoint; B is still running in epoch 3 at the end of the file.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from trainctl.core import events as ev

T0 = 1763200000.0  # Sat 15 Nov 2025 09:46:40 UTC
BATCHES, EPOCHS = 300, 3
DEADLINE = T0 + 3 * 3600
RUN_DIR = "/home/ana/runs/yolo-rocm-20251115"


def losses(x: float, rng: random.Random) -> dict[str, float]:
    decay = math.exp(-x / 500)
    return {
        "box_loss": round(1.1 + 1.3 * decay + rng.gauss(0, 0.04), 4),
        "cls_loss": round(0.9 + 2.6 * decay + rng.gauss(0, 0.06), 4),
        "dfl_loss": round(1.0 + 0.5 * decay + rng.gauss(0, 0.02), 4),
    }


def main() -> None:
    rng = random.Random(7)
    out: list[ev.Event] = []
    t = T0

    def add(e: ev.Event) -> None:
        out.append(ev.with_seq(e, len(out)))

    def projection(now: float, rate: float, done: int, preset: str, other: str, other_rate: float) -> None:
        left = BATCHES * EPOCHS - done
        eta = now + left / rate
        add(
            ev.Projection(
                now,
                eta=eta,
                deadline=DEADLINE,
                buffer_s=DEADLINE - eta,
                rate=rate,
                cost_so_far=round((now - T0) / 3600 * 0.9, 2),
                cost_at_eta=round((eta - T0) / 3600 * 0.9, 2),
                budget=3.0,
                what_if=(
                    {
                        "preset": other,
                        "rate": other_rate,
                        "source": "expected",
                        "eta": now + left / other_rate,
                        "buffer_s": DEADLINE - (now + left / other_rate),
                        "cost_at_eta": round((now + left / other_rate - T0) / 3600 * 0.9, 2),
                    },
                ),
            )
        )

    def train(
        attempt: int,
        preset: str,
        other: str,
        rate: float,
        other_rate: float,
        epoch: int,
        first: int,
        last_epoch: int,
        last_batch: int,
    ) -> float:
        nonlocal t
        batch, n = first, 0
        while (epoch, batch) <= (last_epoch, last_batch):
            t += 1.0 + rng.uniform(-0.05, 0.05)
            x = (epoch - 1) * BATCHES + batch
            add(
                ev.Progress(
                    t,
                    epoch=epoch,
                    epochs=EPOCHS,
                    batch=batch,
                    batches=BATCHES,
                    losses=losses(x, rng),
                    rate=round(rate + rng.uniform(-0.1, 0.1), 2),
                )
            )
            n += 1
            if n % 30 == 0:
                projection(t, rate, x, preset, other, other_rate)
            if n % 25 == 0 and attempt == 1:
                add(
                    ev.Warning(
                        t,
                        id="rocm.miopen.is_enough_workspace",
                        severity="info",
                        text="MIOpen(HIP): Warning [IsEnoughWorkspace] [GetSolutionsFallback "
                        "WTI] Solver <GemmFwdRest>, workspace required: 9437184, "
                        "provided ptr: 0 size: 0",
                        advice="Harmless MIOpen notice; repeats are counted, not shown.",
                        count=n // 25 * 3 + 1,
                    )
                )
            if batch == BATCHES:
                t += 4.0
                add(ev.Phase(t, phase="save"))
                add(ev.Checkpoint(t, path=f"{RUN_DIR}/checkpoints/last_good.pt", epoch=epoch))
                if epoch == last_epoch:
                    break
                epoch, batch = epoch + 1, 1
                add(ev.Phase(t, phase="train"))
                continue
            batch = min(BATCHES, batch + 2 + (rng.random() < rate - 2))
        return t

    add(ev.State(t, state="STARTING"))
    command = ("python", "-m", "trainctl.inside.ultralytics_runner", "--job", f"{RUN_DIR}/job.toml")
    add(ev.Start(t, attempt=1, pid=48211, preset="A", command=command))
    add(ev.Phase(t, phase="startup"))
    t += 3
    add(
        ev.Warning(
            t,
            id="rocm.miopen.sysdb_missing",
            severity="info",
            text="MIOpen(HIP): Warning [SQLiteBase] Missing system database file: "
            "gfx1010_18.kdb Performance may degrade.",
            advice="No tuned kernels for this GPU: the first batches are slow while MIOpen "
            "searches. trainctl waits longer for the first batch.",
        )
    )
    add(
        ev.Info(t, text="first-batch grace raised to 900 s (MIOpen has no system perf-DB)", key="stall.grace")
    )
    t += 40
    add(
        ev.Warning(
            t,
            id="rocm.hipblaslt_unsupported",
            severity="info",
            text="Attempting to use hipBLASLt on an unsupported architecture! Overriding "
            "blas backend to hipblas",
            advice="Expected on gfx1010; nothing to do.",
        )
    )
    add(ev.Phase(t, phase="train"))
    add(ev.State(t, state="RUNNING"))
    train(1, "A", "B", 2.4, 2.1, 1, 1, 2, 137)
    # the hang: epoch 2, batch 137, a worker blocked on a futex
    t += 61
    add(
        ev.Warning(
            t,
            id="kernel.amdgpu.wq_hog",
            severity="warning",
            text="workqueue: svm_range_restore_work [amdgpu] hogged CPU for >10000us 4 "
            "times, consider switching to WQ_UNBOUND",
            advice="The GPU driver is busy; with frozen progress this precedes DataLoader "
            "hangs. Falling back to workers = 0 (preset B) usually cures it.",
            source="kernel",
        )
    )
    add(
        ev.Stall(
            t,
            phase="train",
            idle_s=61.0,
            diagnosis="deadlock",
            cpu_percent=0.4,
            stacks=f"{RUN_DIR}/stacks/stall-1-{int(t)}-48211.txt",
            threshold_s=60.0,
            detail="main waits on the DataLoader queue; worker 48230 blocked in futex_wait",
        )
    )
    add(ev.State(t, state="STALLED", reason="no batch for 61 s in train"))
    add(ev.State(t + 1, state="STOPPING", reason="stall: deadlock"))
    t += 4
    add(ev.Exit(t, returncode=None, signal="SIGKILL"))
    add(
        ev.Restart(
            t,
            attempt=2,
            reason="stall: deadlock in train (DataLoader workers)",
            preset="B",
            resume_from=f"{RUN_DIR}/checkpoints/last_good.pt",
            delay_s=5.0,
        )
    )
    add(ev.State(t, state="BACKOFF", reason="restart in 5 s"))
    t += 5
    add(ev.State(t, state="STARTING"))
    add(ev.Start(t, attempt=2, pid=48302, preset="B", command=command))
    add(ev.Phase(t, phase="startup"))
    t += 35
    add(ev.Phase(t, phase="train"))
    add(ev.State(t, state="RUNNING"))
    train(2, "B", "A", 2.1, 2.4, 2, 1, 3, 141)
    path = Path(__file__).with_name("handmade_run.jsonl")
    path.write_text("".join(ev.encode(e) + "\n" for e in out), encoding="utf-8")
    print(f"{path}: {len(out)} events, last ts {t:.1f}")


if __name__ == "__main__":
    main()
