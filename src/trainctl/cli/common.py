"""What the modules of `src/trainctl/cli/` share: the usage error, the run's name, the lines
printed for a followed run, the run directory a command acts on (src/trainctl/hosts/here.py's);
nothing of cli/ is imported here, so no two command modules import each other through it."""

from __future__ import annotations

import sys

from trainctl.core.usage import UsageError

__all__ = ["UsageError", "note", "printer", "resolve_alerts", "run_name"]


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
        line: str | None
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


def note(text: str) -> None:
    """A message for the user, on stderr."""
    print(f"trainctl: {text}", file=sys.stderr, flush=True)


def resolve_alerts(args, job) -> tuple[list[str], list[str]]:
    """The run's alert (urls, on) (src/trainctl/agent/prepare.py's ``resolve_alerts``), its
    notes on stderr."""
    from trainctl.agent.prepare import resolve_alerts as alerts_of

    return alerts_of(args, job, note)
