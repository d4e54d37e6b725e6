"""The `trainctl` command line. Exit codes: see EXIT_CODES_HELP."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trainctl import __version__
from trainctl.core.commands import CTL_COMMANDS
from trainctl.core.torchrun import is_torchrun
from trainctl.cli.common import UsageError, note, printer, resolve_alerts, run_name, self_command

if TYPE_CHECKING:
    from trainctl.store.spec import RunSpec

COMMANDS = ("run", "demo", "attach", "status", "ls", "presets", "scan", "ctl", "bridge", "agent", "alerts")
EXIT_CODES = """\
  0    the run finished (or the command did what it was asked)
  1    the run failed; `ctl`: no agent is running for that run; `scan`: the log has a
       fatal finding
  2    bad usage or configuration; `ctl`: the agent refused the command; `run --slurm`:
       sbatch refused the job, or slurmctld is unreachable (one line says which)
  3    `attach --json/--headless`: the agent is gone and its journal does not end the run
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


def _run_options(p: argparse.ArgumentParser) -> None:
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--headless", action="store_true", help="no TUI: human-readable event lines")
    mode.add_argument("--json", action="store_true", help="no TUI: events as JSON lines on stdout")
    p.add_argument("--preset", help="preset name or path (overrides the job's)")
    p.add_argument("--fallback", help="fallback preset name or path, used after a stall or crash")
    p.add_argument("--stall-timeout", type=float, metavar="SECONDS",
                   help="train-phase stall threshold (default: learned from the run)")
    p.add_argument("--startup-idle", type=float, metavar="SECONDS",
                   help="before the first batch, a tree this long with no output, CPU or I/O "
                        "is a deadlock (default 90)")
    p.add_argument("--silence-floor", type=float, metavar="SECONDS",
                   help="an unknown progress format: the least output silence allowed (default 60)")
    p.add_argument("--setup", metavar="SHELL",
                   help="shell lines run (in bash) before the trainer, e.g. 'source ~/venv/bin/activate' "
                        "(a job's [host] setup)")
    p.add_argument("--via-ssh", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--max-restarts", type=int, metavar="N", help="automatic restart budget (default 3)")
    p.add_argument("--node-rank", type=int, metavar="N",
                   help="a kind = \"torchrun\" job of several nodes: this node's rank (default: the "
                        "job's node_rank); one run per (job, node rank) on a machine")
    p.add_argument("--rescue-wait", type=float, metavar="SECONDS", default=30.0,
                   help="how long a stalled trainer that saves on request gets for its rescue save (30)")
    p.add_argument("--resume-arg", action="append", default=[], metavar="ARG",
                   help="appended to a generic command on restart (repeatable; {checkpoint} is replaced)")
    p.add_argument("--resume-from", metavar="PATH",
                   help="start from this checkpoint, or from the last good checkpoint of this "
                        "earlier run directory (a command resumes through its --resume-arg)")
    p.add_argument("--run-dir", help="where the journal, log and stacks go")
    p.add_argument("--deadline", help="ISO 8601 date/time the run must finish by")
    p.add_argument("--name", help="job name (generic commands; default: the script's name)")
    p.add_argument("--no-auto-recover", action="store_true", help="detect and diagnose, but never restart by itself")
    p.add_argument("--no-tmux", action="store_true", help="run the agent detached, not in tmux")
    p.add_argument("--no-instrument", action="store_true",
                   help="no zero-code integration (Ultralytics, Transformers, Lightning) in a Python "
                        "command: console parsing only (a job's instrument = false)")
    p.add_argument("--host", help="run on this ssh destination (the job's [host] otherwise)")
    p.add_argument("--slurm", action="store_true",
                   help="run as Slurm batch jobs (sbatch), going on in a next job at each time "
                        "limit (the job's [slurm] sets partition, time, gpus, ...)")
    p.add_argument("--detach", action="store_true",
                   help="start the agent (in tmux when there) and print its run directory; no TUI")
    p.add_argument("--alert", action="append", default=[], metavar="NAME|URL",
                   help="send alerts here: a name from alerts.toml, or an apprise URL (visible "
                        "in the process list: prefer a name); repeatable")
    p.add_argument("--alert-file", help=argparse.SUPPRESS)   # --host: the client's, sent 0600


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (no usage block before them)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    from trainctl.config.demo import DEMO_EPOCHS
    p = _Parser(prog="trainctl", description="Keep a training run alive.",
                                epilog=EXIT_CODES_HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"trainctl {__version__}")
    sub = p.add_subparsers(dest="cmd", parser_class=_Parser, title="commands",
                           metavar="{" + ",".join(c for c in COMMANDS if c not in HIDDEN_COMMANDS) + "}")
    codes = {"epilog": EXIT_CODES_HELP, "formatter_class": argparse.RawDescriptionHelpFormatter}
    run = sub.add_parser("run", help="start a run (a job file, or `-- COMMAND ...`) and open the TUI",
                         **codes)
    run.add_argument("job", nargs="?", help="job file (trainctl.toml)")
    _run_options(run)
    demo = sub.add_parser("demo", help="a real tiny YOLO training on CPU, in the TUI")
    _run_options(demo)
    demo.add_argument("--epochs", type=int, default=None, metavar="N",
                      help=f"how many epochs (default {DEMO_EPOCHS}: a few minutes on 2 CPU cores)")
    att = sub.add_parser("attach", help="open the dashboard on a running agent", **codes)
    att.add_argument("target", nargs="?", help="RUN_DIR or ssh://HOST[/RUN_DIR] (default: the latest run)")
    amode = att.add_mutually_exclusive_group()
    amode.add_argument("--headless", action="store_true", help="no TUI: follow the events as text lines")
    amode.add_argument("--json", action="store_true", help="no TUI: follow the events as JSON lines")
    att.add_argument("--tail", type=int, metavar="N",
                     help="with --json/--headless: the journal's last N events, then live ones "
                          "(default: the whole journal)")
    att.add_argument("--from-snapshot", action="store_true",
                     help="with --json/--headless: first the run's snapshot as one line "
                          '({"op": "snapshot", "next_seq": N, "view": {...}}), then the events from N')
    st = sub.add_parser("status", help="the state and projection of a run", **codes)
    st.add_argument("run_dir", nargs="?")
    st.add_argument("--json", action="store_true")
    ls = sub.add_parser("ls", help="every run: here, on the hosts in hosts.toml, and in Slurm")
    ls.add_argument("--json", action="store_true")
    ls.add_argument("--here", action="store_true", help="only the runs of this machine")
    pr = sub.add_parser("presets", help="list, show, validate or edit presets")
    pr.add_argument("action", choices=("list", "show", "validate", "edit"))
    pr.add_argument("names", nargs="*")
    sc = sub.add_parser("scan", help="postmortem of a saved training log (exit 1: a fatal finding)",
                        **codes)
    sc.add_argument("logfile")
    sc.add_argument("--json", action="store_true")
    sc.add_argument("--explain", action="store_true",
                    help="each line: which format reader claimed it and what it read")
    sc.add_argument("--job", help="with --explain: a job file whose [progress] pattern is tried first")
    sc.add_argument("--kernel-log", metavar="FILE",
                    help="a saved kernel log (dmesg -T or journalctl -k output): its findings, "
                         "interleaved with the trainer's by time when both have timestamps")
    ctl = sub.add_parser("ctl", help="send a command to a running agent", **codes)
    ctl.add_argument("run_dir")
    ctl.add_argument("command", choices=CTL_COMMANDS)
    ctl.add_argument("--preset")
    ctl.add_argument("--on", dest="on", action="store_true", default=None)
    ctl.add_argument("--off", dest="on", action="store_false")
    al = sub.add_parser("alerts", help="alerts: `alerts test [NAME|URL]` sends a test message")
    al.add_argument("action", choices=("test",))
    al.add_argument("refs", nargs="*", metavar="NAME|URL",
                    help="default: every alert in alerts.toml")
    br = sub.add_parser("bridge")   # no help=: not listed (HIDDEN_COMMANDS)
    br.add_argument("run_dir")
    ag = sub.add_parser("agent")
    ag.add_argument("run_dir")
    ag.add_argument("--json", action="store_true")
    ag.add_argument("--adopt", action="store_true", help="take over a run whose agent died")
    ag.add_argument("--slurm", action="store_true", help="the run's Slurm batch job")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help", "--version")):
        argv = ["run", *argv]
    from trainctl.store.paths import UnsafePathError
    try:
        try:
            args = build_parser().parse_args(_joined_values(argv))
        except SystemExit:   # --help, --version, a usage error: its text may meet a closed pipe
            sys.stdout.flush()
            raise
        args.command_argv = command
        code = HANDLERS[args.cmd](args)
        sys.stdout.flush()   # a closed pipe is met here, never in the interpreter's exit
        return code
    except (UsageError, UnsafePathError) as e:   # a file not the user's, met anywhere: one line
        print(f"trainctl: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:   # `trainctl scan LOG | head`: the reader left; end quietly
        _quiet_stdout()
        return 141   # as a shell reports a command killed by SIGPIPE


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


# ---------------------------------------------------------------------- run / demo
def _prepare(args) -> tuple[Path, RunSpec, bool]:
    """Check the run's inputs, make its directory, write its spec: (run dir, spec, whether
    the directory is new: made here, so ours to remove if the run is refused)."""
    from trainctl.config import ConfigError, list_presets, load_job, load_preset, parse_deadline
    from trainctl.store.paths import RunFiles, UnsafePathError, check_run_dir, copy_private, create_run_dir, make_private_dir, new_run_dir
    from trainctl.store.spec import RunSpec

    try:
        job = load_job(Path(args.job)) if getattr(args, "job", None) else None
        if job is None and not args.command_argv:
            raise UsageError("give a job file (trainctl run trainctl.toml) or a command "
                             "(trainctl run -- python train.py); `trainctl demo` shows one")
        if job is not None and args.command_argv:
            raise UsageError("give either a job file or `-- COMMAND`, not both")
        # Absolute: the agent may run elsewhere (tmux, detached in the run directory).
        job_dir = job.path.resolve().parent if job else Path.cwd()
        search = [job_dir / "presets"]
        preset_ref = args.preset or (job.preset if job else None)
        fallback_ref = args.fallback or (job.fallback if job else None)
        preset = load_preset(preset_ref, search) if preset_ref else None
        fallback = load_preset(fallback_ref, search) if fallback_ref else None
        deadline = parse_deadline(args.deadline) if args.deadline else (job.deadline if job else None)
    except ConfigError as e:
        raise UsageError(str(e)) from e
    except ValueError as e:
        raise UsageError(f"--deadline: {e}") from e
    if args.max_restarts is not None and args.max_restarts < 0:
        raise UsageError("--max-restarts: must be an integer >= 0")
    for flag, value in (("--stall-timeout", args.stall_timeout), ("--startup-idle", args.startup_idle),
                        ("--silence-floor", args.silence_floor)):
        if value is not None and not (0 < value < math.inf):
            raise UsageError(f"{flag}: must be a finite number of seconds > 0 (got {value})")
    if not (0 <= args.rescue_wait < math.inf):   # 0: no rescue save
        raise UsageError(f"--rescue-wait: must be a finite number of seconds >= 0 (got {args.rescue_wait})")
    if job is None or job.kind in ("command", "torchrun"):
        _check_command(list(job.command) if job else list(args.command_argv), job_dir,
                       (preset.child_env() if preset else {}).get("PATH"))

    resume_args = list(args.resume_arg or (job.resume_args if job else []))
    kind = job.kind if job else ("torchrun" if is_torchrun(args.command_argv) else "command")
    node_rank, command = _node(args, job)
    resume_from = _resume_from(args.resume_from, kind, resume_args) if args.resume_from else None
    name = run_name(args, job)
    if node_rank is not None:   # one run per (job, node rank): its name, lock and tmux session
        name = f"{name}-node{node_rank}"
    run_dir_ref = args.run_dir or (job.run_dir if job and job.run_dir else None)
    from trainctl.store.joblock import JobBusy, holder
    running = holder(name)
    if running is not None:   # checked before anything is written; the agent checks again
        raise UsageError(str(JobBusy.of(name, running)))
    made: list[Path] = []   # the directory made here for this run: removed if it is refused
    try:
        try:
            if run_dir_ref:
                # Not resolved: a symlink is refused, never followed to someone's directory.
                run_dir = Path(os.path.abspath(Path(run_dir_ref).expanduser()))
                if os.path.lexists(run_dir):   # reused only when it is safe to (never chmodded)
                    check_run_dir(run_dir)
                    if RunFiles(run_dir).sock.exists() and _agent_alive(run_dir):
                        raise UsageError(f"{run_dir}: an agent is already running there "
                                         f"(trainctl attach {run_dir})")
                else:
                    made.append(create_run_dir(run_dir))
            else:
                run_dir = new_run_dir(name)   # made here: two runs started at once never share one
                made.append(run_dir)
            files = RunFiles(run_dir)
            make_private_dir(files.presets)
        except UnsafePathError as e:
            raise UsageError(f"--run-dir: {e}" if run_dir_ref else str(e)) from None
        # The run keeps its own copy of every preset it may switch to: the editor edits these.
        for path in list_presets(search):
            dst = files.presets / path.name
            if not dst.exists():
                copy_private(path, dst)
        for p in (preset, fallback):
            if p is not None and p.path is not None:
                copy_private(p.path, files.presets / f"{p.name}.toml")
        stall = dict(job.stall) if job else {}
        if args.stall_timeout is not None:
            stall["train_timeout"] = args.stall_timeout
        if args.startup_idle is not None:
            stall["startup_idle"] = args.startup_idle
        if args.silence_floor is not None:
            stall["silence_floor"] = args.silence_floor
        if job is not None:
            copy_private(job.path, files.job)
        spec = RunSpec(
            job_name=name, kind=kind,
            command=command,
            job_file=str(job.path.resolve()) if job and job.kind == "ultralytics" else None,
            preset=preset.name if preset else None, fallback=fallback.name if fallback else None,
            resume_args=resume_args, resume_from=resume_from,
            stall=stall, max_restarts=args.max_restarts if args.max_restarts is not None
            else (job.max_restarts if job else 3),
            auto_recover=not args.no_auto_recover, deadline=deadline,
            cost_per_hour=job.cost_per_hour if job else None, budget=job.budget if job else None,
            currency=job.currency if job else "$", host=os.uname().nodename, cwd=str(job_dir),
            rescue_wait_s=max(0.0, args.rescue_wait),
            progress=job.progress if job else None, setup=args.setup or "", remote=args.via_ssh,
            instrument=not getattr(args, "no_instrument", False) and (job.instrument if job else True),
            checkpoint_every=job.checkpoint_every if job and job.kind == "command" else None,
            slurm=(dict(job.slurm or {}) if job else {}) if getattr(args, "slurm", False)
            or (job is not None and job.slurm is not None) else None)
        spec.save(files.spec)
        _write_alerts(args, job, files.dir, name, spec.host)
        return run_dir, spec, not run_dir_ref
    except BaseException:
        for path in made:   # a refused run leaves nothing behind
            shutil.rmtree(path, ignore_errors=True)
        raise


def _write_alerts(args, job, run_dir: Path, name: str, host: str) -> None:
    """<run_dir>/alerts.json (0600) when the run has alerts: the agent and the holder read it."""
    from trainctl.alerts.settings import AlertConfigError, read_private_json, write_run_alerts
    sent = getattr(args, "alert_file", None)
    if sent:   # --host: the client resolved them; its file came 0600, never argv
        try:
            data = read_private_json(sent)
        except (OSError, ValueError, AlertConfigError) as e:
            raise UsageError(f"--alert-file: {e}") from None
        urls, on, attach = list(data.get("urls", [])), list(data.get("on", [])), data.get("attach")
        with contextlib.suppress(OSError):
            os.unlink(sent)
    else:
        urls, on = resolve_alerts(args, job)
        attach = None
    if urls:
        write_run_alerts(run_dir, urls, on, job=name, host=host,
                         attach=attach or f"trainctl attach {shlex.quote(str(run_dir))}")


def _check_command(argv: list[str], cwd: Path, path: str | None = None) -> None:
    """Refuse a command that cannot start, before any agent does: a path (relative to the
    job's working directory ``cwd``) must be an executable file, a bare name must be on
    ``path`` (the preset's PATH, else ours)."""
    if not argv or not argv[0]:
        raise UsageError("empty command: give one after `--` (trainctl run -- python train.py)")
    prog = argv[0]
    if "/" in prog:
        full = Path(cwd) / Path(prog).expanduser()
        if not full.exists():
            raise UsageError(f"command {prog!r} not found: no such file (in {cwd})")
        if full.is_dir() or not os.access(full, os.X_OK):
            raise UsageError(f"command {prog!r} is not an executable file (in {cwd}); "
                             f"chmod +x it, or run it through its interpreter")
    elif shutil.which(prog, path=path) is None:
        raise UsageError(f"command {prog!r} not found on PATH")


def _node(args, job) -> tuple[int | None, list[str]]:
    """(this node's rank, None for a job of one node; the command to run).  A kind =
    "torchrun" job of several nodes takes ``--node-rank`` (else its own node_rank); a
    torchrun command says its own ``--node-rank``."""
    from trainctl.config import torchrun_command
    from trainctl.core.torchrun import layout_options
    if job is not None and job.kind == "torchrun" and job.settings.get("nnodes", 1) > 1:
        nnodes = job.settings["nnodes"]
        rank = job.settings.get("node_rank", 0) if args.node_rank is None else args.node_rank
        if not 0 <= rank < nnodes:
            raise UsageError(f"--node-rank: must be 0 to {nnodes - 1} (the job has nnodes = {nnodes})")
        return rank, list(torchrun_command(job.settings, rank))
    if args.node_rank is not None:
        raise UsageError("--node-rank: only for a kind = \"torchrun\" job with nnodes > 1 (a "
                         "torchrun command gives torchrun's own --node-rank)")
    command = list(job.command) if job and job.kind != "ultralytics" else list(args.command_argv)
    nnodes, rank = layout_options(command)
    return (rank if nnodes > 1 else None), command


def _resume_from(ref: str, kind: str, resume_args: list[str]) -> str:
    """The checkpoint `--resume-from` names: a file, a checkpoint directory (a command's:
    Hugging Face, DeepSpeed), or an earlier run directory's newest checkpoint that verifies
    (a truncated one is never chosen).  One of a format that cannot be checked is used,
    saying so."""
    from trainctl.store.journal import read_events
    from trainctl.store.paths import RunFiles, UnsafePathError, trusted_run_dir
    from trainctl.store.checkpoint import inspect_checkpoint, pick_resume_checkpoint
    from trainctl.store.checkpoint_verify import checkpoint_dir_kinds, first_loadable, verify_path
    from trainctl.store.spec import RunSpec
    path = Path(ref).expanduser().resolve()
    if kind in ("command", "torchrun") and not resume_args:
        raise UsageError("--resume-from: a command resumes through its resume arguments; give "
                         "--resume-arg (e.g. --resume-arg=--resume --resume-arg={checkpoint}) "
                         "or resume_args in the job")

    def unverified(verdict) -> str:
        if not verdict.ok:
            note(f"--resume-from {verdict.path}: {verdict.detail}; resuming from it anyway")
        return str(verdict.path)

    files = RunFiles(path)
    if path.is_dir() and files.events.exists():
        try:   # its journal names the checkpoint to resume from: only a run of the user's
            trusted_run_dir(path)
        except UnsafePathError as e:
            raise UsageError(f"--resume-from {ref}: {e}") from None
        candidates = [ev.path for ev in read_events(files.events)
                      if ev.type == "checkpoint" and ev.ok and ev.path]
        if kind == "ultralytics":
            good = pick_resume_checkpoint([files.checkpoints / "last_good.pt", *candidates])
            if good is None:
                raise UsageError(f"--resume-from {ref}: that run has no checkpoint that verifies")
            return str(good)
        try:
            cwd = RunSpec.load(files.spec).cwd
        except (OSError, ValueError, TypeError, KeyError):
            cwd = None
        refused: list[str] = []
        verdict = first_loadable(reversed(candidates), base=cwd,
                                 on_skip=lambda p, why: refused.append(f"{p}: {why}"))
        if verdict is None:
            why = "".join(f"\n  {r}" for r in refused) or " (it reported none that still exists)"
            raise UsageError(f"--resume-from {ref}: that run has no checkpoint that verifies{why}")
        for r in refused:
            note(f"--resume-from: passed over {r}")
        return unverified(verdict)
    if not path.exists():
        raise UsageError(f"--resume-from {ref}: no such file or run directory")
    if path.is_dir() and (kind == "ultralytics" or not any(checkpoint_dir_kinds(path))):
        raise UsageError(f"--resume-from {ref}: not a checkpoint file nor a trainctl run directory "
                         "(no events.jsonl)" + ("" if kind == "ultralytics" else
                                                ", nor a Hugging Face or DeepSpeed checkpoint"))
    if kind == "ultralytics":
        check = inspect_checkpoint(path)
        ok, detail = check.ok, check.detail
    else:
        verdict = verify_path(path)
        ok, detail = verdict.usable, verdict.detail
    if not ok:
        raise UsageError(f"--resume-from {ref}: not a checkpoint that loads: {detail}")
    return str(path) if kind == "ultralytics" else unverified(verdict)


def _link_latest(run_dir: Path) -> None:
    from trainctl.store.paths import latest_link
    from trainctl.store.listing import register_run
    register_run(run_dir)   # `trainctl ls` finds it wherever it is
    link = latest_link()
    try:
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp = link.with_name(f".latest.{os.getpid()}.tmp")   # runs may start at once
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(run_dir)
        tmp.replace(link)
    except OSError:
        pass


def _run_agent(run_dir: Path, spec, as_json: bool,
               on_locked: Callable[[], None] | None = None, adopt: bool = False,
               slurm: bool = False, node=None) -> int:
    from trainctl.agent import Agent
    agent = Agent(run_dir, spec, printer=printer(as_json), on_locked=on_locked, adopt=adopt,
                  slurm=slurm, node=node)
    return asyncio.run(agent.run())


def _job_has_host(args) -> bool:
    if not getattr(args, "job", None):
        return False
    from trainctl.config import ConfigError, load_job
    try:
        return bool(load_job(Path(args.job)).host)
    except ConfigError as e:
        raise UsageError(str(e)) from e


def cmd_run(args) -> int:
    if args.host or _job_has_host(args):
        if args.slurm:
            raise UsageError("give --host or --slurm, not both (run from the cluster's login node)")
        from trainctl.cli.remote import run_remote
        from trainctl.hosts.all_runs import RunsSource
        return run_remote(args, RunsSource())
    run_dir, spec, created = _prepare(args)
    if spec.slurm is not None:
        from trainctl.hosts.slurm.jobs import run_slurm, submit_run
        job_id = submit_run(args, run_dir, spec, created)
        _link_latest(run_dir)
        from trainctl.hosts.all_runs import RunsSource
        return run_slurm(args, run_dir, job_id, RunsSource())
    if args.headless or args.json:
        if not args.json:
            print(f"trainctl: run directory {run_dir}", flush=True)
        # `latest` names the run once the job is its own: a refused run never touches it.
        code = _run_agent(run_dir, spec, args.json, on_locked=lambda: _link_latest(run_dir))
        if code == 2 and created and _never_began(run_dir):   # another run won: no trace
            shutil.rmtree(run_dir, ignore_errors=True)
        return code
    try:
        where = _start_detached_agent(run_dir, spec, use_tmux=not args.no_tmux)
    except UsageError:
        if created and _never_began(run_dir):   # refused before it began: leave no trace
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    _link_latest(run_dir)
    if args.detach:
        print(f"trainctl: {where}\ntrainctl: run directory {run_dir}", flush=True)
        return 0
    code = _attach_local(run_dir)
    if _agent_answers(run_dir):   # said after the dashboard: while it ran the line was hidden,
        print(f"trainctl: {where}")   # and for a run that has ended it is no longer true
    return code


def _agent_answers(run_dir: Path) -> bool:
    """Whether the run's agent still answers on its socket."""
    from trainctl.store.paths import RunFiles
    return RunFiles(run_dir).sock.exists() and _agent_alive(run_dir)


def cmd_demo(args) -> int:
    from trainctl.config.demo import DEMO_EPOCHS, demo_length_text, make_demo_job
    from trainctl.store.paths import cache_dir
    if args.epochs is not None and args.epochs < 1:
        raise UsageError(f"--epochs: must be 1 or more (got {args.epochs})")
    root = cache_dir() / "demo"
    epochs = args.epochs or DEMO_EPOCHS
    if not (args.json or args.headless):   # the text lines say it themselves
        note(demo_length_text(epochs))
    job = make_demo_job(root, epochs=epochs)
    args.job = str(job)
    args.command_argv = []
    return cmd_run(args)


def cmd_agent(args) -> int:
    from trainctl.store.paths import RunFiles
    from trainctl.store.paths import UnsafePathError, trusted_run_dir
    from trainctl.store.spec import RunSpec
    try:   # the agent runs what spec.json says: only from a directory of the user's own
        files = RunFiles(trusted_run_dir(args.run_dir))
        spec = RunSpec.load(files.spec)
    except (OSError, ValueError) as e:
        raise UsageError(f"{args.run_dir}: {e}") from None
    node = None
    if getattr(args, "slurm", False):
        node, files, spec = _slurm_node(files, spec)
    print(f"trainctl agent for {spec.job_name} — run directory {files.dir}\n"
          f"dashboard: trainctl attach {files.dir}", flush=True)
    code = _run_agent(files.dir, spec, args.json, adopt=getattr(args, "adopt", False),
                      slurm=getattr(args, "slurm", False), node=node)
    if code in RUN_ENDED_CODES:
        _close_own_pane()
    return code


RUN_ENDED_CODES = (0, 1, 130)
"""The agent's exit codes of a run that ended (FINISHED, FAILED, STOPPED): its journal says
all; any other (refused, supervision lost) keeps its tmux pane for reading."""


def _close_own_pane() -> None:
    """The agent in tmux (`trainctl run`), its run ended: its pane goes with it, not kept
    dead (remain-on-exit), so ended runs' sessions do not pile up."""
    pane = os.environ.get("TMUX_PANE")
    if not (os.environ.get("TRAINCTL_TMUX_SESSION") and os.environ.get("TMUX") and pane):
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):   # $TMUX names the server
        subprocess.run(["tmux", "set-option", "-w", "-t", pane, "remain-on-exit", "off"],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=10, check=False)


def _slurm_node(files, spec):
    """A Slurm job of several nodes: this agent's place (src/trainctl/hosts/slurm/nodes.py); node N > 0
    supervises in its own run directory, <run_dir>/node<N>; every node's torchrun joins the
    job's rendezvous.  (None, files, spec) for a job of one node."""
    from trainctl.hosts.slurm import commands as slurm
    from trainctl.hosts.slurm import nodes as slurm_nodes
    from trainctl.store.paths import RunFiles
    from trainctl.core.torchrun import across_nodes, is_torchrun
    try:
        node = slurm_nodes.place(files.dir)
        if node is None:
            return None, files, spec
        if not is_torchrun(spec.command):
            raise UsageError(f"a Slurm job of {node.nnodes} nodes runs a torchrun command on each "
                             "(kind = \"torchrun\"); this run's command is not one")
        if not node.lead:
            path, spec = slurm_nodes.prepare_node_dir(files.dir, node.node_rank)
            files = RunFiles(path)
    except (slurm.SlurmError, OSError, ValueError) as e:
        raise UsageError(f"Slurm node {os.environ.get('SLURM_NODEID', '?')}: {e}") from None
    spec.command = across_nodes(spec.command, node.nnodes, node.node_rank, node.endpoint,
                                node.rdzv_id, node.local_addr)
    return node, files, spec


def _agent_alive(run_dir: Path) -> bool:
    import socket
    from trainctl.store.paths import RunFiles
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(2)
        s.connect(str(RunFiles(run_dir).sock))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _start_detached_agent(run_dir: Path, spec, use_tmux: bool, adopt: bool = False) -> str:
    """Start `trainctl agent RUN_DIR` so it outlives this terminal: in a tmux session named
    after the job when tmux is there, else as a detached process.  Returns where it runs, in
    words, for the caller to say (an adopting agent's is said here, on stderr)."""
    from trainctl.store.paths import RunFiles
    files = RunFiles(run_dir)
    argv = [sys.executable, "-m", "trainctl", "agent", str(run_dir)] + (["--adopt"] if adopt else [])
    from trainctl.hosts import tmux
    if use_tmux and tmux.tmux_available():
        server = tmux.Tmux(os.environ.get("TRAINCTL_TMUX_SOCKET") or None)
        session = tmux.session_name(spec.job_name)
        try:
            server.start_session(session, argv, cwd=str(run_dir),
                                 env={"TRAINCTL_TMUX_SESSION": session})
        except tmux.TmuxError as e:
            raise UsageError(str(e)) from e
        where = (f"the agent runs in tmux session {session} "
                 f"(`{' '.join(server.attach_argv(session))}` shows it)")

        def gone() -> bool:   # remain-on-exit keeps a dead pane: look at its command
            return not server.session_alive(session)

        def said() -> str:   # what its pane shows, then the dead session goes
            try:
                return _last_lines(server.capture(session, lines=50))
            except tmux.TmuxError:
                return ""
            finally:
                with contextlib.suppress(tmux.TmuxError):
                    server.ensure_not_running(session)   # clears a dead session
    else:
        with open(files.dir / "agent.out", "ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    cwd=str(run_dir))
        why = "tmux not found" if use_tmux else "--no-tmux"
        where = f"the agent runs detached ({why}); its output: {files.dir / 'agent.out'}"
        if adopt:   # attach (--json too): stdout is the caller's, the news goes to stderr
            note(where)

        def gone() -> bool:
            return proc.poll() is not None

        def said() -> str:
            try:
                return _last_lines((files.dir / "agent.out").read_text(errors="replace"))
            except OSError:
                return ""
    deadline = time.monotonic() + 30
    next_check = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        if files.sock.exists() and _agent_alive(run_dir):
            return where
        if time.monotonic() >= next_check:
            next_check += 0.5
            if gone() and not (files.sock.exists() and _agent_alive(run_dir)):
                if not _never_began(run_dir):
                    return where   # it ran, and ended already (`-- true`): not a failure
                raise UsageError("the agent ended before it started the run: "
                                 + (said() or "it printed nothing"))
        time.sleep(0.1)
    raise UsageError(f"the agent did not start within 30 s; see {files.dir / 'agent.out'}")


def _never_began(run_dir: Path) -> bool:
    """No event in the run's journal: the agent refused (or never ran) before its start."""
    from trainctl.store.paths import RunFiles
    events = RunFiles(run_dir).events
    try:
        return events.stat().st_size == 0
    except FileNotFoundError:
        return True


def _last_lines(text: str) -> str:
    """Why the agent ended: its `trainctl:` lines (a refusal), else its last lines
    (sanitised: a tmux pane or agent.out holds what the trainer printed)."""
    from trainctl.core.sanitize import sanitize_text
    lines = [ln for ln in sanitize_text(text).strip().splitlines() if ln.strip()]
    refusals = [ln for ln in lines if ln.startswith("trainctl: ")]
    return "\n".join(refusals[-2:] or lines[-5:])


# ---------------------------------------------------------------------- attach / ctl / status
def _resolve_run_dir(ref: str | None) -> Path:
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


def _attach_local(run_dir: Path) -> int:
    from trainctl.hosts.where import client_for
    from trainctl.tui.app import run_dashboard
    from trainctl.hosts.all_runs import RunsSource
    return run_dashboard(lambda: client_for(run_dir),
                         attach_hint=f"{self_command()} attach {shlex.quote(str(run_dir))}",
                         runs=RunsSource(), run_key=("local", str(run_dir)))


def cmd_attach(args) -> int:
    if (args.tail is not None or args.from_snapshot) and not (args.json or args.headless):
        raise UsageError("--tail and --from-snapshot go with --json or --headless")
    if args.tail is not None and (args.tail < 0 or args.from_snapshot):
        raise UsageError("--tail takes a count of events (0 or more), without --from-snapshot")
    if args.target and args.target.startswith("ssh://"):
        from trainctl.cli.remote import attach_remote
        from trainctl.hosts.all_runs import RunsSource
        return attach_remote(args.target, follow=args.json or args.headless, as_json=args.json,
                             tail=args.tail, from_snapshot=args.from_snapshot, runs=RunsSource())
    run_dir = _resolve_run_dir(args.target)
    _adopt_if_orphaned(run_dir)
    if args.json or args.headless:
        from trainctl.hosts.where import client_for
        from trainctl.client.follow import follow
        return asyncio.run(follow(lambda: client_for(run_dir), printer(args.json), note,
                                  tail=args.tail, from_snapshot=args.from_snapshot,
                                  between_agents=_Adopting(run_dir)))
    return _attach_local(run_dir)


class _Adopting:
    """No agent answered, and the journal does not end the run: wait while an agent holds
    the run without listening yet (another `attach` beside this one won the race to adopt
    it, and starts), or the run still needs adopting (this attach's own agent lost that race
    and ended), up to ADOPT_WAIT_S; then end (3, the agent is gone)."""

    ADOPT_WAIT_S = 30.0

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.since = run_dir, None

    async def __call__(self, hello: dict) -> bool:
        from trainctl.agent.adopt import agent_running, needs_adoption
        now = time.monotonic()
        self.since = self.since or now
        if now - self.since > self.ADOPT_WAIT_S:
            return False
        if agent_running(self.run_dir):
            return True
        return await asyncio.get_running_loop().run_in_executor(None, needs_adoption, self.run_dir)


def _adopt_if_orphaned(run_dir: Path) -> bool:
    """A run whose agent died while its trainer lives on (or between attempts) gets a new
    agent that takes over supervision; attach (or ctl) then talks to that agent.  True when
    one was started."""
    from trainctl.agent.adopt import needs_adoption
    from trainctl.store.spec import RunSpec
    if not needs_adoption(run_dir):
        return False
    try:
        spec = RunSpec.load(run_dir / "spec.json")
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot adopt the run: {e}") from None
    note(f"the agent of {run_dir} is gone while its run goes on: starting a new agent to adopt it")
    _start_detached_agent(run_dir, spec, use_tmux=False, adopt=True)
    return True


async def _one_command(run_dir: Path, name: str, timeout: float | None = None, **kw) -> dict:
    """One command's reply; AgentUnavailable when no agent runs, AgentNotResponding when
    it does not answer the hello (a few seconds) or the command (``timeout``)."""
    from trainctl.hosts.where import client_for
    from trainctl.client.connection import COMMAND_TIMEOUT_S
    client = client_for(run_dir)
    try:
        await client.connect(since=10**12)
        return await client.command(name, timeout=timeout or COMMAND_TIMEOUT_S, **kw)
    finally:
        await client.close()


def cmd_ctl(args) -> int:
    from trainctl.client.connection import AgentNotResponding, AgentUnavailable
    run_dir = _resolve_run_dir(args.run_dir)
    kw = {}
    if args.command == "switch_preset":
        if not args.preset:
            raise UsageError("switch_preset needs --preset NAME")
        kw["preset"] = args.preset
    elif args.preset and args.command == "restart":
        args.command, kw = "switch_preset", {"preset": args.preset}
    if args.command == "auto_recover" and args.on is not None:
        kw["on"] = args.on
    from trainctl.hosts.where import AgentUnreachable, UntrustedRun
    try:
        try:
            reply = asyncio.run(_one_command(run_dir, args.command, **kw))
        except AgentUnavailable as e:   # no agent here: a trainer without one is adopted first
            if isinstance(e, (UntrustedRun, AgentNotResponding, AgentUnreachable)) \
                    or not _adopt_if_orphaned(run_dir):
                raise
            reply = asyncio.run(_one_command(run_dir, args.command, **kw))
    except UntrustedRun as e:   # never a scancel of a job id read from such a directory
        print(f"trainctl: {e}", file=sys.stderr)
        return e.exit_code
    except (AgentNotResponding, AgentUnreachable) as e:
        from trainctl.hosts.slurm.jobs import is_slurm_run, stop_waiting_job
        if isinstance(e, AgentUnreachable) and args.command == "stop" and is_slurm_run(run_dir):
            note(f"{e}; stopping the run through Slurm instead (scancel)")
            return stop_waiting_job(run_dir)   # its agent gets SIGTERM: STOPPED by the user
        print(f"trainctl: {e}", file=sys.stderr)
        return e.exit_code
    except AgentUnavailable as e:
        from trainctl.hosts.slurm.jobs import is_slurm_run, stop_waiting_job
        if args.command == "stop" and is_slurm_run(run_dir):
            return stop_waiting_job(run_dir)   # its job waits in the queue: scancel it
        print(f"trainctl: {e}", file=sys.stderr)
        return 1
    if not reply.get("ok"):
        print(f"trainctl: {args.command} refused: {reply.get('error')}", file=sys.stderr)
        return 2
    print(json.dumps(reply.get("result"), indent=2))
    return 0


def cmd_status(args) -> int:
    """The agent's status, else the run directory's; exit 4 (after the run directory's)
    when the agent is there but does not answer."""
    from trainctl.core import events as E
    from trainctl.client.connection import AgentNotResponding, AgentUnavailable
    from trainctl.core.recovery import FINAL_STATES
    run_dir = _resolve_run_dir(args.run_dir)
    code, agent = 0, "agent live"
    try:
        reply = asyncio.run(_one_command(run_dir, "status", timeout=10.0))
        status = reply.get("result") or {}
        status["live"] = True
    except (AgentUnavailable, OSError) as e:
        from trainctl.hosts.where import AgentUnreachable
        agent = "agent not running"
        if isinstance(e, (AgentNotResponding, AgentUnreachable)):
            print(f"trainctl: {e}", file=sys.stderr)
            code, agent = e.exit_code, ("agent not responding" if isinstance(
                e, AgentNotResponding) else "agent's node not reachable") + "; from its journal"
        from trainctl.client.connection import offline_hello, offline_view
        covered = offline_view(run_dir)   # its snapshot, then the journal after it
        status = offline_hello(run_dir, covered)   # job, preset, attempt and state
        status.pop("op", None)
        status.pop("ok", None)
        view = covered.view
        if view.projection is not None:
            status["projection"] = E.to_dict(view.projection)
        if view.progress is not None:
            status["progress"] = E.to_dict(view.progress)
        status["save_dir"] = view.save_dir
        if view.ranks:
            from trainctl.agent.handlers import rank_status
            status["ranks"] = rank_status(view.rank_rows(), view.stuck_ranks)
        if code:
            status["responding"] = False
        from trainctl.holder.handle import live_trainer
        if code == 0 and (st := live_trainer(run_dir)) is not None:   # agent gone, trainer not
            status["trainer"] = {"pid": st["pid"], "attempt": st.get("attempt"),
                                 "holder_alive": st["holder_alive"]}
            agent = (f"agent not running; its trainer (pid {st['pid']}) runs on "
                     f"{'under its holder' if st['holder_alive'] else 'unsupervised, its holder gone too'}: "
                     f"`trainctl attach {run_dir}` adopts it, `trainctl ctl {run_dir} stop` stops it")
        from trainctl.core.recovery import FINAL_STATES as _FINAL
        from trainctl.hosts.slurm.jobs import slurm_status
        sl = slurm_status(run_dir)
        if sl is not None:
            status["slurm"] = sl
            if status.get("state") not in _FINAL and sl.get("state") == "PENDING":
                status["state"] = "PENDING"
    from trainctl.hosts.slurm.jobs import node_status
    nodes = node_status(run_dir)
    if nodes:   # a Slurm job of several nodes: the others' agents, and their ranks in the run's
        status["nodes"] = nodes
        ranks = status.setdefault("ranks", {})
        for node in nodes:
            for r, row in node["ranks"].items():
                ranks.setdefault(r, row)
        status["ranks"] = dict(sorted(ranks.items(), key=lambda kv: int(kv[0])))
    if args.json:
        print(json.dumps(status, indent=2))
        return code
    from trainctl.core.projection_text import format_projection
    print(f"run     {status.get('run_dir', run_dir)} ({agent})")
    print(f"state   {status.get('state', '?')}   preset {status.get('preset') or '-'}"
          f"   attempt {status.get('attempt', '?')}")
    if status.get("slurm"):
        sl = status["slurm"]
        reason = f" ({sl['reason']})" if sl.get("reason") not in (None, "", "None") else ""
        print(f"slurm   job {sl['job']} {sl.get('state', sl.get('error', '?'))}{reason}"
              f"   jobs {', '.join(sl['jobs'])}")
    proj = status.get("projection")
    if proj and status.get("state") in FINAL_STATES and not proj.get("finished"):
        print(f"        no ETA: the run is {status['state']}")   # its last live one is stale
    elif proj:
        for line in format_projection(E.from_dict(proj), time.time(), status.get("currency", "$")):
            print(f"        {line}")
    else:
        print("        no projection yet")
    if status.get("save_dir"):   # Ultralytics' save_dir: the weights, plots and results.csv
        print(f"results {status['save_dir']}")
    if status.get("progress"):
        from trainctl.agent.scan import describe_position
        with contextlib.suppress(ValueError, TypeError, KeyError):   # an older agent's reply
            print(f"at      {describe_position(E.from_dict(status['progress']))}")
    if status.get("ranks"):
        print("ranks   " + _rank_rows(status["ranks"]))
    for node in status.get("nodes", ()):
        print(f"node {node['node']}  {node.get('state') or '?'}   attempt {node.get('attempt') or '?'}"
              f"   {'agent live' if node['live'] else 'agent not running'}   {node['run_dir']}")
    return code


def _rank_rows(ranks: dict) -> str:
    return " · ".join(f"{r}: epoch {v.get('epoch')} batch {v.get('batch')}/{v.get('batches') or '?'}"
                      + (" STUCK" if v.get("stuck") else "") for r, v in ranks.items())


def cmd_ls(args) -> int:
    """Every run: this machine's (run directories, Slurm jobs), then each host's in
    <config>/hosts.toml (``hosts = ["gpu-box", ...]``) over ssh (`trainctl ls --here --json`
    there).  A host that cannot be reached is a row saying why."""
    from trainctl.hosts.all_runs import all_rows
    rows = all_rows(here=args.here)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(_ls_table(rows))
    return 0


def _ls_table(rows: list[dict]) -> str:
    from trainctl.store.listing import COLUMNS, row_cells
    lines = [COLUMNS, *(row_cells(r) for r in rows)]
    widths = [max(len(ln[i]) for ln in lines) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(ln, widths)) + "  " + ln[-1]
                     for ln in lines)


def cmd_bridge(args) -> int:
    """Relay stdin/stdout to the agent's socket (what `ssh HOST trainctl bridge DIR` runs).
    The agent's hello must come within HELLO_TIMEOUT_S: else the bridge answers the client
    with a failed hello (``"ok": false``, ``"error": "agent not responding (pid N, stopped)
    ..."``) and exits 4.  A run directory not the user's own: one line, exit 2, no relay."""
    from trainctl.client.connection import HELLO_TIMEOUT_S, UnixTransport
    from trainctl.store.paths import RunFiles, UnsafePathError, trusted_run_dir
    try:
        trusted_run_dir(args.run_dir)
    except UnsafePathError as e:
        print(f"trainctl bridge: {e}; not relaying", file=sys.stderr)
        return 2
    sock = RunFiles(args.run_dir).sock

    def not_responding(what: str) -> int:
        error = UnixTransport(sock).not_responding(what)
        print(f"trainctl bridge: {error}", file=sys.stderr)
        sys.stdout.buffer.write((json.dumps({"op": "hello", "ok": False, "error": error})
                                 + "\n").encode())
        sys.stdout.buffer.flush()
        return 4

    async def relay() -> int:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(str(sock), limit=1 << 22), HELLO_TIMEOUT_S)
        except asyncio.TimeoutError:
            return not_responding(f"its socket did not accept within {HELLO_TIMEOUT_S:g} s")
        except OSError as e:
            if not RunFiles(args.run_dir).events.exists():
                print(f"trainctl bridge: no agent at {sock} and no journal there: {e.strerror}",
                      file=sys.stderr)
                return 1
            # The run is over (or its agent died): answer with its journal, then end.
            from trainctl.client.connection import offline_lines, parse_hello
            first = sys.stdin.buffer.readline()
            sys.stdout.buffer.write("".join(offline_lines(args.run_dir, parse_hello(first))).encode())
            sys.stdout.buffer.flush()
            return 0
        loop = asyncio.get_running_loop()
        stdin = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
        out = sys.stdout.buffer
        # The hello goes through first, and its answer must come in time (a stopped agent
        # accepts, as its kernel does, but never answers).
        hello = await stdin.readline()
        if not hello:
            return 0   # the client went before it said hello
        writer.write(hello)
        try:
            first = await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT_S)
        except asyncio.TimeoutError:
            writer.close()
            return not_responding(f"no hello within {HELLO_TIMEOUT_S:g} s")
        out.write(first)
        out.flush()

        async def up():
            while data := await stdin.read(65536):
                writer.write(data)
                await writer.drain()
            writer.write_eof()

        async def down():
            while data := await reader.read(65536):
                out.write(data)
                out.flush()
        up_task = asyncio.create_task(up())
        await down()
        up_task.cancel()
        return 0
    try:
        return asyncio.run(relay())
    except (BrokenPipeError, ConnectionError):
        return 0


def cmd_alerts(args) -> int:
    """`trainctl alerts test [NAME|URL ...]`: a test message to each; says which accepted it."""
    from trainctl.alerts.settings import AlertConfigError, is_url, load_user_alerts, redact, resolve
    from trainctl.alerts.sink import send_with_helper
    try:
        user = load_user_alerts()
        refs = args.refs or sorted(user.named)
        if not refs:
            raise UsageError(f"no alerts configured: add [alert.NAME] url = \"...\" to "
                             f"{user.path} (0600), or give an apprise URL")
        if any(is_url(r) for r in args.refs):
            note("a URL on the command line is visible in the process list; prefer a name")
        pairs = [(ref, resolve([ref], user)) for ref in refs]
    except AlertConfigError as e:
        raise UsageError(str(e)) from None
    host = os.uname().nodename
    ok_all = True
    for ref, urls in pairs:
        label = redact(ref) if is_url(ref) else ref
        results = send_with_helper(urls, f"trainctl: test alert ({label})",
                                   f"A test message from trainctl on {host}. Alerts to "
                                   f"{label} reach you.")
        for r in results:
            ok_all &= bool(r["ok"])
            # a URL given is its own label (redacted alike): said once
            who = r["url"] if r["url"] == label else f"{label}: {r['url']}"
            print(f"{who}: " + ("accepted" if r["ok"] else f"NOT accepted: {r['error']}"))
    return 0 if ok_all else 1


def cmd_scan(args) -> int:
    from trainctl.agent.scan import main_scan
    from trainctl.agent.scan_explain import main_explain
    if args.explain or args.job:
        return main_explain(args.logfile, args.json, args.job)
    return main_scan(args.logfile, args.json, args.kernel_log)


def cmd_presets(args) -> int:
    """list (a table: a broken preset is a row saying so), show, validate (every preset when
    none is named), edit (a shipped preset: a copy in the user's config directory)."""
    from trainctl.config import ConfigError, list_presets, load_preset
    if args.action == "list":
        print(_presets_table(list_presets()))
        return 0
    if not args.names and args.action != "validate":
        raise UsageError(f"presets {args.action} needs a preset name or path")
    status = 0
    for ref in args.names or [str(p) for p in list_presets()]:
        try:
            p = load_preset(ref)
        except ConfigError as e:
            print(f"trainctl: {e}", file=sys.stderr)
            status = 2
            continue
        if args.action == "show":
            print(f"# {p.path}")
            print(Path(p.path).read_text() if p.path else p)
        elif args.action == "validate":
            print(f"{p.path}: ok")
        elif args.action == "edit":
            status = max(status, _edit_preset(p))
    return status


def _presets_table(paths: list[Path]) -> str:
    """NAME, FILE, WHAT: one line each; an invalid preset's line says so and how to see why."""
    from trainctl.config import ConfigError, load_preset
    from trainctl.core.sanitize import sanitize_text
    rows = [("NAME", "FILE", "WHAT")]
    for path in paths:
        try:
            what = load_preset(path).description or "-"
        except ConfigError as e:
            problems = str(e).count("\n") + 1
            what = (f"INVALID ({problems} problem{'s' if problems > 1 else ''}: "
                    f"trainctl presets validate {shlex.quote(str(path))})")
        rows.append((path.stem, str(path), " ".join(sanitize_text(what).split())))
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    return "\n".join(f"{r[0].ljust(widths[0])}  {r[1].ljust(widths[1])}  {r[2]}" for r in rows)


def _edit_preset(p) -> int:
    """$EDITOR on the preset, again while it does not validate.  A preset shipped with
    trainctl is never changed: the user's copy in <config dir>/presets is edited (made from
    it when missing), and shadows it wherever the name is looked up."""
    from trainctl.config import ConfigError, is_shipped, load_preset, user_config_dir
    path = Path(p.path)
    if is_shipped(path):
        copy = user_config_dir() / "presets" / path.name
        if not copy.exists():
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, copy)
            note(f"{path.name} is shipped with trainctl: editing your copy {copy} "
                 "(it takes the place of the shipped one)")
        else:
            note(f"{path.name} is shipped with trainctl: editing your copy {copy}")
        path = copy
    editor = _editor_argv()
    while True:
        try:
            subprocess.call([*editor, str(path)])
        except OSError as e:
            raise UsageError(f"cannot start the editor {editor[0]!r} ($VISUAL/$EDITOR "
                             f"= {shlex.join(editor)!r}): {e.strerror or e}") from None
        try:
            load_preset(path)
            print(f"{path}: ok")
            return 0
        except ConfigError as e:
            print(f"trainctl: {e}", file=sys.stderr)
            if input("edit again? [Y/n] ").strip().lower() == "n":
                return 2


def _editor_argv() -> list[str]:
    """$VISUAL, else $EDITOR, else vi, split as a shell would (`code --wait`)."""
    value = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    try:
        argv = shlex.split(value)
    except ValueError as e:
        raise UsageError(f"$VISUAL/$EDITOR = {value!r}: cannot split it ({e})") from None
    if not argv:
        raise UsageError("$VISUAL/$EDITOR is blank: set it to an editor command")
    return argv


HANDLERS = {"run": cmd_run, "demo": cmd_demo, "attach": cmd_attach, "status": cmd_status, "ls": cmd_ls,
            "presets": cmd_presets, "scan": cmd_scan, "ctl": cmd_ctl, "bridge": cmd_bridge,
            "agent": cmd_agent, "alerts": cmd_alerts}
