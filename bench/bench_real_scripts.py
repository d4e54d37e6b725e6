"""Public training scripts nobody here wrote, each run unmodified under trainctl's defaults.

    python bench/bench_real_scripts.py --scripts DIR [--only NAME ...] [--docs]

The scripts are not in this repository: ``DIR`` holds them, one folder per origin as
bench/real_scripts.toml names it (its ``folder``; the manifest records each script's origin,
commit, licence, the command with tiny settings on CPU, how it resumes and what it should
show).  For each script the bench copies its folder into a fresh work directory, writes the
synthetic data it reads (bench/real_scripts_data.py: no network here), and runs, as the
README says, ``trainctl run --json -- python script.py ...`` with trainctl's defaults (the
script's own resume flag and checkpoint glob where the manifest names them).  It waits for the
first progress and for the script's own first checkpoint, lets it train on a few batches,
then makes it hang as a user's run hangs: one of its DataLoader workers stopped (SIGSTOP),
or, where it has none, its main process stopped.  It reads from the run's journal:

- format read: the reader that claimed its progress lines (``trainctl scan --explain`` over
  the run's train.log), or the zero-code integration that attached;
- loss read: the loss names of the progress events;
- caught after: the journal's time from the last progress before the stall to the stall, and
  the verdict;
- resumed from: what the restart resumed from (the script's own file, through trainctl's copy),
  and whether the script's log says it resumed (the manifest's ``resumed_line``);
- work redone: the batches the restarted attempt does again (the restart's ``resume_redone``);
- left running: processes of the run or under its work directory once ``ctl stop`` returned.

Load matters on a 2-core box: the provenance line of the table carries /proc/loadavg at
the start and the end.  bench/doc_tables.py writes the table (``--docs``: into
docs/benchmarks.md, block ``real-scripts``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.conftest import Trainctl, run_trainctl, start_trainctl  # noqa: E402
from trainctl.agent.scan_explain import explain_log  # noqa: E402
from trainctl.core import events as E  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from doc_tables import Recorder, add_docs_flag  # noqa: E402
from real_scripts_data import MAKERS  # noqa: E402

DOC_TABLES = {
    "real-scripts": (
        "script",
        "commit",
        "format read",
        "loss read",
        "caught after",
        "resumed from",
        "work redone",
        "left running",
    )
}
MANIFEST = ROOT / "bench" / "real_scripts.toml"
ATTACHED = "instrument.attached."
FIRST_PROGRESS_S = 240.0  # a script's imports and data set-up on a loaded 2-core box
CAUGHT_WITHIN_S = 240.0  # the longest this bench waits for the stall (the goal is 60 s)
BATCHES_AFTER_SAVE = 3  # progress events after the first save before the hang


@dataclass(frozen=True)
class Script:
    """One entry of the manifest (bench/real_scripts.toml)."""

    name: str
    family: str
    origin: str
    path: str
    commit: str
    licence: str
    command: tuple[str, ...]
    hang: str  # worker | main
    folder: str = ""  # under --scripts DIR; "" for a script an installed package ships
    cwd: str = ""
    data: str = ""
    pythonpath: tuple[str, ...] = ()
    resume_args: tuple[str, ...] = ()
    checkpoints: tuple[str, ...] = ()
    resumes: str = ""
    saves: str = ""
    shows: str = ""
    first_save_s: float = 0.0  # 0: it saves nothing the hang could resume from
    resumed_line: str = ""  # a regex of the line the script prints when it resumed
    env: dict[str, str] = field(default_factory=dict)


def load_manifest(path: Path = MANIFEST) -> list[Script]:
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    out = []
    for entry in raw["script"]:
        for key in ("command", "pythonpath", "resume_args", "checkpoints"):
            if key in entry:
                entry[key] = tuple(entry[key])
        out.append(Script(**entry))
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise SystemExit(f"{path}: a name twice: {sorted(n for n, c in Counter(names).items() if c > 1)}")
    return out


@dataclass
class Row:
    script: Script
    format_read: str = "-"
    loss_read: str = "-"
    caught: str = "-"
    resumed: str = "-"
    redone: str = "-"
    left: str = "-"
    failed: str = ""  # what went wrong, when the run did not get through

    def cells(self) -> list[str]:
        s = self.script
        commit = s.commit[:10] if re.fullmatch(r"[0-9a-f]{40}", s.commit) else s.commit
        caught = self.caught + (f"; stopped there: {self.failed}" if self.failed else "")
        return [
            f"{s.name} ({s.path})",
            commit,
            self.format_read,
            self.loss_read,
            caught,
            self.resumed,
            self.redone,
            self.left,
        ]


def prepare(script: Script, scripts_dir: Path, into: Path) -> Path:
    """Copy the script's folder to ``into`` and write its data; return its working directory."""
    if not script.folder:  # a script an installed package ships: an empty work directory
        into.mkdir(parents=True)
    else:
        src = scripts_dir / script.folder
        if not src.is_dir():
            raise FileNotFoundError(f"{src}: no such folder (the manifest's folder for {script.name})")
        shutil.copytree(src, into, symlinks=True, ignore=shutil.ignore_patterns("_site", ".venv"))
    cwd = into / script.cwd
    if script.data:
        MAKERS[script.data](cwd)
    return cwd


def trainer_argv(script: Script) -> list[str]:
    bindir = str(Path(sys.executable).parent)
    return [a.replace("{python}", sys.executable).replace("{bin}", bindir) for a in script.command]


def run_args(script: Script) -> list[str]:
    args = ["run", "--json"]
    args += [f"--resume-arg={a}" for a in script.resume_args]
    args += [f"--checkpoints={g}" for g in script.checkpoints]
    return [*args, "--", *trainer_argv(script)]


def script_env(script: Script, scripts_dir: Path, home: Path) -> dict[str, str]:
    env = {k: v.replace("{home}", str(home)) for k, v in script.env.items()}
    paths = [str(scripts_dir / p) for p in script.pythonpath]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _progress(events: list[E.Event]) -> list[E.Progress]:
    return [e for e in events if isinstance(e, E.Progress)]


def stop_point(tc: Trainctl, start: E.Start, script: Script) -> float:
    """Wait until the hang may come: the first progress, then (where the script saves) its
    first good checkpoint (the script's own file, or the one its integration announced), then a few batches more.  Returns when the wait began."""
    began = time.time()
    tc.wait_event("progress", FIRST_PROGRESS_S, "the first progress")
    if script.first_save_s > 0:
        tc.wait_event(
            lambda e: isinstance(e, E.Checkpoint) and e.ok,  # its own (script) or its integration's
            max(120.0, 4 * script.first_save_s),
            "the script's first checkpoint",
        )
    seen = len(_progress(tc.events()))
    tc.wait_event(
        lambda e: len(_progress(tc.events())) >= seen + BATCHES_AFTER_SAVE, 120, "batches after the save"
    )
    return began


def hang(script: Script, start: E.Start) -> str:
    """Stop one DataLoader worker of the trainer, or the trainer itself; say which."""
    trainer = psutil.Process(start.pid)
    if script.hang == "worker":
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            workers = [c for c in trainer.children() if c.is_running()]
            if workers:
                workers[0].send_signal(signal.SIGSTOP)
                return f"worker {workers[0].pid} stopped"
            time.sleep(0.2)
        raise RuntimeError(f"the trainer {start.pid} has no DataLoader worker to stop")
    trainer.send_signal(signal.SIGSTOP)
    return f"trainer {start.pid} stopped"


def format_read(events: list[E.Event], log: Path) -> str:
    for e in events:
        if isinstance(e, E.Info) and e.key.startswith(ATTACHED):
            return "integration " + e.key[len(ATTACHED) :]
    readers = Counter(x.parser for x in explain_log(log) if any(ev["type"] == "progress" for ev in x.events))
    if not readers:
        return "none"
    return ", ".join(f"{name} ({n})" for name, n in readers.most_common(2))


def left_running(tc: Trainctl, work: Path) -> list[str]:
    """Processes of the run (its environment names the run directory) or under its work
    directory once the run ended."""
    found = {p.pid: p for p in tc.tree(scan_env=True) if p.pid != tc.pid}
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and Path(p.cwd()).is_relative_to(work):
                found.setdefault(p.pid, p)
        except (psutil.Error, OSError):
            continue
    out = []
    for p in found.values():
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid} {' '.join(p.cmdline())[:60]}")
        except psutil.Error:
            continue
    return out


def one_script(script: Script, scripts_dir: Path, home: Path) -> Row:
    row = Row(script)
    work = home / script.name
    cwd = prepare(script, scripts_dir, work)
    env = script_env(script, scripts_dir, home)
    tc = start_trainctl(run_args(script), env=env, run_dir=home / "runs" / script.name, cwd=cwd)
    try:
        start = tc.wait_event("start", 120)
        assert isinstance(start, E.Start)
        stop_point(tc, start, script)
        said = hang(script, start)
        stall = tc.wait_event("stall", CAUGHT_WITHIN_S, f"the stall ({said})")
        events = tc.events()
        before = [e for e in _progress(events) if (e.seq or 0) < (stall.seq or 0)]
        verdict = tc.wait_event("stall_diagnosis", 120, "the verdict")
        assert isinstance(verdict, E.StallDiagnosis)
        row.caught = (
            f"{stall.ts - before[-1].ts:.1f} s: {verdict.diagnosis} (its {said.split()[0]} SIGSTOPped)"
        )
        restart = tc.wait_event("restart", 120, "the restart")
        assert isinstance(restart, E.Restart)
        again = tc.wait_event(
            lambda e: isinstance(e, E.Start) and e.attempt == restart.attempt, 120, "the restarted attempt"
        )
        tc.wait_event(
            lambda e: isinstance(e, E.Progress) and (e.seq or 0) > (again.seq or 0),
            FIRST_PROGRESS_S,
            "progress after the restart",
        )
        row.resumed = resumed_from(script, restart, tc.events(), cwd, Path(tc.run_dir or ""))
        redone = work_redone(restart, tc.events())
        row.redone = "-" if redone is None else f"{redone} batches"
    except (TimeoutError, RuntimeError, AssertionError, psutil.Error) as exc:
        row.failed = str(exc).splitlines()[0][:120]
    finally:
        events = tc.events()
        losses = sorted({k for p in _progress(events) for k in p.losses})
        row.loss_read = ", ".join(losses) or "none"
        log = Path(tc.run_dir or "") / "train.log"
        row.format_read = format_read(events, log) if log.is_file() else "no log"
        if tc.poll() is None and tc.run_dir is not None:
            run_trainctl(["ctl", str(tc.run_dir), "stop"], timeout=60)
            try:
                tc.wait(90)
            except TimeoutError as exc:
                row.failed = row.failed or f"ctl stop: {str(exc).splitlines()[0]}"
        time.sleep(2)  # what the run's end leaves has had its chance to exit
        left = left_running(tc, work)
        row.left = "nothing" if not left else f"{len(left)}: " + "; ".join(left)
        tc.kill()
    return row


def work_redone(restart: E.Restart, events: list[E.Event]) -> int | None:
    """The batches the restarted attempt does again: the restart's own figure (a checkpoint
    the script wrote), else the projector's at the restart (its last good checkpoint's
    ``lose``: the batches done past it)."""
    if restart.resume_redone is not None:
        return restart.resume_redone
    at = [
        e.checkpoint.get("lose")
        for e in events
        if isinstance(e, E.Projection) and e.checkpoint and (e.seq or 0) < (restart.seq or 0)
    ]
    return at[-1] if at else None


def resumed_from(script: Script, restart: E.Restart, events: list[E.Event], cwd: Path, run_dir: Path) -> str:
    """The file the restart resumed from, as the script named it (its own file, through
    trainctl's copy) or as trainctl kept it (an integration's), with the position it holds,
    and whether the script's log says it resumed."""
    if restart.resume_source is None and restart.resume_from is None:
        return "the start (no checkpoint yet)" if script.first_save_s else "the start (it saves none)"
    source = restart.resume_source or restart.resume_from or ""
    try:
        shown = str(Path(source).relative_to(cwd))
    except ValueError:
        shown = Path(source).name
    if restart.resume_copy or Path(source).is_relative_to(run_dir):
        shown += " (trainctl's copy)"
    held = [
        e for e in events if isinstance(e, E.Checkpoint) and e.ok and e.path in (source, restart.resume_from)
    ]
    if held and held[-1].epoch is not None:
        at = held[-1]
        shown += f", epoch {at.epoch}" + ("" if at.batch is None else f" batch {at.batch}")
    if script.resumed_line:
        log = (run_dir / "train.log").read_text(errors="replace")
        shown += (
            "; the script says so" if re.search(script.resumed_line, log) else "; the script does not say so"
        )
    return shown


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scripts", type=Path, required=True, help="the folder holding the public scripts")
    ap.add_argument("--only", action="append", default=[], help="this script of the manifest (repeatable)")
    ap.add_argument("--manifest", type=Path, default=MANIFEST)
    ap.add_argument("--keep", action="store_true", help="keep the work and run directories (printed)")
    add_docs_flag(ap)
    a = ap.parse_args()
    scripts = load_manifest(a.manifest)
    unknown = set(a.only) - {s.name for s in scripts}
    if unknown:
        ap.error(f"not in the manifest: {', '.join(sorted(unknown))}")
    rec = Recorder(DOC_TABLES, a.docs)
    home = Path(tempfile.mkdtemp(prefix="bench-real-"))
    os.environ.setdefault("TRAINCTL_RUNS_DIR", str(home / "runs"))
    os.environ.setdefault("TRAINCTL_CONFIG_DIR", str(home / "config"))
    os.environ.setdefault("YOLO_CONFIG_DIR", str(home / "yolo-config"))
    os.environ.setdefault("YOLO_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    rows = []
    for script in scripts:
        if a.only and script.name not in a.only:
            continue
        t0 = time.monotonic()
        row = one_script(script, a.scripts.resolve(), home)
        rows.append(row.cells())
        print(" | ".join(rows[-1]), f"({time.monotonic() - t0:.0f} s)", flush=True)
    rec.publish("real-scripts", rows)
    if a.keep:
        print(f"work and run directories kept in {home}")
    else:
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
