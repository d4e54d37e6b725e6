"""The `trainctl` command line: the dispatch (src/trainctl/cli/parser.py is the parser).
Each command is a module of src/trainctl/cli/ of its name, whose `cmd_<name>(args)` returns
the exit code (imported when that command runs).  Exit codes: see parser.EXIT_CODES_HELP."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys

from trainctl.cli.common import UsageError
from trainctl.cli.parser import COMMANDS, build_parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1 :]
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help", "--version")):
        argv = ["run", *argv]
    from trainctl.store.paths import UnsafePathError

    try:
        try:
            args = build_parser().parse_args(_joined_values(argv))
        except SystemExit:  # --help, --version, a usage error: its text may meet a closed pipe
            sys.stdout.flush()
            raise
        args.command_argv = command
        code = handler(args.cmd)(args)
        sys.stdout.flush()  # a closed pipe is met here, never in the interpreter's exit
        return code
    except (UsageError, UnsafePathError) as e:  # a file not the user's, met anywhere: one line
        print(f"trainctl: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `trainctl scan LOG | head`: the reader left; end quietly
        _quiet_stdout()
        return 141  # as a shell reports a command killed by SIGPIPE


def _quiet_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered for a reader that left goes nowhere
    (else Python's exit says "Exception ignored ... BrokenPipeError")."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


VALUE_OPTIONS = ("--resume-arg",)
"""Options whose value may itself look like an option (`--resume-arg --resume`)."""


def _joined_values(argv: list[str]) -> list[str]:
    """`--resume-arg X` -> `--resume-arg=X` whatever X is: argparse would read `--resume`
    as an (ambiguous) option of its own."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in VALUE_OPTIONS and i + 1 < len(argv):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def handler(cmd: str):
    """The function of a command: `cmd_<cmd>` of src/trainctl/cli/<cmd>.py."""
    return getattr(importlib.import_module(f"trainctl.cli.{cmd}"), f"cmd_{cmd}")
