"""A 2-rank DDP deadlock (examples/ddp_resume.py: CPU, gloo, 1 DataLoader worker per rank)
under trainctl and under torchrun alone: the row bench_incidents.py has for one process.

    .venv/bin/python bench/bench_ranks.py [--cap 30]

The fault: rank 1's DataLoader worker blocks forever at epoch 1 batch 8 of 30, first
attempt only (TRAINCTL_ATTEMPT; torchrun alone never gets a second attempt of a hang).
Every rank then stops at batch 7 (rank 0 waits in DDP's allreduce for rank 1).  Figures:
detection s (the last batch before the fault → trainctl's stall event), hang → first new
batch s (→ the next attempt's first batch), batches redone (the furthest batch before the
fault − where the next attempt resumed; a periodic save every 5 batches), the culprit
named, processes of the first attempt left after the run.  Times: trainctl's journal (one
clock, the agent's); torchrun alone: the lines as they arrive here, capped at ``--cap`` s
after the last batch ("not detected": it watches exits, not progress; the bench kills it).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from bench_incidents import _alive  # same helpers
from bench_incidents import _kill_all as kill_all
from bench_incidents import _procs as job_procs
from doc_tables import Recorder, add_docs_flag

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ddp_resume.py"
HANG_AT = (1, 8)
DOC_TABLES = {
    "ranks": (
        "fault",
        "tool",
        "detection s",
        "hang → first new batch s",
        "batches redone",
        "culprit rank",
        "processes left over",
        "notes",
    )
}


def loop_args(ckpts: Path) -> list[str]:
    return [
        str(EXAMPLE),
        "--epochs",
        "1",
        "--batches",
        "30",
        "--batch-time",
        "0.05",
        "--save-every",
        "5",
        "--checkpoint-dir",
        str(ckpts),
        "--hang-rank",
        "1",
        "--hang-at",
        f"{HANG_AT[0]}:{HANG_AT[1]}",
        "--hang-attempt",
        "1",
    ]


def launcher(restarts: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        str(restarts),
    ]


def under_trainctl(cap: float) -> dict:
    from trainctl.store.journal import read_events

    tmp = Path(tempfile.mkdtemp(prefix="bench-ranks-"))
    ckpts, run_dir = tmp / "ckpts", tmp / "run"
    argv = [
        sys.executable,
        "-m",
        "trainctl",
        "run",
        "--headless",
        "--stall-timeout",
        "4",
        "--max-restarts",
        "2",
        "--run-dir",
        str(run_dir),
        "--resume-arg=--resume",
        "--resume-arg={checkpoint}",
        "--",
        *launcher(3),
        *loop_args(ckpts),
    ]
    first: set[psutil.Process] = set()
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, start_new_session=True
    )
    t0 = time.time()
    while proc.poll() is None and time.time() - t0 < 240:
        events = list(read_events(run_dir / "events.jsonl")) if (run_dir / "events.jsonl").exists() else []
        if not any(e.type == "restart" for e in events):
            first |= set(job_procs(ckpts))
        time.sleep(0.3)
    if proc.poll() is None:
        kill_all(proc, ckpts)
    time.sleep(1.0)
    left = [p for p in first if _alive(p)]
    events = list(read_events(run_dir / "events.jsonl"))
    stall = next(e for e in events if e.type == "stall")
    verdict = next((e for e in events if e.type == "stall_diagnosis" and e.seq > stall.seq), None)
    restart = next(e for e in events if e.type == "restart")
    before = [e for e in events if e.type == "progress" and e.seq < stall.seq]
    after = [e for e in events if e.type == "progress" and e.seq > restart.seq]
    last = max(e.ts for e in before)
    furthest = max(e.batch for e in before)
    return {
        "tool": "trainctl",
        "detection": stall.ts - last,
        "recovered": min(e.ts for e in after) - last,
        "redone": furthest - (min(e.batch for e in after) - 1),
        "culprit": ", ".join(map(str, verdict.culprits if verdict else ())) or "—",
        "left": len(left),
        "finished": proc.returncode == 0,
    }


def torchrun_alone(cap: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-ranks-"))
    ckpts = tmp / "ckpts"
    env = dict(os.environ, PYTHONUNBUFFERED="1", TRAINCTL_ATTEMPT="1")
    proc = subprocess.Popen(
        [*launcher(2), *loop_args(ckpts)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env=env,
        start_new_session=True,
        text=True,
    )
    lines: list[tuple[float, str]] = []

    def pump():
        for line in proc.stdout:
            lines.append((time.time(), line))

    threading.Thread(target=pump, daemon=True).start()
    t0 = time.time()
    while proc.poll() is None and time.time() - t0 < 240:
        batches = [t for t, ln in lines if re.search(r"batch=\d+/", ln)]
        if batches and time.time() - batches[-1] > cap:
            break
        time.sleep(0.3)
    restarted = sum(1 for _, ln in lines if "resume epoch=" in ln) > 2  # 2 ranks per attempt
    kill_all(proc, ckpts)
    return {
        "tool": "torchrun",
        "detection": None if not restarted else float("nan"),
        "recovered": None,
        "redone": None,
        "culprit": "—",
        "left": None,
        "finished": False,
        "note": f"no restart within {cap:.0f}s of the last batch; killed by the bench"
        if not restarted
        else "restarted",
    }


def fmt(v, spec=".1f") -> str:
    return "not detected" if v is None else format(v, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cap", type=float, default=30.0)
    add_docs_flag(ap)
    args = ap.parse_args()
    rec = Recorder(DOC_TABLES, args.docs)
    rows: list[list[object]] = []
    for r in [under_trainctl(args.cap), torchrun_alone(args.cap)]:
        rec_s = "—" if r["recovered"] is None else f"{r['recovered']:.1f}"
        redone = "—" if r["redone"] is None else str(r["redone"])
        left = "—" if r["left"] is None else str(r["left"])
        note = r.get("note", "finished" if r["finished"] else "did not finish")
        rows.append(
            ["2-rank deadlock", r["tool"], fmt(r["detection"]), rec_s, redone, r["culprit"], left, note]
        )
    rec.publish("ranks", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
