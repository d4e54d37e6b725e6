"""A journal whose last line is torn and huge (issue 38: a 1 GB line costs at most 64 MB more
memory and 1 s more time than the same journal without it; prints figures, asserts nothing).

    .venv/bin/python bench/bench_torn_line.py [--mb 1024] [--python PYTHON]

Builds a finished run's journal (a start, 2,000 progress lines, an exit, FINISHED) with the
package's own Journal, then a copy of it whose last line is torn: ``{"ts":...,"type":"info",
"text":"xxxx...`` of ``--mb`` MB and no newline (an agent killed while writing a line that
long).  A third copy has the same huge line ended (a whole, too-long line in the middle of
the journal: skipped and counted).  For each, in a fresh process each (``PYTHON -m trainctl
...``, no snapshot.json, so the whole journal is read): ``status``, ``attach --headless`` and
``report``, their wall time and peak RSS (the child's ru_maxrss), and the difference from the
plain journal.  ``--python``: another checkout's interpreter (main's .venv, for the figures
before the change).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainctl.core import events as E  # noqa: E402
from trainctl.store.journal import Journal  # noqa: E402

CHUNK = b"x" * (1 << 20)


def plain_run(where: Path) -> Path:
    run = where / "plain"
    run.mkdir(mode=0o700)
    journal = Journal(run / "events.jsonl")
    t = 1_760_000_000.0
    journal.append(E.Start(t, 1, 4242, None, ("python", "train.py")))
    journal.append(E.Phase(t, "train"))
    for i in range(2000):
        journal.append(E.Progress(t + i, 0, 1, i + 1, 2000, {"loss": 1.0 / (i + 1)}, rate=1.0))
    journal.append(E.Exit(t + 2001, 0))
    journal.append(E.State(t + 2001, "FINISHED", "the trainer finished"))
    journal.close()
    return run


def huge_copy(plain: Path, name: str, mb: int, ended: bool) -> Path:
    run = plain.with_name(name)
    run.mkdir(mode=0o700)
    with open(run / "events.jsonl", "wb") as out:
        out.write((plain / "events.jsonl").read_bytes())
        out.write(b'{"ts":1760002002.0,"type":"info","text":"')
        for _ in range(mb):
            out.write(CHUNK)
        if ended:
            out.write(b'"}\n')
    return run


def measure(python: str, argv: list[str], env: dict) -> tuple[float, float, int]:
    """(wall s, peak RSS MB, exit code) of one fresh process (its own rusage, by wait4)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [python, "-m", "trainctl", *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - t0, usage.ru_maxrss / 1024, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mb", type=int, default=1024, help="the huge line's size in MB")
    ap.add_argument("--python", default=sys.executable, help="the interpreter whose trainctl is measured")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-torn-") as tmp:
        base = Path(tmp)
        os.chmod(base, 0o700)
        env = {
            **os.environ,
            "TRAINCTL_RUNS_DIR": str(base / "runs"),
            "TRAINCTL_DATA_DIR": str(base / "data"),
            "TRAINCTL_CONFIG_DIR": str(base / "config"),
        }
        plain = plain_run(base)
        runs = [
            plain,
            huge_copy(plain, "torn", a.mb, ended=False),
            huge_copy(plain, "long", a.mb, ended=True),
        ]
        print(f"python {a.python}; a {a.mb} MB line; no snapshot (the whole journal read)")
        print(f"{'command':<20}{'journal':<8}{'wall s':>8}{'+s':>8}{'peak MB':>9}{'+MB':>8}  exit")
        for cmd in (["status"], ["attach", "--headless"], ["report", "-o", str(base / "r.html")]):
            base_wall = base_rss = None
            for run in runs:
                (run / "snapshot.json").unlink(missing_ok=True)
                wall, rss, code = measure(a.python, [*cmd, str(run)], env)
                if run is plain:
                    base_wall, base_rss = wall, rss
                dw, dr = wall - (base_wall or 0.0), rss - (base_rss or 0.0)
                print(
                    f"{' '.join(cmd[:2]):<20}{run.name:<8}{wall:>8.2f}{dw:>+8.2f}{rss:>9.0f}{dr:>+8.0f}  {code}"
                )


if __name__ == "__main__":
    main()
