"""The detection matrix (issue 26): real hangs, every fault, every moment, every format and
every launcher at least once, with trainctl's defaults (no --stall-timeout, no window set).

    .venv/bin/python bench/bench_detection_matrix.py [--cells 1,5,H1] [--write docs/benchmarks.md]

Each cell runs ``trainctl run --json --max-restarts 0`` (a restart is not what is measured)
on a real trainer, waits for the stall (or the failure, for a killed worker), and reads from
the journal and the trainer's own clock:

* latency = the stall event − when the hang began (the trainer's ``hang_at`` file; else the
  moment the bench stopped it; else its last progress or phase before the stall)
* the threshold that applied and what it was (the stall's detail), the diagnosis, the
  culprit ranks

Healthy counterparts run to their end: any stall is a false stall.  The full product
(6 faults × 7 moments × 3 formats × 4 launchers) would take hours on a 2-core box; the cells
below cover each value of each axis at least once (see ``CELLS``).  The table (markdown) is
printed, and with ``--write`` it replaces the section between the markers in the file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.conftest import PYTHON, start_trainctl, write_command_job, write_ultralytics_job  # noqa: E402
from tests.helpers.hangs import SCRIPTS, STEADY, TRAIN_LOOP  # noqa: E402

BEGIN, END = "<!-- detection-matrix:begin -->", "<!-- detection-matrix:end -->"
MIDEPOCH = ROOT / "examples" / "midepoch_resume.py"
DDP = SCRIPTS / "ddp_unknown.py"
CASES = SCRIPTS / "startup_cases.py"


@dataclass
class Cell:
    key: str
    fault: str
    when: str
    fmt: str
    launcher: str
    args: object  # (tmp) -> (trainctl args, env)
    healthy: bool = False
    trigger: object = None  # (tc) -> the time the bench made the hang, or None
    cap: float = 240.0
    why: str = ""
    env: dict = field(default_factory=dict)
    ends: tuple = ("stall", "exit")  # the events that end a faulty cell


def _plain(*script: str):
    return lambda tmp: ["run", "--json", "--max-restarts", "0", "--", PYTHON, "-u", *script]


def _loop(*extra: str):
    return _plain(str(TRAIN_LOOP), "--epochs", "3", "--batches", "20", "--workers", "1", *extra)


def _pattern(tmp: Path):
    job = write_command_job(
        tmp / "job",
        [
            PYTHON,
            "-u",
            str(STEADY),
            "--epochs",
            "3",
            "--batches",
            "30",
            "--hang-kind",
            "main",
            "--hang-at",
            "2:10",
        ],
    )
    job.write_text(
        job.read_text() + "\n[progress]\npattern = 'epoch=(?P<epoch>\\d+)/\\d+ "
        "batch=(?P<batch>\\d+)/(?P<batches>\\d+) loss=(?P<loss>[\\d.]+)'\n"
    )
    return ["run", str(job), "--json", "--max-restarts", "0"]


def _yolo_job(tmp: Path):
    job = write_ultralytics_job(tmp / "job", n_train=16, n_val=64, batch=4, epochs=2)
    preset = tmp / "Bval.toml"
    preset.write_text(
        (ROOT / "src" / "trainctl" / "presets" / "B.toml").read_text().replace("val = false", "val = true")
    )
    return ["run", str(job), "--json", "--preset", str(preset), "--max-restarts", "0"]


def _yolo_script(tmp: Path):
    from trainctl.config.demo import make_dataset

    data = make_dataset(tmp / "data", n_train=16, n_val=8, size=64)
    return [
        "run",
        "--json",
        "--max-restarts",
        "0",
        "--",
        PYTHON,
        str(SCRIPTS / "plain_yolo.py"),
        str(data),
        "2",
        str(tmp / "runs"),
    ]


def _resume(tmp: Path):
    ck = tmp / "ck.json"
    return [
        "run",
        "--json",
        "--max-restarts",
        "1",
        "--resume-arg=--resume",
        f"--resume-arg={ck}",
        "--",
        PYTHON,
        "-u",
        str(TRAIN_LOOP),
        "--epochs",
        "3",
        "--batches",
        "20",
        "--workers",
        "1",
        "--batch-time",
        "0.5",
        "--checkpoint",
        str(ck),
        "--hang-attempt",
        "2",
        "--hang-at",
        "2:1",
    ]


def _stop_in_val(tc) -> float:
    start = tc.wait_event("start", 120)
    tc.wait_event(lambda e: e.type == "phase" and e.phase == "val", 200, "phase val")
    os.kill(start.pid, signal.SIGSTOP)
    return time.time()


def _restart_after_epoch_1(tc) -> None:
    # epoch 2 has 20 batches of 0.5 s: the restart comes before its end (resumes at epoch 2)
    tc.wait_event(lambda e: e.type == "progress" and e.epoch == 2 and (e.batch or 0) >= 3, 120, "epoch 2")
    from tests.e2e.conftest import run_trainctl

    run_trainctl(["ctl", str(tc.run_dir), "restart"], timeout=30)
    return None


CELLS = [
    Cell(
        "1",
        "DataLoader worker deadlock",
        "before the first batch",
        "known",
        "plain",
        _loop("--hang-kind", "worker", "--hang-at", "1:1"),
        why="the start-up still-tree window",
    ),
    Cell(
        "2",
        "rank stuck in a collective (its peer's worker deadlocked)",
        "mid-epoch",
        "unknown before #26 (bar-less tqdm)",
        "torchrun 2 ranks (gloo)",
        lambda tmp: [
            "run",
            "--json",
            "--max-restarts",
            "0",
            "--",
            PYTHON,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(DDP),
            "--hang-at",
            "2:5",
        ],
        why="the issue's job; culprit named",
    ),
    Cell(
        "3",
        "main-thread deadlock (Event)",
        "mid-epoch",
        "[progress] pattern",
        "plain (job file)",
        _pattern,
        why="a user pattern read first",
    ),
    Cell(
        "4",
        "native spin (catastrophic regex)",
        "after a mid-epoch save",
        "known",
        "plain",
        _plain(
            str(MIDEPOCH),
            "--epochs",
            "2",
            "--batches",
            "40",
            "--save-every",
            "20",
            "--hang-kind",
            "spin",
            "--hang-at",
            "1:21",
            "--checkpoint-dir",
            "{tmp}/ck",
        ),
        why="the save ends at its train phase",
    ),
    Cell(
        "5",
        "SIGSTOP of the main process",
        "during the first validation",
        "known (side channel)",
        "Ultralytics job",
        _yolo_job,
        trigger=_stop_in_val,
        why="nothing learned about validation",
    ),
    Cell(
        "6",
        "killed DataLoader worker",
        "mid-epoch",
        "known",
        "plain",
        _loop("--hang-kind", "worker-exit", "--hang-at", "2:5"),
        why="torch raises: a crash, not a stall",
    ),
    Cell(
        "7",
        "main-thread deadlock (Event)",
        "the first batch after validation",
        "known (side channel)",
        "zero-code Ultralytics script",
        _yolo_script,
        env={"PLAIN_YOLO_HANG_EPOCH": "2"},
        why="the phase lasts until the first batch",
    ),
    Cell(
        "8",
        "DataLoader worker deadlock",
        "after an epoch-end save",
        "known",
        "plain",
        lambda tmp: _loop("--checkpoint", str(tmp / "ck.json"), "--hang-kind", "worker", "--hang-at", "2:1")(
            tmp
        ),
        why="the gap after the epoch's last batch",
    ),
    Cell(
        "9",
        "DataLoader worker deadlock",
        "the first batch after a resume",
        "known",
        "plain",
        _resume,
        trigger=_restart_after_epoch_1,
        cap=300,
        ends=("stall",),
        why="a planned restart, then the hang",
    ),
    Cell(
        "10",
        "main-thread deadlock (lock)",
        "mid-run (no batch ever read)",
        "unknown (steady printer)",
        "plain",
        _plain(str(CASES), "steady-hang", "60", "0.2"),
        why="silence against the intervals",
    ),
    Cell(
        "H1",
        "healthy: a 60 s CPU-busy silent validation",
        "between epochs",
        "known",
        "plain",
        _loop("--epochs", "2", "--val-time", "60"),
        healthy=True,
    ),
    Cell(
        "H2",
        "healthy: a 60 s CPU-busy first batch after validation",
        "the first batch after validation",
        "known",
        "plain",
        _loop("--epochs", "2", "--val-time", "3", "--first-load-time", "60"),
        healthy=True,
    ),
    Cell(
        "H3",
        "healthy: 95 s CPU-busy start-up (a kernel search), then 95 s of dataset caching (I/O)",
        "before the first batch",
        "known",
        "plain",
        _plain(str(CASES), "busy", "95", "95"),
        healthy=True,
        cap=400,
    ),
]


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_cell(cell: Cell, tmp: Path) -> dict:
    args = [a.replace("{tmp}", str(tmp)) for a in cell.args(tmp)]
    env = dict(os.environ, **cell.env)
    t0 = time.time()
    made = None
    with start_trainctl(args, env=env) as tc:
        if cell.trigger is not None:
            made = cell.trigger(tc)
        try:
            if cell.healthy:
                tc.wait(cell.cap)
            else:
                tc.wait_event(lambda e: e.type in cell.ends, cell.cap, "a stall or an exit")
                time.sleep(1.0)
        except TimeoutError:
            pass
        run_dir = tc.run_dir
        events = _events(run_dir)
        tc.kill()
    stalls = [e for e in events if e["type"] == "stall"]
    row = {"cell": cell, "wall": time.time() - t0, "stalls": len(stalls), "load": os.getloadavg()[0]}
    if cell.healthy:
        row["state"] = next((e["state"] for e in reversed(events) if e["type"] == "state"), "?")
        return row
    hang_file = run_dir / "hang_at"
    hang_t = float(hang_file.read_text()) if hang_file.is_file() else made
    end = stalls[0] if stalls else next((e for e in events if e["type"] in cell.ends), None)
    if hang_t is None and end is not None:  # no clock from the trainer: its last word
        said = [e for e in events[: events.index(end)] if e["type"] in ("progress", "phase", "checkpoint")]
        hang_t = said[-1]["ts"] if said else None
    row.update(end=end, hang_t=hang_t)
    return row


def _detail(stall: dict) -> str:
    """The verdict's reason: the last balanced "(...)" of the stall's detail."""
    text = stall.get("detail", "").rstrip()
    if text.endswith(")"):
        depth = 0
        for i in range(len(text) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(text[i], 0)
            if depth == 0:
                return text[i + 1 : -1][:160]
    return text[:160]


def fmt_row(row: dict) -> str:
    c = row["cell"]
    head = f"| {c.key} | {c.fault} | {c.when} | {c.fmt} | {c.launcher} |"
    if c.healthy:
        ok = "no stall" if row["stalls"] == 0 else f"**{row['stalls']} false stall(s)**"
        return f"{head} {ok} | — | ended {row['state']} after {row['wall']:.0f}s | {row['load']:.1f} |"
    end, hang_t = row.get("end"), row.get("hang_t")
    if end is None or hang_t is None:
        return f"{head} **not caught** in {c.cap:.0f}s | — | — | {row['load']:.1f} |"
    late = end["ts"] - hang_t
    if end["type"] == "exit":
        return (
            f"{head} {late:.1f}s (the trainer crashed: exit {end.get('returncode')}) | — | "
            f"{(end.get('exception') or '')[:100]} | {row['load']:.1f} |"
        )
    ranks = f"; culprit rank {', '.join(map(str, end['ranks']))}" if end.get("ranks") else ""
    return (
        f"{head} {late:.1f}s ({end['diagnosis']}{ranks}) | {end.get('threshold_s')}s in "
        f"{end['phase']} | {_detail(end)} | {row['load']:.1f} |"
    )


HEADER = (
    "| # | fault | when | format | launcher | caught after the hang (diagnosis) | threshold "
    "that applied | why (the verdict's words) | load avg |\n|---|---|---|---|---|---|---|---|---|"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="", help="comma-separated cell keys (default: all)")
    ap.add_argument("--write", default="", help="replace the matrix section of this markdown file")
    a = ap.parse_args()
    chosen = [c for c in CELLS if not a.cells or c.key in a.cells.split(",")]
    home = Path(tempfile.mkdtemp(prefix="bench-matrix-"))
    os.environ.update(
        TRAINCTL_RUNS_DIR=str(home / "runs"),
        TRAINCTL_CONFIG_DIR=str(home / "config"),
        YOLO_OFFLINE="1",
        YOLO_CONFIG_DIR=str(home / "yolo"),
    )
    os.environ.setdefault(
        "TRAINCTL_CACHE_DIR", os.environ.get("TRAINCTL_TEST_CACHE", "/tmp/trainctl-test-cache")
    )
    load0 = os.getloadavg()
    print(
        f"detection matrix, defaults; load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} "
        f"on {os.cpu_count()} CPUs",
        flush=True,
    )
    lines = []
    for cell in chosen:
        tmp = home / f"cell{cell.key}"
        tmp.mkdir()
        row = run_cell(cell, tmp)
        lines.append(fmt_row(row))
        print(lines[-1], flush=True)
    load1 = os.getloadavg()
    table = "\n".join([HEADER, *lines])
    print(table)
    if a.write:
        path = Path(a.write)
        text = path.read_text()
        body = (
            f"{BEGIN}\n{table}\n\nLoad average (1, 5, 15 min) {load0[0]:.1f} {load0[1]:.1f} "
            f"{load0[2]:.1f} at the start, {load1[0]:.1f} {load1[1]:.1f} {load1[2]:.1f} at the end "
            f"(2 cores, shared).\n{END}"
        )
        if BEGIN in text:
            text = text[: text.index(BEGIN)] + body + text[text.index(END) + len(END) :]
        else:
            text += "\n" + body + "\n"
        path.write_text(text)
    shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
