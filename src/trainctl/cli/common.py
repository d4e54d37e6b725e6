"""What `src/trainctl/cli/main.py` and `src/trainctl/cli/remote.py` both need: the usage error, the run's
name, and the lines printed for a followed run. Neither of them is imported here, so the
two do not import each other (cli.py hands `--host` runs to remote_cli.py)."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from pathlib import Path

from trainctl.hosts.base import Refused


# Bad usage or configuration: printed as `trainctl: ...`, exit 2.  The layers below raise it
# as hosts.base.Refused (the same class), without importing the CLI.
UsageError = Refused


def command_name(argv: list[str]) -> str:
    """`python train.py --x` → train; `./run.sh` → run."""
    for a in argv:
        if a.endswith((".py", ".sh")):
            return Path(a).stem
    return Path(argv[0]).stem


def run_name(args, job) -> str:
    """The run's name, here and on a box alike: `--name`, else the job's, else the
    command's; anything but letters, digits, '.', '_' and '-' becomes '-'.

    `--name` and the job's name are checked as given (`check_name`: no `..`, `/`, leading
    `-` or `.`, control characters; at most 64 characters; UsageError otherwise); a name
    made from the command is made safe the same way (it names run directories, tmux
    sessions and a path on a box)."""
    from trainctl.store.paths import MAX_NAME, BadNameError, check_name
    given = args.name if args.name is not None else (job.name if job else None)
    if given is not None:
        try:
            check_name(given, "--name" if args.name is not None else "job name")
        except BadNameError as e:
            raise UsageError(str(e)) from None
        name = given
    else:
        name = command_name(args.command_argv) if args.command_argv else "run"
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in name)
    if given is None:   # from the command: `../.x.py` names no path
        name = re.sub(r"\.{2,}", ".", name).lstrip(".-")[:MAX_NAME]
    return name or "run"


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
        if isinstance(ev, ViewSnapshot):   # the run's view up to next_seq (--from-snapshot)
            line = (json.dumps({"op": "snapshot", "next_seq": ev.next_seq, "view": ev.view},
                               separators=(",", ":"), ensure_ascii=True) if as_json else
                    f"snapshot of events 0-{ev.next_seq - 1}: state {sanitize(str(ev.view.get('state')))}, "
                    f"attempt {ev.view.get('attempt')}")
        elif as_json:
            line = json.dumps(to_dict(ev), separators=(",", ":"), ensure_ascii=True)
        else:
            line = text.format(ev)   # sanitised; "ETA unknown" once
        if line is not None:
            print(line, flush=True)
    return emit


def self_command() -> str:
    """How to type this trainctl again: `trainctl` when that name on PATH is this one, else
    its path (`.venv/bin/trainctl` run by `make demo` before the venv is activated)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if Path(argv0).name != "trainctl":   # `python -m trainctl`: no script of ours to name
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
    """The run's alert (urls, on): the job's [alerts], --alert, alerts.toml's default; a
    raw URL on the command line is accepted with a note (the process list shows it)."""
    from trainctl.alerts.settings import AlertConfigError, is_url, load_user_alerts, run_alerts
    refs = list(getattr(args, "alert", None) or [])
    if any(is_url(r) for r in refs):
        note("an --alert URL is visible in the process list and your shell history; "
             "name it in alerts.toml instead (trainctl alerts test NAME)")
    try:
        return run_alerts(job.alerts if job else None, refs, load_user_alerts())
    except AlertConfigError as e:
        raise UsageError(str(e)) from None
