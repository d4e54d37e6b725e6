"""The agent's commands: one registry read by the agent (its handlers), `trainctl ctl`
(its choices), the dashboard (which keys send which command) and the test fakes.

Pure data: a command's name, the arguments it takes, whether `trainctl ctl` offers it and a
one-line help.  The agent refuses a name that is not here; a test checks that every name
here has a handler in the agent and that nothing else lists them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CommandSpec:
    name: str
    help: str
    args: dict[str, type] = field(default_factory=dict)  # name -> the JSON type expected
    ctl: bool = True  # offered by `trainctl ctl`
    ends_attempt: bool = False  # kills the running trainer


COMMANDS: dict[str, CommandSpec] = {
    c.name: c
    for c in (
        CommandSpec("status", "the run's state, phase, preset and projection"),
        CommandSpec("restart", "kill the trainer and resume with the same preset", ends_attempt=True),
        CommandSpec("fallback", "kill the trainer and resume with the fallback preset", ends_attempt=True),
        CommandSpec(
            "switch_preset",
            "kill the trainer and resume with --preset NAME",
            {"preset": str},
            ends_attempt=True,
        ),
        CommandSpec("stop", "kill the trainer; no restart (the run ends STOPPED)", ends_attempt=True),
        CommandSpec("dump_stacks", "py-spy dump of the trainer and its workers (a snapshot)"),
        CommandSpec("auto_recover", "turn automatic restarts on or off (--on/--off)", {"on": bool}),
        CommandSpec("list_presets", "the presets this run may use"),
        CommandSpec("read_preset", "a preset's text", {"name": str}, ctl=False),
        CommandSpec(
            "write_preset", "replace a preset's text (validated first)", {"name": str, "text": str}, ctl=False
        ),
        CommandSpec("ladder_unpin", "let the ladder move again after a preset you chose pinned it"),
        CommandSpec("set_next_preset", "the preset the next restart uses", {"name": str}, ctl=False),
    )
}

CTL_COMMANDS: tuple[str, ...] = tuple(name for name, spec in COMMANDS.items() if spec.ctl)


class CommandError(ValueError):
    """A command refused before it ran (unknown name, wrong argument types)."""


def check_request(name: object, args: object) -> tuple[str, dict[str, Any]]:
    """Validate a command request from a client: a known name and arguments of the right
    types (unknown arguments are refused too).  Raises CommandError with one clear line."""
    if not isinstance(name, str) or name not in COMMANDS:
        raise CommandError(f"unknown command {name!r}; known: {', '.join(COMMANDS)}")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise CommandError(f"{name}: arguments must be an object, not {type(args).__name__}")
    spec = COMMANDS[name]
    for key, value in args.items():
        want = spec.args.get(key)
        if want is None:
            allowed = ", ".join(spec.args) or "none"
            raise CommandError(f"{name}: unknown argument {key!r} (allowed: {allowed})")
        if not isinstance(value, want) or (want is not bool and isinstance(value, bool)):
            raise CommandError(f"{name}: {key} must be a {want.__name__}, not {type(value).__name__}")
    return name, dict(args)
