"""The parser of the `trainctl` command line (src/trainctl/cli/main.py dispatches), and the
table of exit codes its `--help` shows."""

from __future__ import annotations

import argparse
from typing import Any

from trainctl import __version__
from trainctl.cli.options import run_options
from trainctl.core.commands import CTL_COMMANDS

COMMANDS = (
    "run",
    "demo",
    "attach",
    "serve",
    "status",
    "ls",
    "report",
    "presets",
    "scan",
    "ctl",
    "bridge",
    "agent",
    "alerts",
)
EXIT_CODES = """\
  0    the run finished (or the command did what it was asked)
  1    the run failed; `ctl`: no agent is running for that run; `scan`: the log has a
       fatal finding
  2    bad usage or configuration; `ctl`: the agent refused the command; `run --slurm`:
       sbatch refused the job, or slurmctld is unreachable (one line says which)
  3    `run`, `attach` `--json/--headless`: the agent is gone and its journal does not end
       the run (a Slurm run: its job ended before its agent went on with it)
  4    `status`, `ctl`, `attach`: the agent does not answer within a few seconds
       ("agent not responding (pid N, stopped)": stopped or wedged)
  5    `run`, `agent`: the agent could not go on supervising (a part of it kept failing;
       the trainer was stopped, the reason is in the journal and <run_dir>/errors/)
  130  the run was stopped by the user (s, `trainctl ctl RUN_DIR stop`, Ctrl-C)
  141  the output's reader went away (`trainctl scan LOG | head`): ended quietly"""
"""The one table of exit codes: `--help` shows it, README.md holds the same lines (tested)."""
EXIT_CODES_HELP = "exit codes:\n" + EXIT_CODES
HIDDEN_COMMANDS = ("bridge", "agent")
"""Commands trainctl runs itself (over ssh, in tmux): not in `--help`."""


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (no usage block before them)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


Subparsers = argparse._SubParsersAction  # the type add_subparsers returns (argparse names it private)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="trainctl",
        description="Keep a training run alive.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"trainctl {__version__}")
    sub = p.add_subparsers(
        dest="cmd",
        parser_class=_Parser,
        title="commands",
        metavar="{" + ",".join(c for c in COMMANDS if c not in HIDDEN_COMMANDS) + "}",
    )
    codes: dict[str, Any] = {
        "epilog": EXIT_CODES_HELP,
        "formatter_class": argparse.RawDescriptionHelpFormatter,
    }
    _add_run_commands(sub, codes)
    _add_view_commands(sub, codes)
    _add_tool_commands(sub, codes)
    _add_hidden_commands(sub)
    return p


def _add_run_commands(sub: Subparsers, codes: dict[str, Any]) -> None:
    """`run` and `demo`: start a run."""
    from trainctl.config.demo import DEMO_EPOCHS

    run = sub.add_parser(
        "run", help="start a run (a job file, or `-- COMMAND ...`) and open the TUI", **codes
    )
    run.add_argument("job", nargs="?", help="job file (trainctl.toml)")
    run_options(run)
    demo = sub.add_parser("demo", help="a real tiny YOLO training on CPU, in the TUI")
    run_options(demo)
    demo.add_argument(
        "--epochs",
        type=int,
        default=None,
        metavar="N",
        help=f"how many epochs (default {DEMO_EPOCHS}: a few minutes on 2 CPU cores)",
    )


def _add_view_commands(sub: Subparsers, codes: dict[str, Any]) -> None:
    """`attach`, `serve`, `status`, `ls`: look at runs."""
    att = sub.add_parser("attach", help="open the dashboard on a running agent", **codes)
    att.add_argument("target", nargs="?", help="RUN_DIR or ssh://HOST[/RUN_DIR] (default: the latest run)")
    amode = att.add_mutually_exclusive_group()
    amode.add_argument("--headless", action="store_true", help="no TUI: follow the events as text lines")
    amode.add_argument("--json", action="store_true", help="no TUI: follow the events as JSON lines")
    att.add_argument(
        "--tail",
        type=int,
        metavar="N",
        help="with --json/--headless: the journal's last N events, then live ones "
        "(default: the whole journal)",
    )
    att.add_argument(
        "--from-snapshot",
        action="store_true",
        help="with --json/--headless: first the run's snapshot as one line "
        '({"op": "snapshot", "next_seq": N, "view": {...}}), then the events from N',
    )
    sv = sub.add_parser("serve", help="the dashboard in a browser, at a URL with a secret token", **codes)
    sv.add_argument("target", nargs="?", help="RUN_DIR or ssh://HOST[/RUN_DIR] (default: the latest run)")
    sv.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: this machine only; reach it with ssh -L). "
        "0.0.0.0: the network, still with the token",
    )
    sv.add_argument("--port", type=int, default=8000, help="default 8000; 0: any free port")
    st = sub.add_parser("status", help="the state and projection of a run", **codes)
    st.add_argument("run_dir", nargs="?")
    st.add_argument("--json", action="store_true")
    ls = sub.add_parser("ls", help="every run: here, on the hosts in hosts.toml, and in Slurm")
    ls.add_argument("--json", action="store_true")
    ls.add_argument("--here", action="store_true", help="only the runs of this machine")
    rp = sub.add_parser("report", help="a run's report: one self-contained HTML page (or Markdown)", **codes)
    rp.add_argument("run_dir", nargs="?", help="RUN_DIR or ssh://HOST/RUN_DIR (default: the latest run)")
    rp.add_argument("--md", action="store_true", help="Markdown (the same numbers, tables for the charts)")
    rp.add_argument(
        "-o", "--output", metavar="FILE", help="where (default: report.html in the run directory)"
    )
    rp.add_argument("--stdout", action="store_true", help="print the report instead of writing a file")


def _add_tool_commands(sub: Subparsers, codes: dict[str, Any]) -> None:
    """`presets`, `scan`, `ctl`, `alerts`."""
    pr = sub.add_parser("presets", help="list, show, validate or edit presets; stats [JOB]: their history")
    pr.add_argument("action", choices=("list", "show", "validate", "edit", "stats"))
    pr.add_argument("names", nargs="*", help="presets; for stats, a job name")
    pr.add_argument("--json", action="store_true", help="stats as JSON")
    sc = sub.add_parser("scan", help="postmortem of a saved training log (exit 1: a fatal finding)", **codes)
    sc.add_argument("logfile")
    sc.add_argument("--json", action="store_true")
    sc.add_argument(
        "--explain", action="store_true", help="each line: which format reader claimed it and what it read"
    )
    sc.add_argument("--job", help="with --explain: a job file whose [progress] pattern is tried first")
    sc.add_argument(
        "--kernel-log",
        metavar="FILE",
        help="a saved kernel log (dmesg -T or journalctl -k output): its findings, "
        "interleaved with the trainer's by time when both have timestamps",
    )
    ctl = sub.add_parser("ctl", help="send a command to a running agent", **codes)
    ctl.add_argument("run_dir")
    ctl.add_argument("command", choices=CTL_COMMANDS)
    ctl.add_argument("--preset")
    ctl.add_argument("--on", dest="on", action="store_true", default=None)
    ctl.add_argument("--off", dest="on", action="store_false")
    al = sub.add_parser("alerts", help="alerts: `alerts test [NAME|URL]` sends a test message")
    al.add_argument("action", choices=("test",))
    al.add_argument("refs", nargs="*", metavar="NAME|URL", help="default: every alert in alerts.toml")


def _add_hidden_commands(sub: Subparsers) -> None:
    """`bridge`, `agent`: run by trainctl itself (HIDDEN_COMMANDS)."""
    br = sub.add_parser("bridge")  # no help=: not listed (HIDDEN_COMMANDS)
    br.add_argument("run_dir")
    ag = sub.add_parser("agent")
    ag.add_argument("run_dir")
    ag.add_argument("--json", action="store_true")
    ag.add_argument("--adopt", action="store_true", help="take over a run whose agent died")
    ag.add_argument("--slurm", action="store_true", help="the run's Slurm batch job")
    ag.add_argument("--env-from", help="a FIFO the caller's environment comes through (tmux)")
