"""What the modules of `src/trainctl/cli/` share: the usage error, the run's name, the lines
printed for a followed run, the run directory a command acts on.  `cli/remote.py` (`--host`
runs) imports it too; nothing of cli/ is imported here, so no two command modules import
each other through it."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

from trainctl.core.usage import UsageError

__all__ = ["UsageError", "note", "printer", "resolve_alerts", "resolve_run_dir", "run_name", "self_command"]


def run_name(args, job) -> str:
    """The run's name (src/trainctl/agent/prepare.py's ``run_name``: the spec builder's)."""
    from trainctl.agent.prepare import run_name as name_of

    return name_of(args, job)


def printer(as_json: bool):
    """The event printer of a followed run: JSON lines, or the plain-text view. Neither
    puts a control character of the trainer's on the terminal: the text lines are
    sanitised (`format_event`), the JSON is ASCII (a control is a \\u escape; the data are intact)."""
    import json

    from trainctl.core.events import to_dict
    from trainctl.core.printer import Printer
    from trainctl.core.runview import ViewSnapshot
    from trainctl.core.sanitize import sanitize

    text = Printer()

    def emit(ev) -> None:
        if isinstance(ev, ViewSnapshot):  # the run's view up to next_seq (--from-snapshot)
            line = (
                json.dumps(
                    {"op": "snapshot", "next_seq": ev.next_seq, "view": ev.view},
                    separators=(",", ":"),
                    ensure_ascii=True,
                )
                if as_json
                else f"snapshot of events 0-{ev.next_seq - 1}: state {sanitize(str(ev.view.get('state')))}, "
                f"attempt {ev.view.get('attempt')}"
            )
        elif as_json:
            line = json.dumps(to_dict(ev), separators=(",", ":"), ensure_ascii=True)
        else:
            line = text.format(ev)  # sanitised; "ETA unknown" once
        if line is not None:
            print(line, flush=True)

    return emit


def self_command() -> str:
    """How to type this trainctl again: `trainctl` when that name on PATH is this one, else
    its path (`.venv/bin/trainctl` run by `make demo` before the venv is activated)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if Path(argv0).name != "trainctl":  # `python -m trainctl`: no script of ours to name
        return "trainctl"
    mine = Path(argv0).absolute()
    found = shutil.which("trainctl")
    try:
        if found and os.path.samefile(found, mine):
            return "trainctl"
    except OSError:
        pass
    return shlex.quote(str(mine))


def note(text: str) -> None:
    """A message for the user, on stderr."""
    print(f"trainctl: {text}", file=sys.stderr, flush=True)


def resolve_alerts(args, job) -> tuple[list[str], list[str]]:
    """The run's alert (urls, on) (src/trainctl/agent/prepare.py's ``resolve_alerts``), its
    notes on stderr."""
    from trainctl.agent.prepare import resolve_alerts as alerts_of

    return alerts_of(args, job, note)


def resolve_run_dir(ref: str | None) -> Path:
    """The run directory a command acts on: it and every directory above it must be the
    user's (or root's) and not writable by others; else one line says why (UsageError) and
    nothing in it is read, run or stopped."""
    from trainctl.store.paths import UnsafePathError, latest_link, trusted_run_dir

    if ref:
        path = Path(ref).expanduser()
    else:
        path = latest_link()
        if not path.exists():
            raise UsageError(f"no run given and no latest run at {path}")
    try:
        path = trusted_run_dir(path)
    except UnsafePathError as e:
        raise UsageError(f"{e}; not acting on it") from None
    if not (path / "events.jsonl").exists() and not (path / "spec.json").exists():
        raise UsageError(f"{path}: not a trainctl run directory (no events.jsonl)")
    return path
