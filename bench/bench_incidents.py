"""The same faults on the same PyTorch loop (examples/midepoch_resume.py) under trainctl and
under torchrun --max-restarts: what each costs.

    .venv/bin/python bench/bench_incidents.py [--cap 30] [--write docs/benchmarks.md]

Faults, all at epoch 1 batch 25 of 60, first attempt only: ``deadlock`` (the DataLoader
worker loading that batch blocks forever), ``spin`` (the main thread spins in native code:
a catastrophic regex), ``killed worker`` (that worker dies: os._exit).  Per fault and tool:
detection s (the last batch before the fault → trainctl's stall event, or the launcher
starting the next attempt), hang → first new batch s, batches redone (the furthest batch
before the fault − where the next attempt resumed), processes left over (of the first
attempt, after the run ended), lines of trainer code changed for that tool.  Each fault is
capped at ``--cap`` s: a tool that has not restarted by then "did not detect" it.
Times are taken here, from the trainer's output lines as they arrive.
NVRx ft_launcher is not measured (see docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "midepoch_resume.py"
FAULTS = {"deadlock": "worker", "spin": "spin", "killed worker": "worker-exit"}
HANG_AT = (1, 25)


def loop_args(ckpts: Path, kind: str) -> list[str]:
    return [str(EXAMPLE), "--epochs", "1", "--batches", "60", "--batch-time", "0.03",
            "--save-every", "10", "--checkpoint-dir", str(ckpts), "--stamp",
            "--hang-at", f"{HANG_AT[0]}:{HANG_AT[1]}", "--hang-kind", kind, "--hang-attempt", "1"]


def command(tool: str, ckpts: Path, kind: str, run_dir: Path) -> list[str]:
    py = sys.executable
    if tool == "trainctl":
        return [py, "-m", "trainctl", "run", "--json", "--stall-timeout", "4", "--rescue-wait", "10",
                "--max-restarts", "2", "--run-dir", str(run_dir), "--resume-arg=--resume",
                "--resume-arg={checkpoint}", "--", py, "-u", *loop_args(ckpts, kind)]
    return [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
            "--max-restarts", "2", *loop_args(ckpts, kind), "--resume", "auto"]


def measure(tool: str, fault: str, cap: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-incidents-"))
    ckpts, run_dir = tmp / "ckpts", tmp / "run"
    argv = command(tool, ckpts, FAULTS[fault], run_dir)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    lines: list[tuple[float, str]] = []
    t0 = time.time()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
                            env=env, start_new_session=True, text=True)

    def pump():
        for line in proc.stdout:
            lines.append((time.time(), line))
    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    first_attempt: set[psutil.Process] = set()
    capped = False
    while proc.poll() is None:
        if time.time() - t0 > cap:
            capped = True
            break
        if not _restarted(tool, lines, run_dir):
            first_attempt |= set(_procs(ckpts))
        time.sleep(0.2)
    time.sleep(1.0)
    left = [p for p in first_attempt if _alive(p)] if not capped else []
    _kill_all(proc, ckpts)
    reader.join(2)
    text = [(float(m[1]), ln.rstrip()) for _t, ln in lines if (m := re.search(r" t=([0-9.]+)$", ln.rstrip()))]
    if tool == "trainctl":   # the trainer's own lines are in train.log, the events on stdout
        text = _trainctl_lines(run_dir, lines)
    return _figures(tool, fault, text, left, capped, run_dir)


def _restarted(tool: str, lines, run_dir: Path) -> bool:
    if tool == "trainctl":
        return any('"type":"restart"' in ln for _t, ln in lines)
    return sum("resume epoch" in ln for _t, ln in lines) >= 2


def _trainctl_lines(run_dir: Path, lines) -> list[tuple[float, str]]:
    """The trainer's stamped lines from train.log; the stall and save-request infos from
    the journal."""
    import json
    out = []
    try:
        log = (run_dir / "train.log").read_text(errors="replace").splitlines()
    except OSError:
        log = []
    for ln in log:
        if m := re.search(r" t=([0-9.]+)$", ln):
            out.append((float(m[1]), ln))
    try:
        journal = (run_dir / "events.jsonl").read_text().splitlines()
    except OSError:
        journal = []
    for ln in journal:
        ev = json.loads(ln)
        if ev.get("type") == "stall":
            out.append((ev["ts"], "STALL"))
        elif ev.get("type") == "info" and ev.get("key", "").startswith("save_request_"):
            out.append((ev["ts"], f"INFO {ev['text']}"))
    return sorted(out, key=lambda x: x[0])


def _figures(tool, fault, text, left, capped, run_dir) -> dict:
    attempts: list[dict] = []
    stall_ts = None
    for t, ln in text:
        if m := re.match(r"resume epoch=(\d+) batch=(\d+)", ln):
            attempts.append({"start": t, "resume": (int(m[1]), int(m[2])), "last": None, "first": None})
        elif (m := re.match(r"epoch=(\d+)/\d+ batch=(\d+)/", ln)) and attempts:
            a = attempts[-1]
            pos = (int(m[1]), int(m[2]))
            if a["first"] is None:
                a["first"] = t
            if a["last"] is None or pos >= a["last"][1]:
                a["last"] = (t, pos)
        elif ln == "STALL" and stall_ts is None:
            stall_ts = t
        elif ln.startswith("INFO "):
            attempts and attempts[-1].setdefault("save", ln[5:].strip())
    row = {"tool": tool, "fault": fault, "detect": None, "recover": None, "redone": None,
           "left": None if capped else len(left), "note": ""}
    if not attempts or attempts[0]["last"] is None:
        row["note"] = "no batch"
        return row
    last_t, last_pos = attempts[0]["last"]
    if len(attempts) < 2:
        row["note"] = "not detected" if capped else "ended without a restart"
        return row
    second = attempts[1]
    row["detect"] = (stall_ts if stall_ts is not None else second["start"]) - last_t
    if second["first"] is not None:
        row["recover"] = second["first"] - last_t
    row["redone"] = (last_pos[1] - second["resume"][1]) if last_pos[0] == second["resume"][0] else None
    row["note"] = attempts[0].get("save", "")
    return row


def _procs(marker: Path) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if str(marker) in " ".join(p.info["cmdline"] or ()) and "trainctl" not in (p.info["cmdline"] or [""])[1:3]:
                out.append(p)
        except psutil.Error:
            continue
    return out


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _kill_all(proc: subprocess.Popen, marker: Path) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()
    for p in _procs(marker):
        try:
            p.kill()
        except psutil.Error:
            pass


def trainer_lines() -> dict[str, int]:
    """Lines of the loop that speak trainctl's protocol (report.*): what trainctl needs
    beyond a loop that can resume; torchrun needs none beyond that (and `--resume auto`)."""
    text = EXAMPLE.read_text().splitlines()
    return {"trainctl": sum(1 for ln in text if "report." in ln and not ln.lstrip().startswith("#")
                            and "``" not in ln), "torchrun": 0}


def fmt(v, spec=".1f") -> str:
    return "—" if v is None else format(v, spec)


def table(rows: list[dict]) -> str:
    code = trainer_lines()
    out = ["| fault | tool | detection s | hang → first new batch s | batches redone | "
           "processes left over | trainer lines changed | notes |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        detect = fmt(r["detect"]) if r["detect"] is not None else (r["note"] or "—")
        out.append(f"| {r['fault']} | {r['tool']} | {detect} | {fmt(r['recover'])} | "
                   f"{fmt(r['redone'], 'd')} | {fmt(r['left'], 'd')} | {code[r['tool']]} | "
                   f"{r['note'] if r['detect'] is not None else ''} |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cap", type=float, default=30.0, help="seconds per fault and tool")
    p.add_argument("--faults", default=",".join(FAULTS))
    p.add_argument("--tools", default="trainctl,torchrun")
    args = p.parse_args()
    rows = []
    for fault in args.faults.split(","):
        for tool in args.tools.split(","):
            row = measure(tool, fault, args.cap)
            print(row, flush=True)
            rows.append(row)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
