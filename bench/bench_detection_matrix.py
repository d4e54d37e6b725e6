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
below cover each value of each axis at least once (see ``CELLS``).  The stall event goes out
at detection (its diagnosis ``diagnosing``); the verdict is the ``stall_diagnosis`` event after
it.  The table goes through bench/doc_tables.py (``--docs``: into docs/benchmarks.md, block
``detection-matrix``, or ``detection-matrix-healthy`` for the H cells).
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

sys.path.insert(0, str(ROOT / "bench"))
from doc_tables import Recorder, add_docs_flag  # noqa: E402

DOC_TABLES = {
    "detection-matrix": (
        "#",
        "fault",
        "when",
        "format",
        "launcher",
        "stall after the hang s",
        "verdict (after the stall)",
        "threshold that applied",
        "why the stall (its words)",
        "load avg",
    ),
    "detection-matrix-healthy": (
        "#",
        "healthy run",
        "when",
        "format",
        "launcher",
        "stalls",
        "ended",
        "load avg",
    ),
}
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
                end = tc.wait_event(lambda e: e.type in cell.ends, cell.cap, "a stall or an exit")
                if end.type == "stall":  # the verdict on it comes after the stacks are read
                    tc.wait_event(lambda e: e.type == "stall_diagnosis", 60, "the stall's verdict")
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
    verdict = None
    if end is not None and end["type"] == "stall":  # the verdict on it follows
        verdict = next((e for e in events[events.index(end) + 1 :] if e["type"] == "stall_diagnosis"), None)
    row.update(end=end, hang_t=hang_t, verdict=verdict)
    return row


def _detail(event: dict) -> str:
    """An event's own words, cut at 160 characters."""
    return " ".join(event.get("detail", "").split())[:160]


def fmt_row(row: dict) -> list[object]:
    c = row["cell"]
    load = f"{row['load']:.1f}"
    if c.healthy:
        ok = "no stall" if row["stalls"] == 0 else f"**{row['stalls']} false stall(s)**"
        return [
            c.key,
            c.fault,
            c.when,
            c.fmt,
            c.launcher,
            ok,
            f"{row['state']} after {row['wall']:.0f} s",
            load,
        ]
    head: list[object] = [c.key, c.fault, c.when, c.fmt, c.launcher]
    end, hang_t = row.get("end"), row.get("hang_t")
    if end is None or hang_t is None:
        return [*head, f"**not caught** in {c.cap:.0f} s", "—", "—", "—", load]
    late = f"{end['ts'] - hang_t:.1f}"
    if end["type"] == "exit":
        return [
            *head,
            late,
            f"the trainer crashed: exit {end.get('returncode')}",
            "—",
            (end.get("exception") or "")[:160],
            load,
        ]
    verdict = row.get("verdict")
    if verdict is None:
        said = f"none in the journal (the stall says {end['diagnosis']})"
    else:
        culprits = verdict.get("culprits") or verdict.get("ranks") or ()
        said = f"{verdict['diagnosis']} {verdict['ts'] - end['ts']:+.1f} s"
        if culprits:
            said += f"; culprit rank {', '.join(map(str, culprits))}"
        if verdict.get("detail"):
            said += f": {_detail(verdict)}"
    rule = f"; certain: {end['certain']}" if end.get("certain") else ""
    return [*head, late, said, f"{end.get('threshold_s')} s in {end['phase']}{rule}", _detail(end), load]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="", help="comma-separated cell keys (default: all)")
    add_docs_flag(ap)
    a = ap.parse_args()
    rec = Recorder(DOC_TABLES, a.docs)
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
    faulty: list[list[object]] = []
    healthy: list[list[object]] = []
    for cell in chosen:
        tmp = home / f"cell{cell.key}"
        tmp.mkdir()
        row = fmt_row(run_cell(cell, tmp))
        (healthy if cell.healthy else faulty).append(row)
        print(" | ".join(map(str, row)), flush=True)
    if faulty:
        rec.publish("detection-matrix", faulty)
    if healthy:
        rec.publish("detection-matrix-healthy", healthy)
    shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
