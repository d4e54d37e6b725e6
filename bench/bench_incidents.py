"""The same faults on the same PyTorch loop (examples/midepoch_resume.py) under trainctl,
under torchrun --max-restarts and under NVRx ft_launcher, and on a real Ultralytics run
under trainctl: what each costs.

    .venv/bin/python bench/bench_incidents.py [--cap 60] [--yolo-cap 240]

Faults, all at epoch 1 batch 25 of 60, first attempt only: ``deadlock`` (the DataLoader
worker loading that batch blocks forever), ``spin`` (the main thread spins in native code:
a catastrophic regex), ``killed worker`` (that worker dies: os._exit).  Per fault and tool:
detection s (the last batch before the fault → trainctl's stall event, or the launcher
starting the next attempt), hang → first new batch s, batches redone (the furthest batch
before the fault − where the next attempt resumed), processes left over (of the first
attempt, after the run ended), lines of trainer code changed for that tool.  Each fault is
capped at ``--cap`` s: a tool that has not restarted by then "did not detect" it.
Times: the trainer's own stamped lines (``--stamp``; for Ultralytics the batch stamps of
bench/ultralytics_faults), trainctl's journal, the launchers' log lines as they arrive.
NVRx (the optional ``bench`` extra) runs the loop with ``--nvrx-heartbeat``; when
ft_launcher does not import, its column says so.  trainctl restarts on its warm spare; the
rows "... cold" are the same runs with ``--no-spare``.

``--defaults``: defaults against defaults, in one invocation: a DataLoader worker deadlock
early (batch 25, the first seconds of training) and late (batch 200 of 0.2 s: past the 30 s
after which trainctl warms its spare), under trainctl, NVRx ft_launcher and torchrun each with
its shipped defaults, then each tuned to the same 4 s threshold.  A row whose tool would wait
past ``DEFAULTS_CAP_S`` by its own settings (NVRx's heartbeat timeouts, read from its
FaultToleranceConfig; torchrun, which watches exits only) is not run and says "> 10 min".

Trainer lines: one rule for every tool, the lines of the loop that end with ``# TOOL`` (its
import, its set-up, the guards that keep the loop running without it, the calls, the code that
acts on what it asks), beyond the loop's own save/resume code that every tool needs.

Tables go through bench/doc_tables.py (``--docs``: into docs/benchmarks.md, blocks
``incidents-faults`` and ``incidents-defaults``).

The Ultralytics run (trainctl only): YOLOv8n from YAML on a synthetic data set, CPU,
imgsz 64, preset A (2 spawned DataLoader workers) with fallback B; the faults come from
bench/ultralytics_faults/sitecustomize.py (on PYTHONPATH), at epoch 1 batch YOLO_HANG_AT.
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
from dataclasses import dataclass
from pathlib import Path

import psutil

from trainctl.agent.holder_spawner import SPARE_AFTER_S
from trainctl.system.process import descendants

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_tables import Recorder, add_docs_flag

DOC_TABLES = {
    "incidents-faults": (
        "fault",
        "tool",
        "detection s",
        "hang → first new batch s",
        "of which start-up s",
        "batches redone",
        "processes left over",
        "trainer lines changed",
        "load avg",
        "notes",
    ),
    "incidents-defaults": (
        "hang",
        "tool",
        "settings",
        "detection s",
        "hang → first new batch s",
        "of which start-up s",
        "batches redone",
        "processes left over",
        "trainer lines changed",
        "load avg",
        "notes",
    ),
}

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "midepoch_resume.py"
FAULTS = {"deadlock": "worker", "spin": "spin", "killed worker": "worker-exit", "planned restart": ""}
PLANNED = "planned restart"  # trainctl only: `trainctl ctl RUN restart` on a healthy run mid-epoch
HANG_AT = (1, 25)
STALL_S = 4  # trainctl --stall-timeout; NVRx --ft-rank-heartbeat-timeout
WATCH_S = 0.5  # NVRx --ft-workload-check-interval (trainctl watches every 0.5 s)
NVRX = [
    "--ft-initial-rank-heartbeat-timeout",
    "60",
    "--ft-rank-heartbeat-timeout",
    str(STALL_S),
    "--ft-workload-check-interval",
    str(WATCH_S),
    "--ft-enable-nic-monitor",
    "false",
]
YOLO = "trainctl (Ultralytics)"
COLD = " cold"  # a trainctl tool's name + COLD: the same run with --no-spare (no warm spare)
YOLO_TRAIN, YOLO_BATCH, YOLO_HANG_AT, YOLO_EVERY = 80, 4, 12, "3s"  # 20 batches an epoch
YOLO_NBS = 8  # an optimizer step every 2 batches (Ultralytics' default nbs 64: every 16)
YOLO_STALL_S = 10  # batches of 1-5 s on the 2 shared cores: 4 s saw false stalls
FAULTS_DIR = ROOT / "bench" / "ultralytics_faults"
DEFAULTS_CAP_S = 600.0  # --defaults: a tool that would wait longer says "> 10 min"


@dataclass(frozen=True)
class Moment:
    """Where in the loop's one epoch the hang comes (the loop's length and pace with it)."""

    name: str
    batches: int
    batch_time: float
    hang_at: int


EARLY = Moment("early (batch 25 of 0.03 s)", 60, 0.03, 25)
LATE = Moment("late (batch 200 of 0.2 s)", 240, 0.2, 200)
TRAINCTL_TUNED = ["--stall-timeout", str(STALL_S)]  # --defaults: the threshold alone
# Lines of the launchers' logs that say they saw the fault (their detection).
LAUNCHER_SAW = re.compile(r"Did not get subsequent heartbeat|FT timeout elapsed|failed \(exitcode")


def loop_args(ckpts: Path, kind: str, moment: Moment = EARLY) -> list[str]:
    hang = (
        ["--hang-at", f"{HANG_AT[0]}:{moment.hang_at}", "--hang-kind", kind, "--hang-attempt", "1"]
        if kind
        else []
    )
    return [
        str(EXAMPLE),
        "--epochs",
        "1",
        "--batches",
        str(moment.batches),
        "--batch-time",
        str(moment.batch_time),
        "--save-every",
        "10",
        "--checkpoint-dir",
        str(ckpts),
        "--stamp",
        *hang,
    ]


def command(
    tool: str, ckpts: Path, kind: str, run_dir: Path, flags: list[str] | None = None, moment: Moment = EARLY
) -> list[str]:
    """The tool's command line; ``flags``: its settings (None: the faults table's)."""
    py = sys.executable
    if tool == "trainctl":
        return [
            py,
            "-m",
            "trainctl",
            "run",
            "--json",
            *(["--stall-timeout", str(STALL_S), "--rescue-wait", "10"] if flags is None else flags),
            "--max-restarts",
            "2",
            "--run-dir",
            str(run_dir),
            "--resume-arg=--resume",
            "--resume-arg={checkpoint}",
            "--",
            py,
            "-u",
            *loop_args(ckpts, kind, moment),
        ]
    if tool == "nvrx":
        return [
            py,
            "-m",
            "nvidia_resiliency_ext.fault_tolerance.launcher",
            "--standalone",
            "--nproc-per-node",
            "1",
            "--max-restarts",
            "2",
            *(NVRX if flags is None else flags),
            *loop_args(ckpts, kind, moment),
            "--resume",
            "auto",
            "--nvrx-heartbeat",
        ]
    return [
        py,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "1",
        "--max-restarts",
        "2",
        *loop_args(ckpts, kind, moment),
        "--resume",
        "auto",
    ]


def nvrx_missing() -> str | None:
    """Why ft_launcher cannot run here (None: it imports)."""
    r = subprocess.run(
        [sys.executable, "-c", "import nvidia_resiliency_ext.fault_tolerance.launcher"],
        capture_output=True,
        text=True,
    )
    if r.returncode == 0:
        return None
    last = (r.stderr.strip().splitlines() or ["?"])[-1]
    return (
        "not installed" if "No module named 'nvidia_resiliency_ext'" in last else f"does not import: {last}"
    )


def yolo_job(root: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    from tests.e2e.conftest import write_ultralytics_job

    job = write_ultralytics_job(
        root,
        n_train=YOLO_TRAIN,
        n_val=4,
        epochs=1,
        batch=YOLO_BATCH,
        preset="A",
        fallback="B",
        extra={"nbs": YOLO_NBS},
    )
    job.write_text(f'checkpoint_every = "{YOLO_EVERY}"\n' + job.read_text())  # a top-level key
    return job


def measure(
    tool: str, fault: str, cap: float, flags: list[str] | None = None, moment: Moment = EARLY
) -> dict:
    """One run.  ``flags`` None: the faults table's settings, with TRAINCTL_SPARE_AFTER=0 (the
    spare warmed at the first batch: a run's default is after 30 s of training, the fault here
    comes 2 s in); else the tool's settings are ``flags`` and the spare keeps its default."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-incidents-"))
    ckpts, run_dir = tmp / "ckpts", tmp / "run"
    named, tool, cold = tool, tool.removesuffix(COLD), tool.endswith(COLD)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    if flags is None:
        env["TRAINCTL_SPARE_AFTER"] = "0"
    else:
        env.pop("TRAINCTL_SPARE_AFTER", None)
    if tool == YOLO:
        py = sys.executable
        argv = [
            py,
            "-m",
            "trainctl",
            "run",
            str(yolo_job(tmp)),
            "--json",
            "--stall-timeout",
            str(YOLO_STALL_S),
            "--rescue-wait",
            "10",
            "--max-restarts",
            "2",
            "--run-dir",
            str(run_dir),
        ]
        env.update(
            PYTHONPATH=os.pathsep.join([str(FAULTS_DIR), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            BENCH_STAMPS=str(tmp / "stamps.txt"),
            BENCH_FAULT=FAULTS[fault],
            BENCH_FAULT_BATCH=str(YOLO_HANG_AT),
            BENCH_WORKERS="2",
            BENCH_BATCH_SIZE=str(YOLO_BATCH),
            YOLO_OFFLINE="1",
            YOLO_CONFIG_DIR=str(tmp / "yolo-config"),
        )
        env.pop("OMP_NUM_THREADS")  # the preset sets it
    else:
        argv = command(tool, ckpts, FAULTS[fault], run_dir, flags, moment)
    if cold:  # the same run without the warm spare
        argv.insert(argv.index("--json") + 1, "--no-spare")
    lines: list[tuple[float, str]] = []
    load0 = os.getloadavg()[0]
    t0 = time.time()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env=env,
        start_new_session=True,
        text=True,
    )

    def pump():
        for line in proc.stdout:
            lines.append((time.time(), line))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    seen: set[psutil.Process] = set()  # every process of the tree, while it ran
    capped = False
    stamped = tmp / "stamps.txt" if tool == YOLO else run_dir / "train.log"
    at = YOLO_HANG_AT if tool == YOLO else moment.hang_at
    asked = None
    while proc.poll() is None:
        if time.time() - t0 > cap:
            capped = True
            break
        seen |= set(descendants(proc.pid)) | set(_procs(ckpts))
        if fault == PLANNED and asked is None and _reached(stamped, at):
            asked = subprocess.Popen(
                [sys.executable, "-m", "trainctl", "ctl", str(run_dir), "restart"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        time.sleep(0.2)
    if asked is not None:
        asked.wait(30)
    time.sleep(1.0)
    left = [p for p in seen if p.pid != proc.pid and _alive(p)] if not capped else []
    left_what = sorted({_what(p) for p in left})
    _kill_all(proc, ckpts)
    for p in seen:  # a capped run: its holder and trainer live in their own sessions
        for q in [p, *descendants(p.pid)]:
            try:
                q.kill()
            except psutil.Error:
                pass
    reader.join(2)
    (tmp / "output.txt").write_text("".join(f"{t:.3f} {ln}" for t, ln in lines))  # to look into a row
    text = [(float(m[1]), ln.rstrip()) for _t, ln in lines if (m := re.search(r" t=([0-9.]+)$", ln.rstrip()))]
    text += [(t, "STALL") for t, ln in lines if LAUNCHER_SAW.search(ln)]
    if tool in ("trainctl", YOLO):  # the trainer's own lines are in train.log, the events on stdout
        text = _trainctl_lines(run_dir, tmp / "stamps.txt" if tool == YOLO else run_dir / "train.log")
    row = _figures(tool, fault, sorted(text, key=lambda x: x[0]), left, capped, run_dir)
    row["load"], row["tool"] = (load0, os.getloadavg()[0]), named
    if fault == PLANNED and row["detect"] is not None:
        row["detect"] = "asked"  # nothing to detect: `trainctl ctl restart`
    if left_what:
        row["note"] = "; ".join(filter(None, [row["note"], "left over: " + ", ".join(left_what)]))
    return row


def _reached(stamped: Path, batch: int) -> bool:
    try:
        return f" batch={batch}/" in stamped.read_text(errors="replace")
    except OSError:
        return False


def _what(p: psutil.Process) -> str:
    try:
        cmd = p.cmdline()
    except psutil.Error:
        return f"pid {p.pid}"
    if any("spawn_main" in c or "multiprocessing" in c for c in cmd):
        return "a DataLoader worker"
    if any("midepoch_resume.py" in c for c in cmd):
        parent = p.ppid()
        return "a DataLoader worker (orphaned)" if parent == 1 else "the trainer"
    return os.path.basename(cmd[0]) if cmd else f"pid {p.pid}"


def _trainctl_lines(run_dir: Path, stamped: Path) -> list[tuple[float, str]]:
    """The trainer's stamped lines (train.log, or the Ultralytics batch stamps); the first
    of stall, exit and restart after the fault, and the save-request infos, from the journal."""
    import json

    out = []
    try:
        log = stamped.read_text(errors="replace").splitlines()
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
        if ev.get("type") in ("stall", "exit", "restart"):
            out.append((ev["ts"], "STALL"))
        if ev.get("type") == "start":
            out.append((ev["ts"], f"SPAWN {ev['attempt']}"))
        if ev.get("type") == "restart" and ev.get("resume_from"):
            out.append((ev["ts"], f"FROM {Path(ev['resume_from']).name}"))
        elif ev.get("type") == "info" and ev.get("key", "").startswith("save_request_"):
            out.append((ev["ts"], f"INFO {ev['text']}"))
    return sorted(out, key=lambda x: x[0])


def _figures(tool, fault, text, left, capped, run_dir) -> dict:
    attempts: list[dict] = []
    stalls: list[float] = []
    spawns: dict[int, float] = {}  # trainctl: when each attempt was started
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
        elif ln == "STALL":
            stalls.append(t)
        elif ln.startswith("SPAWN "):
            spawns[int(ln[6:])] = t
        elif ln.startswith("INFO "):
            if attempts:  # the last answer before the restart (a false stall may have asked earlier)
                attempts[-1]["save"] = re.sub(r"/\S*/", "", ln[5:].strip())
        elif ln.startswith("FROM ") and attempts:
            attempts[-1].setdefault("from", ln[5:])
    row = {
        "tool": tool,
        "fault": fault,
        "detect": None,
        "recover": None,
        "redone": None,
        "left": None if capped else len(left),
        "note": "",
        "startup": None,
    }
    if not attempts or attempts[0]["last"] is None:
        row["note"] = "no batch"
        return row
    last_t, last_pos = attempts[0]["last"]
    if len(attempts) < 2:
        row["note"] = "not detected" if capped else "ended without a restart"
        return row
    second = attempts[1]
    stall_ts = next((t for t in stalls if t >= last_t), None)  # not a false stall before the fault
    row["detect"] = (stall_ts if stall_ts is not None else second["start"]) - last_t
    if second["first"] is not None:
        row["recover"] = second["first"] - last_t
        if 2 in spawns:
            row["startup"] = second["first"] - spawns[2]
    row["redone"] = (last_pos[1] - second["resume"][1]) if last_pos[0] == second["resume"][0] else None
    row["note"] = "; ".join(
        filter(
            None,
            [attempts[0].get("save", ""), attempts[0].get("from") and f"resumed from {attempts[0]['from']}"],
        )
    )
    return row


def _procs(marker: Path) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if (
                str(marker) in " ".join(p.info["cmdline"] or ())
                and "trainctl" not in (p.info["cmdline"] or [""])[1:3]
            ):
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


def trainer_lines() -> dict[str, int | str]:
    """The lines of the loop there only for each tool, by one rule: those that end with
    ``# trainctl`` or ``# nvrx`` (imports, set-up, guards, calls, and the code acting on a
    request all carry the mark); torchrun needs none beyond the loop's own resume
    (``--resume auto``); the Ultralytics runner none (``checkpoint_every`` in the job file)."""
    text = EXAMPLE.read_text().splitlines()
    return {
        "trainctl": sum(1 for ln in text if ln.rstrip().endswith("# trainctl")),
        "nvrx": sum(1 for ln in text if ln.rstrip().endswith("# nvrx")),
        "torchrun": 0,
        YOLO: "0 (job file)",
    }


def fmt(v, spec=".1f") -> str:
    return "—" if v is None else format(v, spec)


def cells(r: dict) -> list[object]:
    """A row's cells from ``detection s`` on (the columns after the row's names in DOC_TABLES)."""
    code = trainer_lines()
    if r.get("over"):  # not run: the tool's own settings wait past the cap
        return [r["over"], r["over"], "—", "—", "—", code[r["tool"]], "—", r["note"]]
    detect = (
        (r["detect"] if isinstance(r["detect"], str) else fmt(r["detect"]))
        if r["detect"] is not None
        else (r["note"] or "—")
    )
    load = "{:.1f}→{:.1f}".format(*r["load"]) if r.get("load") else "—"
    return [
        detect,
        fmt(r["recover"]),
        fmt(r.get("startup")),
        fmt(r["redone"], "d"),
        fmt(r["left"], "d"),
        code[r["tool"].removesuffix(COLD)],
        load,
        r["note"] if r["detect"] is not None else "",
    ]


def tool_name(tool: str) -> str:
    return "NVRx ft_launcher" if tool == "nvrx" else tool


def nvrx_defaults() -> dict[str, float | None]:
    """ft_launcher's shipped timeouts (its FaultToleranceConfig), in seconds."""
    from nvidia_resiliency_ext.fault_tolerance.config import FaultToleranceConfig

    c = FaultToleranceConfig()
    return {
        "initial": c.initial_rank_heartbeat_timeout,
        "rank": c.rank_heartbeat_timeout,
        "interval": c.workload_check_interval,
    }


def _minutes(s: float | None) -> str:
    return "none" if s is None else f"{s / 60:g} min"


def setups(missing: str | None) -> list[tuple[str, str, list[str], str | None]]:
    """(tool, settings as the row says them, flags, why it is not run or None) for --defaults."""
    cap = f"> {DEFAULTS_CAP_S / 60:g} min"
    torchrun_why = f"{cap}: not run: torchrun watches exits only, no setting of it sees a hang"
    if missing:
        nvrx_default, nvrx_why = "defaults", f"ft_launcher {missing}"
    else:
        d = nvrx_defaults()
        nvrx_default = (
            f"defaults: first heartbeat within {_minutes(d['initial'])}, then every "
            f"{_minutes(d['rank'])}, checked every {d['interval']:g} s"
        )
        waits = [w for w in (d["initial"], d["rank"]) if w is not None]
        nvrx_why = (
            f"{cap}: not run: its {_minutes(min(waits) if waits else None)} heartbeat timeout is past the cap"
            if not waits or min(waits) > DEFAULTS_CAP_S
            else None
        )
    spare = f"the spare warmed after {SPARE_AFTER_S:g} s of training"
    return [
        ("trainctl", f"defaults ({spare})", [], None),
        ("nvrx", nvrx_default, [], nvrx_why),
        ("torchrun", "defaults", [], torchrun_why),
        ("trainctl", " ".join(TRAINCTL_TUNED) + f" ({spare})", TRAINCTL_TUNED, None),
        ("nvrx", " ".join(NVRX), NVRX, f"ft_launcher {missing}" if missing else None),
        ("torchrun", "no hang threshold to tune", [], torchrun_why),
    ]


def defaults_rows(missing: str | None) -> list[list[object]]:
    rows = []
    for moment in (EARLY, LATE):
        for tool, settings, flags, why in setups(missing):
            if why is not None:
                over = why.split(":", 1)[0] if why.startswith(">") else None
                r = {"tool": tool, "over": over or "—", "note": why.split(": ", 1)[-1] if over else why}
            else:
                r = measure(tool, "deadlock", DEFAULTS_CAP_S, flags, moment)
            print(r, flush=True)
            rows.append([moment.name, tool_name(tool), settings, *cells(r)])
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cap", type=float, default=60.0, help="seconds per fault and tool (the loop)")
    p.add_argument("--yolo-cap", type=float, default=240.0, help="seconds per fault (Ultralytics)")
    p.add_argument("--faults", default=",".join(FAULTS))
    p.add_argument("--tools", default=f"trainctl,trainctl{COLD},torchrun,nvrx,{YOLO},{YOLO}{COLD}")
    p.add_argument("--defaults", action="store_true", help="defaults against defaults, then tuned alike")
    add_docs_flag(p)
    args = p.parse_args()
    rec = Recorder(DOC_TABLES, args.docs)
    if args.defaults:
        rec.publish("incidents-defaults", defaults_rows(nvrx_missing()))
        return 0
    tools = args.tools.split(",")
    missing = nvrx_missing() if "nvrx" in tools else None
    rows = []
    for fault in args.faults.split(","):
        for tool in tools:
            if fault == PLANNED and tool in ("torchrun", "nvrx"):
                continue  # a launcher restarts on a failure only
            if tool == "nvrx" and missing:
                row = {
                    "tool": tool,
                    "fault": fault,
                    "detect": None,
                    "recover": None,
                    "redone": None,
                    "left": None,
                    "note": f"ft_launcher {missing}",
                    "startup": None,
                }
            else:
                row = measure(tool, fault, args.yolo_cap if tool.startswith(YOLO) else args.cap)
            print(row, flush=True)
            rows.append([fault, tool_name(row["tool"]), *cells(row)])
    rec.publish("incidents-faults", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
