"""A plain-Python training-like loop (no torch: starts in ~50 ms), for SIGSTOP, kill,
stall and recovery tests.

Usage: python steady.py [options]   (every option is optional)
  --epochs N           epochs (3)
  --batches N          batches per epoch (30)
  --batch-time S       seconds per batch (0.05)
  --hang-at E:B        hang at epoch E, batch B (1-based); default: never
  --hang-kind K        main (block forever on an Event, ~0% CPU) | spin (while True: pass) |
                       stop (SIGSTOP itself) | crash (exit code 3)        (default: main)
  --hang-attempt N     hang only when env TRAINCTL_ATTEMPT == N (default: on every attempt)
  --mp-workers N       N multiprocessing worker processes (fork) produce the batches into a
                       Queue; the main process waits on Queue.get() with no timeout, so a
                       worker killed with SIGKILL leaves it blocked next to a zombie (0 = none)
  --checkpoint PATH    after each epoch write {"epoch": E} there (atomically)
  --resume PATH        start after the epoch saved in PATH (a missing file: from the start)
Output on stdout (flushed): "start pid=P attempt=A resume_epoch=R", then
"workers pids=P1,P2" when --mp-workers > 0, one "epoch=E/EE batch=B/BB loss=X" per batch,
"checkpoint epoch=E path=P", "done".
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import sys
import threading
import time


def _pair(text: str) -> tuple[int, int]:
    e, _, b = text.partition(":")
    return int(e), int(b)


def _produce(q, batch_time: float) -> None:
    while True:
        time.sleep(batch_time)
        q.put(1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batches", type=int, default=30)
    p.add_argument("--batch-time", type=float, default=0.05)
    p.add_argument("--hang-at", type=_pair, default=None)
    p.add_argument("--hang-kind", default="main", choices=("main", "spin", "stop", "crash"))
    p.add_argument("--hang-attempt", type=int, default=None)
    p.add_argument("--mp-workers", type=int, default=0)
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--resume", default=None)
    a = p.parse_args(argv)
    attempt = int(os.environ.get("TRAINCTL_ATTEMPT", "1") or 1)
    hang = a.hang_at if (a.hang_attempt is None or a.hang_attempt == attempt) else None
    start_epoch = 1
    if a.resume and os.path.isfile(a.resume):
        with open(a.resume, encoding="utf-8") as f:
            start_epoch = int(json.load(f)["epoch"]) + 1
    print(f"start pid={os.getpid()} attempt={attempt} resume_epoch={start_epoch - 1}", flush=True)
    queue = None
    if a.mp_workers > 0:
        ctx = mp.get_context("fork")
        queue = ctx.Queue()
        procs = [
            ctx.Process(target=_produce, args=(queue, a.batch_time), daemon=True) for _ in range(a.mp_workers)
        ]
        for w in procs:
            w.start()
        print(f"workers pids={','.join(str(w.pid) for w in procs)}", flush=True)
    loss = 1.0
    for epoch in range(start_epoch, a.epochs + 1):
        for b in range(1, a.batches + 1):
            if hang == (epoch, b):
                if a.hang_kind == "main":
                    threading.Event().wait()
                elif a.hang_kind == "spin":
                    while True:
                        pass
                elif a.hang_kind == "stop":
                    os.kill(os.getpid(), signal.SIGSTOP)
                elif a.hang_kind == "crash":
                    print(f"crash at epoch={epoch} batch={b}", flush=True)
                    return 3
            if queue is not None:
                queue.get()
            else:
                time.sleep(a.batch_time)
            loss *= 0.99
            print(f"epoch={epoch}/{a.epochs} batch={b}/{a.batches} loss={loss:.4f}", flush=True)
        if a.checkpoint:
            tmp = f"{a.checkpoint}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"epoch": epoch}, f)
            os.replace(tmp, a.checkpoint)
            print(f"checkpoint epoch={epoch} path={a.checkpoint}", flush=True)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
