"""Recovery time: from the stall event to the first batch of the next attempt, minus the
trainer's own start-up time (prints figures; asserts nothing).  Goal: <= 5 s.

Usage: .venv/bin/python bench/bench_recovery.py [--runs N] [--stall-timeout S] [--ultralytics]

Each run is a real `trainctl run --json` (preset A, fallback B) of a trainer that hangs in
its first attempt: tests/helpers/scripts/train_loop.py (PyTorch, 2 DataLoader workers, one
deadlocks in epoch 2), and with --ultralytics a tiny YOLOv8n job whose spawned workers are
stopped with SIGSTOP in epoch 2.  Start-up is measured on an undisturbed run of the same
trainer under preset B (the preset the recovery restarts with), right after, with the same
warm caches: start event -> first progress (for Ultralytics: the runner resuming from the
same checkpoint, spawn -> first progress event, since a resume starts faster than a fresh
run).  Also printed, per run: the diagnosis time
(STALLED -> stall event, before the metric starts), the kill (stall -> exit), the backoff
+ spawn (exit -> start; the first backoff is 1 s), the attempt's own start-up (start ->
first batch) and stall -> start (trainctl's whole share).  Timings are noisy on a shared
machine: start-up varies by seconds from run to run, so read the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
TRAIN_LOOP = ROOT / "tests" / "helpers" / "scripts" / "train_loop.py"
PY = sys.executable


def read_journal(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def first(events: list[dict], kind: str, after: float = 0.0, **fields) -> dict | None:
    return next(
        (
            e
            for e in events
            if e["type"] == kind and e["ts"] >= after and all(e.get(k) == v for k, v in fields.items())
        ),
        None,
    )


class Trainctl:
    """`python -m trainctl run --json ...` in its own session; kill() takes the whole tree."""

    def __init__(self, args: list[str], run_dir: Path, env: dict[str, str]) -> None:
        self.run_dir = run_dir
        self.proc = subprocess.Popen(
            [PY, "-m", "trainctl", "run", "--json", "--run-dir", str(run_dir), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=str(ROOT),
            start_new_session=True,
        )
        self.seen: dict[int, psutil.Process] = {}

    def events(self) -> list[dict]:
        try:
            for p in [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]:
                self.seen.setdefault(p.pid, p)
        except psutil.Error:
            pass
        return read_journal(self.run_dir)

    def wait_for(self, pred, timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events():
                if pred(e):
                    return e
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)  # light polling: the machine is shared with the trainer
        raise RuntimeError(f"no {what} within {timeout:.0f}s (exit {self.proc.poll()}) in {self.run_dir}")

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.events()
            time.sleep(0.5)
        if self.proc.poll() is None:
            raise RuntimeError(f"trainctl still running after {timeout:.0f}s ({self.run_dir})")
        return self.proc.returncode

    def kill(self) -> None:
        self.events()
        for p in self.seen.values():
            with contextlib.suppress(psutil.Error, OSError):
                if p.is_running():
                    os.killpg(os.getpgid(p.pid), signal.SIGKILL)
                    p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        psutil.wait_procs(list(self.seen.values()), timeout=5)


def startup(events: list[dict], attempt: int) -> float:
    start = first(events, "start", attempt=attempt)
    prog = first(events, "progress", after=start["ts"])
    return prog["ts"] - start["ts"]


def measure(events: list[dict], baseline: float) -> dict[str, float]:
    stalled = first(events, "state", state="STALLED")
    stall = first(events, "stall")
    exit1 = first(events, "exit")
    start2 = first(events, "start", attempt=2)
    prog2 = first(events, "progress", after=start2["ts"])
    restart = first(events, "restart")
    assert restart["preset"] == "B", restart
    if exit1["ts"] - stall["ts"] > 2.0:  # a slow kill: say what the agent said about it
        notes = [e["text"] for e in events if e["type"] == "info" and stall["ts"] <= e["ts"] <= exit1["ts"]]
        print(f"  slow kill ({exit1['ts'] - stall['ts']:.1f} s): {notes}")
    return {
        "recovery": prog2["ts"] - stall["ts"] - baseline,
        "diagnosis": stall["ts"] - stalled["ts"],
        "kill": exit1["ts"] - stall["ts"],
        "backoff+spawn": start2["ts"] - exit1["ts"],
        "own start-up": prog2["ts"] - start2["ts"],
        "baseline start-up": baseline,
        "stall->start": start2["ts"] - stall["ts"],
    }


# ---------------------------------------------------------------------- generic loop
def generic_round(tmp: Path, i: int, env: dict[str, str], stall_timeout: float) -> dict[str, float]:
    loop = [PY, "-u", str(TRAIN_LOOP), "--batches", "6"]
    ckpt = tmp / f"ckpt-{i}.json"
    run = Trainctl(
        [
            "--preset",
            "A",
            "--fallback",
            "B",
            "--stall-timeout",
            str(stall_timeout),
            "--resume-arg=--resume",
            f"--resume-arg={ckpt}",
            "--",
            *loop,
            "--epochs",
            "2",
            "--hang-at",
            "2:3",
            "--hang-attempt",
            "1",
            "--checkpoint",
            str(ckpt),
        ],
        tmp / f"run-{i}",
        env,
    )
    try:
        if run.wait(180) != 0:
            raise RuntimeError(f"recovery run failed: {run.run_dir}")
        events = read_journal(run.run_dir)
    finally:
        run.kill()
    base = Trainctl(["--preset", "B", "--", *loop, "--epochs", "1"], tmp / f"base-{i}", env)
    try:
        if base.wait(120) != 0:
            raise RuntimeError(f"baseline run failed: {base.run_dir}")
        return measure(events, startup(read_journal(base.run_dir), 1))
    finally:
        base.kill()


# ---------------------------------------------------------------------- ultralytics
def yolo_job(tmp: Path, name: str, epochs: int) -> Path:
    from trainctl.config.demo import make_dataset

    data = make_dataset(tmp / "data", n_train=40, n_val=4)
    job = tmp / f"{name}.toml"
    job.write_text(
        f'kind = "ultralytics"\nname = "{name}"\npreset = "A"\nfallback = "B"\n\n'
        f'[ultralytics]\nmodel = "yolov8n.yaml"\ndata = "{data}"\nepochs = {epochs}\n'
        f'imgsz = 64\nbatch = 4\ndevice = "cpu"\n'
    )
    return job


def ultralytics_round(tmp: Path, i: int, env: dict[str, str], stall_timeout: float) -> dict[str, float]:
    job = yolo_job(tmp, f"rec{i}", 3)
    run = Trainctl([str(job), "--stall-timeout", str(stall_timeout)], tmp / f"yrun-{i}", env)
    saved = tmp / f"resume-{i}.pt"
    try:
        run.wait_for(lambda e: e["type"] == "progress" and e["epoch"] == 2, 240, "epoch 2")
        pid = first(run.events(), "start")["pid"]
        for child in psutil.Process(pid).children():
            with contextlib.suppress(psutil.Error):
                if "spawn_main" in " ".join(child.cmdline()):
                    child.send_signal(signal.SIGSTOP)
        restart = run.wait_for(lambda e: e["type"] == "restart", 120, "the restart")
        shutil.copyfile(restart["resume_from"], saved)  # before attempt 2 replaces it
        start2 = run.wait_for(lambda e: e["type"] == "start" and e["attempt"] == 2, 120, "attempt 2")
        run.wait_for(
            lambda e: e["type"] == "progress" and e["ts"] > start2["ts"], 180, "attempt 2's progress"
        )
        events = run.events()
    finally:
        run.kill()
    # The baseline: the same resume, undisturbed, run right after (the same warm caches).
    return measure(events, runner_startup(job, saved, tmp / f"ybase-{i}", env))


def runner_startup(job: Path, ckpt: Path, run_dir: Path, env: dict[str, str]) -> float:
    """Seconds from spawning the Ultralytics runner (resuming ``ckpt`` under preset B, the
    way the agent starts an attempt) to its first progress event."""
    r_fd, w_fd = os.pipe()
    argv = [
        PY,
        "-m",
        "trainctl.inside.ultralytics_runner",
        "--job",
        str(job),
        "--run-dir",
        str(run_dir),
        "--preset",
        str(ROOT / "src" / "trainctl" / "presets" / "B.toml"),
        "--resume",
        str(ckpt),
    ]
    t0 = time.time()
    proc = subprocess.Popen(
        argv,
        env=dict(env, TRAINCTL_EVENTS_FD=str(w_fd)),
        pass_fds=(w_fd,),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    os.close(w_fd)
    try:
        with os.fdopen(r_fd, "rb") as pipe:
            for line in pipe:
                if json.loads(line).get("type") == "progress":
                    return time.time() - t0
        raise RuntimeError(f"the baseline runner exited ({proc.wait()}) without progress")
    finally:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def report(name: str, rounds: list[dict[str, float]]) -> None:
    print(f"\n{name}: {len(rounds)} runs")
    for key in rounds[0]:
        values = [r[key] for r in rounds]
        print(
            f"  {key:18s} median {statistics.median(values):6.2f} s   max {max(values):6.2f} s   "
            f"({', '.join(f'{v:.2f}' for v in values)})"
        )
    worst = max(r["recovery"] for r in rounds)
    print(f"  goal: recovery <= 5 s -> {'met' if worst <= 5 else 'NOT met'} (max {worst:.2f} s)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--stall-timeout", type=float, default=3.0)
    ap.add_argument("--ultralytics", action="store_true", help="also bench the Ultralytics runner (slow)")
    ap.add_argument(
        "--keep", action="store_true", help="keep the run directories (their journals) and say where"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmpdir:
        tmp = Path(tempfile.mkdtemp(prefix="bench-recovery-")) if args.keep else Path(tmpdir)
        if args.keep:
            print(f"run directories under {tmp}")
        env = dict(
            os.environ,
            TRAINCTL_CONFIG_DIR=str(tmp / "config"),
            TRAINCTL_RUNS_DIR=str(tmp / "runs"),
            YOLO_OFFLINE="1",
            YOLO_CONFIG_DIR=str(tmp / "yolo"),
            TRAIN_MP_CONTEXT="fork",
            PYTHONUNBUFFERED="1",
        )
        env.pop("GITHUB_ACTIONS", None)
        print(
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; stall timeout {args.stall_timeout:g} s"
        )
        report(
            "generic PyTorch loop (worker deadlock, A -> B)",
            [generic_round(tmp, i, env, args.stall_timeout) for i in range(args.runs)],
        )
        if args.ultralytics:
            env.pop("TRAIN_MP_CONTEXT")
            report(
                "Ultralytics runner (SIGSTOPped workers, A -> B)",
                [
                    ultralytics_round(tmp, i, env, max(args.stall_timeout, 6.0))
                    for i in range(max(1, args.runs // 2))
                ],
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
