"""The options of `trainctl run` and `trainctl demo` (src/trainctl/cli/parser.py builds the parser)."""

from __future__ import annotations

import argparse


def run_options(p: argparse.ArgumentParser) -> None:
    _output_options(p)
    _supervision_options(p)
    _setup_options(p)
    _recovery_options(p)
    _run_options(p)
    _where_options(p)


def _output_options(p: argparse.ArgumentParser) -> None:
    """How the run is shown: the TUI, or event lines."""
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--headless", action="store_true", help="no TUI: human-readable event lines")
    mode.add_argument("--json", action="store_true", help="no TUI: events as JSON lines on stdout")


def _supervision_options(p: argparse.ArgumentParser) -> None:
    """The presets and the stall thresholds."""
    p.add_argument("--preset", help="preset name or path (overrides the job's)")
    p.add_argument("--fallback", help="fallback preset name or path, used after a stall or crash")
    p.add_argument(
        "--stall-timeout",
        type=float,
        metavar="SECONDS",
        help="train-phase stall threshold (default: learned from the run)",
    )
    p.add_argument(
        "--startup-idle",
        type=float,
        metavar="SECONDS",
        help="before the first batch, a tree this long with no output, CPU or I/O is a deadlock (default 90)",
    )
    p.add_argument(
        "--silence-floor",
        type=float,
        metavar="SECONDS",
        help="an unknown progress format: the least output silence allowed (default 60)",
    )


def _setup_options(p: argparse.ArgumentParser) -> None:
    """What runs before the trainer."""
    p.add_argument(
        "--setup",
        metavar="SHELL",
        help="shell lines run (in bash) before the trainer, e.g. 'source ~/venv/bin/activate' "
        "(a job's [host] setup)",
    )
    p.add_argument("--via-ssh", action="store_true", help=argparse.SUPPRESS)


def _recovery_options(p: argparse.ArgumentParser) -> None:
    """Restarts, rescue saves and resuming."""
    p.add_argument("--max-restarts", type=int, metavar="N", help="automatic restart budget (default 3)")
    p.add_argument(
        "--node-rank",
        type=int,
        metavar="N",
        help='a kind = "torchrun" job of several nodes: this node\'s rank (default: the '
        "job's node_rank); one run per (job, node rank) on a machine",
    )
    p.add_argument(
        "--rescue-wait",
        type=float,
        metavar="SECONDS",
        default=30.0,
        help="how long a stalled trainer that saves on request gets for its rescue save (30)",
    )
    p.add_argument(
        "--resume-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="appended to a generic command on restart (repeatable; {checkpoint} is replaced)",
    )
    p.add_argument(
        "--checkpoints",
        action="append",
        metavar="GLOB",
        help="the files or folders a command saves its own checkpoints as, a glob from its "
        "working directory (repeatable; a job's checkpoints; default: *.pt, *.pth, *.ckpt, "
        "*.safetensors, checkpoint-N/ ... created or replaced during the run)",
    )
    p.add_argument(
        "--resume-from",
        metavar="PATH",
        help="start from this checkpoint, or from the last good checkpoint of this "
        "earlier run directory (a command resumes through its --resume-arg)",
    )
    p.add_argument(
        "--trust-checkpoint",
        action="append",
        default=[],
        metavar="PATH",
        help="unpickle this checkpoint file of your own even if the checkpoint gate refuses "
        "it (a global not seen in real checkpoints; repeatable; see docs/security.md)",
    )


def _run_options(p: argparse.ArgumentParser) -> None:
    """The run's directory, name, deadline and what the agent does by itself."""
    p.add_argument("--run-dir", help="where the journal, log and stacks go")
    p.add_argument("--deadline", help="ISO 8601 date/time the run must finish by")
    p.add_argument("--name", help="job name (generic commands; default: the script's name)")
    p.add_argument(
        "--no-auto-recover", action="store_true", help="detect and diagnose, but never restart by itself"
    )
    p.add_argument("--no-tmux", action="store_true", help="run the agent detached, not in tmux")
    p.add_argument(
        "--no-instrument",
        action="store_true",
        help="no zero-code integration (Ultralytics, Transformers, Lightning) in a Python "
        "command: console parsing only (a job's instrument = false)",
    )
    p.add_argument(
        "--no-spare",
        action="store_true",
        help="no warm spare: a restart starts the trainer's interpreter cold (a job's spare = false)",
    )


def _where_options(p: argparse.ArgumentParser) -> None:
    """Where the trainer runs (here, --host, --slurm), and the alerts."""
    p.add_argument("--host", help="run on this ssh destination (the job's [host] otherwise)")
    p.add_argument(
        "--slurm",
        action="store_true",
        help="run as Slurm batch jobs (sbatch), going on in a next job at each time "
        "limit (the job's [slurm] sets partition, time, gpus, ...)",
    )
    p.add_argument(
        "--detach",
        action="store_true",
        help="start the agent (in tmux when there) and print its run directory; no TUI",
    )
    p.add_argument(
        "--alert",
        action="append",
        default=[],
        metavar="NAME|URL",
        help="send alerts here: a name from alerts.toml, or an apprise URL (visible "
        "in the process list: prefer a name); repeatable",
    )
    p.add_argument("--alert-file", help=argparse.SUPPRESS)  # --host: the client's, sent 0600
