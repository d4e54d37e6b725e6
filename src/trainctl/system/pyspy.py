"""py-spy for :mod:`trainctl.system.diagnose`: find it, dump every process of a stalled tree
in parallel (each with a timeout: native frames first, then plain, then ``--nonblocking``
for a stopped or D-state process that ptrace cannot stop), and write the combined file
``<stacks_dir>/stall-<tag>-<pid>.txt`` (or ``snapshot-...``).  When py-spy cannot attach
(missing, ptrace denied, timed out), the dump says why."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil

from trainctl.system.probes import ProcSample
from trainctl.system.process import ends_with_us

PYSPY_TIMEOUT_S = 10.0
MAX_DUMPS = 16

STOPPED = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
DEAD = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


@dataclass(frozen=True)
class Dump:
    sample: ProcSample
    command: str
    text: str
    ok: bool
    why: str = ""


def find_pyspy() -> str | None:
    """py-spy next to the running interpreter (a venv's bin), else on PATH."""
    local = Path(sys.executable).parent / "py-spy"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("py-spy")


def dump_all(
    exe: str | None, samples: tuple[ProcSample, ...], native: bool, timeout: float, why: str
) -> list[Dump]:
    todo = [s for s in samples if s.status not in DEAD][:MAX_DUMPS]
    if exe is None:
        return [Dump(s, "", "", False, why) for s in todo]
    if not todo:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(todo))) as pool:
        return list(pool.map(lambda s: _dump_one(exe, s, native, timeout), todo))


def _dump_one(exe: str, s: ProcSample, native: bool, timeout: float) -> Dump:
    """py-spy dump one process: native first, then plain, then --nonblocking."""
    frozen = s.status in STOPPED or s.status == psutil.STATUS_DISK_SLEEP
    tries: list[list[str]] = []
    if frozen:
        tries.append(["--nonblocking"])  # ptrace cannot stop a stopped or D-state process
    else:
        if native:
            tries.append(["--native"])
        tries += [[], ["--nonblocking"]]
    errors: list[str] = []
    for extra in tries:
        argv = [exe, "dump", "--pid", str(s.pid), *extra]
        try:
            r = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                preexec_fn=ends_with_us(),
            )
        except subprocess.TimeoutExpired:
            errors.append(f"{' '.join(argv[1:])}: timed out after {timeout:.0f}s")
            continue
        except OSError as e:
            return Dump(s, " ".join(argv), "", False, f"cannot run py-spy: {e}")
        if r.returncode == 0 and "Thread " in r.stdout:
            return Dump(s, " ".join(argv), r.stdout, True)
        errors.append(f"{' '.join(argv[1:])}: {_pyspy_error(r.stdout + r.stderr, r.returncode)}")
    return Dump(s, f"{exe} dump --pid {s.pid}", "", False, "; ".join(errors))


def _pyspy_error(text: str, rc: int) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    err = [ln for ln in lines if ln.startswith(("Error", "Caused by", "0:", "1:", "Permission"))]
    msg = " ".join(err[:3]) or (lines[-1] if lines else f"exit code {rc}")
    if "Operation not permitted" in text or "Permission denied" in text:
        msg += (
            " (ptrace denied: run as the trainer's user, or set kernel.yama.ptrace_scope=0 / CAP_SYS_PTRACE)"
        )
    return msg[:300]


def write_dump(
    stacks_dir: Path,
    tag: str,
    pid: int,
    dumps: list[Dump],
    diagnosis: str,
    detail: str,
    snapshot: bool = False,
    ranks: dict[int, int] | None = None,
) -> Path:
    stacks_dir = Path(stacks_dir)
    stacks_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # in the run directory: private
    kind = "snapshot" if snapshot else "stall"
    name = f"{kind}-{tag}-{pid}.txt" if tag else f"{kind}-{pid}.txt"
    path = stacks_dir / re.sub(r"[^A-Za-z0-9._-]", "_", name)
    when = time.strftime("%Y-%m-%d %H:%M:%S %z")
    out = (
        [
            f"# trainctl stack snapshot of pid {pid} at {when}",
            "# asked for on a run that was not stalled: what each process was doing, not a verdict",
            "",
        ]
        if snapshot
        else [f"# trainctl stall dump of pid {pid} at {when}", f"# diagnosis: {diagnosis}: {detail}", ""]
    )
    for d in dumps:
        s = d.sample
        role = f"rank {ranks[s.pid]}" if ranks and s.pid in ranks else s.role
        out.append(
            f"=== pid {s.pid} {role} ({s.name}) status={s.status} "
            f"cpu={'?' if s.cpu_percent is None else f'{s.cpu_percent:.0f}%'} "
            f"wchan={s.wchan or '-'} threads={s.num_threads or '?'} ==="
        )
        out.append(f"$ {d.command}" if d.command else "$ (py-spy not run)")
        out.append(d.text.rstrip() if d.ok else f"(no stack: {d.why})")
        out.append("")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("\n".join(out))
    return path
