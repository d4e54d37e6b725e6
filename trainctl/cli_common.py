"""What `trainctl/cli.py` and `trainctl/remote_cli.py` both need: the usage error, the run's
name, and the lines printed for a followed run. Neither of them is imported here, so the
two do not import each other (cli.py hands `--host` runs to remote_cli.py)."""
from __future__ import annotations

import sys
from pathlib import Path


class UsageError(Exception):
    """Bad usage or configuration: printed as `trainctl: ...`, exit 2."""


def command_name(argv: list[str]) -> str:
    """`python train.py --x` → train; `./run.sh` → run."""
    for a in argv:
        if a.endswith((".py", ".sh")):
            return Path(a).stem
    return Path(argv[0]).stem


def run_name(args, job) -> str:
    """The run's name, here and on a box alike: `--name`, else the job's, else the
    command's; anything but letters, digits, '.', '_' and '-' becomes '-'."""
    name = args.name or (job.name if job else command_name(args.command_argv)
                         if args.command_argv else "run")
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in name) or "run"


def printer(as_json: bool):
    """The event printer of a followed run: JSON lines, or the plain-text view."""
    from .engine.events import encode
    from .engine.printer import format_event

    def emit(ev) -> None:
        line = encode(ev) if as_json else format_event(ev)
        if line is not None:
            print(line, flush=True)
    return emit


def note(text: str) -> None:
    """A message for the user, on stderr."""
    print(f"trainctl: {text}", file=sys.stderr, flush=True)
