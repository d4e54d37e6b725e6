"""What watching a script's checkpoints costs the agent on a big working directory (prints
figures; asserts nothing).

Usage: .venv/bin/python bench/bench_checkpoint_watch.py [--files 100000] [--seconds 30]

Makes a tree of ``--files`` files (100 per folder) in a temporary directory, then runs a
real ``trainctl run --json -- python -c "<sleep>"`` twice for ``--seconds`` each: with that
tree as the working directory (every folder watched with inotify, agent/checkpoint_watch.py)
and with an empty one.  It prints the CPU seconds of trainctl's own processes (the
sleeping trainer excluded) in each, idle and in all; first, in process, what adding the
watches to every folder costs, and what one bounded scan of the same tree would cost
instead (os.walk + stat of every file), for comparison.  Then one checkpoint written in the tree: the seconds from its write to its
journaled ``checkpoint`` event.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_tables import Recorder, add_docs_flag

DOC_TABLES = {
    "checkpoint-watch": ("", "the tree (below)", "empty folder"),
    "checkpoint-watch-setup": ("what", "figure"),
}

SLEEP = (
    "import time, torch\ntime.sleep({s})\ntorch.save({{'w': torch.ones(4)}}, 'late/ckpt.pt')\ntime.sleep(3)"
)


def make_tree(root: Path, files: int) -> None:
    for i in range(files):
        d = root / f"d{i // 10000}" / f"e{i // 100}"
        if i % 100 == 0:
            d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.txt").write_bytes(b"x")
    (root / "late").mkdir()


def agent_cpu(proc: psutil.Process) -> float:
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            if p.cmdline()[1:2] == ["-c"]:
                continue  # the trainer (the agent's own argv holds its code too)
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def run(cwd: Path, seconds: float, run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "trainctl", "run", "--json", "--run-dir", str(run_dir), "--no-spare"]
    cmd += ["--", sys.executable, "-c", SLEEP.format(s=seconds)]
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ps = psutil.Process(proc.pid)  # `run --json`: the agent itself
    time.sleep(5)  # started, the tree walked
    c0, t0 = agent_cpu(ps), time.monotonic()
    time.sleep(seconds - 6)
    c1, t1 = agent_cpu(ps), time.monotonic()
    time.sleep(max(0.0, seconds - (t1 - t0) - 5.5))
    total = agent_cpu(ps)  # its whole life so far, the start and the checkpoint check included
    proc.wait(timeout=seconds + 60)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    start = events[0]["ts"]  # the agent's first event
    watch = next((e for e in events if e["type"] == "info" and e.get("key") == "checkpoints.watch"), None)
    found = next((e for e in events if e["type"] == "checkpoint"), None)
    written = os.stat(cwd / "late" / "ckpt.pt").st_mtime if (cwd / "late" / "ckpt.pt").exists() else None
    return {
        "cpu_s": c1 - c0,
        "total_s": total,
        "window_s": t1 - t0,
        "watch_info_after_s": None if watch is None else watch["ts"] - start,
        "watch": None if watch is None else watch["text"],
        "found_after_write_s": None if found is None or written is None else found["ts"] - written,
    }


def watch_setup_cost(root: Path) -> tuple[float, float, int]:
    """(wall s, CPU s) of adding a watch to every folder of the tree, and the folders."""
    from trainctl.core.checkpoint_names import skipped_folder
    from trainctl.system.inotify import TreeWatch

    tree = TreeWatch(str(root), lambda parent, name: skipped_folder(name))
    w0, c0 = time.perf_counter(), time.process_time()
    tree.add_tree(str(root))
    out = (time.perf_counter() - w0, time.process_time() - c0, tree.folders)
    tree.close()
    return out


def scan_cost(root: Path) -> float:
    t0 = time.process_time()
    n = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            os.stat(os.path.join(dirpath, name))
            n += 1
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=30.0)
    add_docs_flag(ap)
    args = ap.parse_args()
    rec = Recorder(DOC_TABLES, args.docs)
    base = Path(tempfile.mkdtemp(prefix="bench-watch-"))
    try:
        big, empty = base / "big", base / "empty"
        big.mkdir()
        empty.mkdir()
        (empty / "late").mkdir()
        t0 = time.perf_counter()
        make_tree(big, args.files)
        made_s = time.perf_counter() - t0
        wall, cpu, folders = watch_setup_cost(big)
        setup: list[list[object]] = [
            ["the tree", f"{args.files:,} files in {args.files // 100:,} folders, made in {made_s:.1f} s"],
            [
                f"adding the inotify watches ({folders:,} folders), once at the start",
                f"{wall:.3f} s, {cpu:.3f} s CPU",
            ],
            ["one bounded scan of it instead (walk + stat), each time", f"{scan_cost(big):.3f} s CPU"],
        ]
        runs = {}
        for name, cwd in (("big tree", big), ("empty dir", empty)):
            runs[name] = r = run(cwd, args.seconds, base / f"run-{name.replace(' ', '-')}")
            print(name, r, flush=True)
        big_r, empty_r = runs["big tree"], runs["empty dir"]
        rows: list[list[object]] = [
            [
                f"agent CPU over {big_r['window_s']:.0f} s idle",
                f"{big_r['cpu_s']:.2f} s",
                f"{empty_r['cpu_s']:.2f} s",
            ],
            ["agent CPU in all (start included)", f"{big_r['total_s']:.2f} s", f"{empty_r['total_s']:.2f} s"],
            [
                "a checkpoint journaled after its write",
                f"{big_r['found_after_write_s']:.2f} s",
                f"{empty_r['found_after_write_s']:.2f} s",
            ],
            ["the watch (its journal line)", big_r["watch"] or "—", empty_r["watch"] or "—"],
        ]
        rec.publish("checkpoint-watch", rows)
        rec.publish("checkpoint-watch-setup", setup)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
