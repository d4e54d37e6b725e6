"""Every run of this user on this machine, for `trainctl ls`: the run directories under the
runs directory, the ones started elsewhere (`--run-dir`, a job's ``run_dir``: each start
records its directory in ``<runs dir>/known-runs``), and those its hosts add (the Slurm
jobs of trainctl runs in the queue: their working directory is their run directory).  What
a journal says (state, progress, ETA, last incident) is folded here; a run summed up with
its agent's liveness and its Slurm job is this machine's host's (hosts/local.py summarize);
the rows as people read them (columns, attention) are here."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from trainctl.core import events as E
from trainctl.core.goodput import Goodput
from trainctl.core.recovery import USER_RESTART_REASON
from trainctl.core.statefile import read_text
from trainctl.store.journal import JournalReader, raw_lines_from
from trainctl.store.paths import make_private_dir, runs_dir, write_private

KNOWN = "known-runs"
UNREADABLE = "UNREADABLE"
"""The state `ls` shows for a run directory it does not read: not the user's own, or its
spec.json is not a run spec (the reason says which)."""
MAX_KNOWN = 500


def register_run(run_dir: Path) -> None:
    """Remember a run directory (its path on a line of its own; the newest 500 kept)."""
    path = runs_dir() / KNOWN
    line = str(Path(run_dir).resolve())
    if "\n" in line:
        return
    try:
        make_private_dir(path.parent)  # others see no job name nor path of ours
        old = [p for p in _read_known(path) if p != line]
        write_private(path, "\n".join([*old[-(MAX_KNOWN - 1) :], line]) + "\n")
    except OSError:
        pass


def _read_known(path: Path) -> list[str]:
    try:
        return [ln for ln in read_text(path, 16 << 20).splitlines() if ln.strip()]
    except OSError:
        return []


def run_dirs(elsewhere: list[Path] | None = None) -> list[Path]:
    """Every run directory known here, once each (resolved), those that still exist.
    ``elsewhere``: more candidates (the Slurm queue's run directories, hosts/local.py)."""
    seen: dict[str, Path] = {}
    root = runs_dir()
    candidates: list[Path] = []
    try:
        candidates += [p for p in root.iterdir() if p.name != "latest" and not p.is_symlink()]
    except OSError:
        pass
    candidates += [Path(p) for p in _read_known(root / KNOWN)]
    candidates += elsewhere or []
    for p in candidates:
        try:
            key = str(p.resolve())
        except OSError:
            continue
        if key not in seen and (p / "spec.json").is_file():
            seen[key] = Path(key)
    return list(seen.values())


class JournalFold:
    """What `summarize` takes from a journal (started, state and reason, progress, ETA and
    the deadline's buffer, last incident), folded up to a byte offset: a later look reads
    only the lines written since (a day of journal is ~9 MB, half a second to fold whole).
    A journal replaced or cut (another inode, shorter) is folded again from its start."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset(None)

    def _reset(self, ino: int | None) -> None:
        self.ino, self.offset, self.seq = ino, 0, 0
        self.reader = JournalReader()
        self.goodput = Goodput()
        self.out: dict = {}

    def advance(self, path: Path) -> dict:
        with self._lock:
            try:
                st = os.stat(path)
            except OSError:
                return {}
            if st.st_ino != self.ino or st.st_size < self.offset:
                self._reset(st.st_ino)
            try:
                for seq, raw, end in raw_lines_from(path, self.offset, self.seq):
                    self.offset, self.seq = end, seq + 1
                    ev = self.reader.event(raw, seq)  # None: unreadable, counted
                    if ev is not None:
                        self._take(ev)
            except OSError:  # unreadable now (permissions, a stale NFS handle): what was read
                pass
            return {**self.out, "goodput": self.goodput.totals()}

    def _take(self, ev: E.Event) -> None:
        out = self.out
        self.goodput.apply(ev)
        if ev.seq == 0:
            out["started"] = ev.ts
        if isinstance(ev, E.State):
            out["state"], out["reason"] = ev.state, ev.reason
        elif isinstance(ev, E.Progress):
            out["progress"] = {
                "epoch": ev.epoch,
                "epochs": ev.epochs,
                "batch": ev.batch,
                "batches": ev.batches,
            }
        elif isinstance(ev, E.Projection):
            out["eta"], out["buffer_s"] = ev.eta, ev.buffer_s
            out["eta_declared"] = getattr(ev, "rate_source", "") == "declared"  # not measured yet
        elif isinstance(ev, (E.Stall, E.StallDiagnosis)):  # the stall, then its verdict
            out["incident"] = {"ts": ev.ts, "text": f"stall in {ev.phase}: {ev.diagnosis}"}
        elif isinstance(ev, E.Restart) and ev.reason != USER_RESTART_REASON:  # a key press is none
            out["incident"] = {"ts": ev.ts, "text": f"restart: {ev.reason}"}
        elif isinstance(ev, E.Warning) and ev.severity in ("error", "fatal"):
            out["incident"] = {"ts": ev.ts, "text": f"{ev.id}: {ev.text}"}


# ---------------------------------------------------------------------- rows, as people read them
LIVE = ("STARTING", "RUNNING", "STALLED", "BACKOFF", "STOPPING")


def row_key(row: dict) -> tuple[str, str]:
    """Which run a row is: (where, run_dir); where = "local" or the ssh destination."""
    return str(row.get("where") or "local"), str(row.get("run_dir") or "")


def needs_attention(row: dict) -> str | None:
    """Why a run wants a person now, or None: stalled; failed; restarting (backoff); stopped
    by something else than the user (cancelled outside trainctl, its time ran out); its
    agent gone while the run was live (crashed); its deadline late by the projection.  A
    finished run, one the user stopped, a queued one and a host that cannot be reached do
    not count (the last is no run)."""
    if row.get("error"):
        return None
    state = row.get("state")
    if state == "STALLED":
        return "stalled"
    if state == "FAILED":
        return "failed"
    if state == "BACKOFF":
        return "restarting after a fault"
    if state == "STOPPED":
        reason = str(row.get("reason") or "")
        if reason.startswith("stopped by the user"):
            return None
        return reason if reason.startswith("stopped") else f"stopped: {reason or '?'}"
    if state in LIVE and not row.get("live"):
        if row.get("trainer_pid"):
            return (
                f"its trainer (pid {row['trainer_pid']}) runs on "
                f"{'unsupervised' if row.get('unsupervised') else 'under its holder'}, its agent gone: "
                "`trainctl attach` adopts it"
            )
        return "its agent is gone"
    buffer = row.get("buffer_s")
    if state in LIVE and isinstance(buffer, (int, float)) and buffer < 0:
        return "deadline at risk"
    return None


def attention_count(rows: list[dict], current: tuple[str, str] | None = None) -> int:
    """How many runs need attention, ``current`` (the one on screen, a row_key) left out."""
    return sum(1 for r in rows if row_key(r) != current and needs_attention(r))


COLUMNS = ("STATE", "JOB", "WHERE", "PROGRESS", "ETA", "GOODPUT", "LAST INCIDENT")


def row_cells(row: dict) -> tuple[str, ...]:
    """A row of `trainctl ls` (and the dashboard's run picker), one cell per COLUMNS entry,
    sanitised, on one line each."""
    import time

    from trainctl.core.sanitize import sanitize_text

    r = row
    if r.get("error"):
        cells: tuple = ("?", "-", r.get("where", "?"), "-", "-", "-", r["error"])
    else:
        sl = r.get("slurm")
        if sl:
            where = f"slurm {sl.get('job')} {sl.get('partition') or ''}".strip()
        elif r.get("where", "local") == "local":
            where = r["run_dir"]
        else:
            where = f"{r['where']}:{r['run_dir']}"
        state = r["state"] + (
            f" ({sl['reason']})"
            if sl and r["state"] == "PENDING" and sl.get("reason") not in (None, "", "None")
            else ""
        )
        p = r.get("progress") or {}
        prog = "-"
        if p.get("batch") is not None or p.get("epoch") is not None:
            prog = (
                f"epoch {p['epoch']}/{p.get('epochs') or '?'} " if p.get("epoch") else ""
            ) + f"{p.get('batch') or 0}/{p.get('batches') or '?'}"
        eta = "-"
        if r.get("eta") and r["state"] not in ("FAILED", "STOPPED"):
            eta = time.strftime("%a %H:%M", time.localtime(r["eta"]))
            if r.get("eta_declared"):  # on a preset's declared rate, not one this run measured
                eta += " (declared rate)"
        inc = r.get("incident") or {}
        stamp = time.strftime("%H:%M ", time.localtime(inc["ts"])) if inc.get("ts") else ""
        incident = (stamp + inc["text"])[: 60 if stamp else 120] if inc else "-"
        if r.get("unsupervised"):  # what matters most now: a trainer nobody watches
            incident = f"trainer pid {r.get('trainer_pid')} unsupervised: `trainctl attach` adopts it"
        ratio = (r.get("goodput") or {}).get("ratio")
        goodput = f"{ratio * 100:.1f} %" if isinstance(ratio, (int, float)) else "-"
        cells = (state, r["job"], where, prog, eta, goodput, incident)
    return tuple(sanitize_text(str(c)).replace("\n", " ") for c in cells)
