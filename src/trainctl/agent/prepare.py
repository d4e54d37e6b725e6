"""The spec builder: check a run's inputs (job file, presets, options), make its run
directory and write its spec (and its private alerts.json), before any agent starts.
`trainctl run` (src/trainctl/cli/run.py), a `--host` run on its box and a Slurm
submission all start from :func:`prepare_run`.  A refusal is a UsageError (one line, exit
2) and leaves nothing behind.  Messages for the user go through ``note`` (the CLI's)."""

from __future__ import annotations

import contextlib
import math
import os
import re
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trainctl.config.kinds import checkpoint_glob_problem
from trainctl.core.statefile import replace_with_symlink
from trainctl.core.torchrun import is_torchrun
from trainctl.core.usage import UsageError

if TYPE_CHECKING:
    from trainctl.store.spec import RunSpec

Note = Callable[[str], None]


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
    if given is None:  # from the command: `../.x.py` names no path
        name = re.sub(r"\.{2,}", ".", name).lstrip(".-")[:MAX_NAME]
    return name or "run"


def resolve_alerts(args, job, note: Note) -> tuple[list[str], list[str]]:
    """The run's alert (urls, on): the job's [alerts], --alert, alerts.toml's default; a
    raw URL on the command line is accepted with a note (the process list shows it)."""
    from trainctl.alerts.settings import AlertConfigError, is_url, load_user_alerts, run_alerts

    refs = list(getattr(args, "alert", None) or [])
    if any(is_url(r) for r in refs):
        note(
            "an --alert URL is visible in the process list and your shell history; "
            "name it in alerts.toml instead (trainctl alerts test NAME)"
        )
    try:
        user = load_user_alerts()
        for text in user.skipped:  # the user's file: its bad entries named, the rest used
            note(text)
        return run_alerts(job.alerts if job else None, refs, user)
    except AlertConfigError as e:
        raise UsageError(str(e)) from None


def agent_alive(run_dir: Path) -> bool:
    """Whether an agent accepts on the run's socket (within 2 s)."""
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


def prepare_run(args, note: Note) -> tuple[Path, RunSpec, bool]:
    """Check the run's inputs, make its directory, write its spec: (run dir, spec, whether
    the directory is new: made here, so ours to remove if the run is refused)."""
    from trainctl.store.paths import copy_private

    job, job_dir, search, preset, fallback, deadline = _inputs(args)
    resume_args = list(args.resume_arg or (job.resume_args if job else []))
    for glob in getattr(args, "checkpoints", None) or ():
        if (why := checkpoint_glob_problem(glob)) is not None:
            raise UsageError(f"--checkpoints: {why}")
    kind = job.kind if job else ("torchrun" if is_torchrun(args.command_argv) else "command")
    node_rank, command = node(args, job)
    trusted = [str(Path(t).expanduser().resolve()) for t in args.trust_checkpoint]
    trusted += [str(t) for t in job.trust_checkpoints] if job else []
    resume_from = (
        resume_checkpoint(args.resume_from, kind, resume_args, note, trusted) if args.resume_from else None
    )
    name = run_name(args, job)
    if node_rank is not None:  # one run per (job, node rank): its name, lock and tmux session
        name = f"{name}-node{node_rank}"
    run_dir_ref = args.run_dir or (job.run_dir if job and job.run_dir else None)
    from trainctl.store.joblock import JobBusy, holder

    running = holder(name)
    if running is not None:  # checked before anything is written; the agent checks again
        raise UsageError(str(JobBusy.of(name, running)))
    made: list[Path] = []  # the directory made here for this run: removed if it is refused
    try:
        run_dir, files = _make_run_dir(run_dir_ref, name, made)
        _copy_presets(files, search, preset, fallback)
        if job is not None:
            copy_private(job.path, files.job)
        spec = _spec(
            args, job, job_dir, name, kind, command, preset, fallback, resume_args, resume_from, deadline
        )
        spec.trusted_checkpoints = trusted
        spec.save(files.spec)
        _write_alerts(args, job, files.dir, name, spec.host, note)
        return run_dir, spec, not run_dir_ref
    except BaseException:
        for path in made:  # a refused run leaves nothing behind
            shutil.rmtree(path, ignore_errors=True)
        raise


def _inputs(args):
    """(job, job_dir, preset search path, preset, fallback, deadline), every option checked
    and the command found (UsageError otherwise)."""
    from trainctl.config import ConfigError, load_job, load_preset, parse_deadline
    from trainctl.config.ladder import rung_preset

    try:
        job = load_job(Path(args.job)) if getattr(args, "job", None) else None
        if job is None and not args.command_argv:
            raise UsageError(
                "give a job file (trainctl run trainctl.toml) or a command "
                "(trainctl run -- python train.py); `trainctl demo` shows one"
            )
        if job is not None and args.command_argv:
            raise UsageError("give either a job file or `-- COMMAND`, not both")
        # Absolute: the agent may run elsewhere (tmux, detached in the run directory).
        job_dir = job.path.resolve().parent if job else Path.cwd()
        search = [job_dir / "presets"]
        preset_ref = args.preset or (job.preset if job else None)
        if (
            not args.preset
            and job is not None
            and job.ladder is not None
            and preset_ref not in job.ladder.rungs
        ):
            preset_ref = job.ladder.rungs[0]  # a ladder starts on its fastest rung (A.w8 for preset A)
        fallback_ref = args.fallback or (job.fallback if job else None)
        preset = rung_preset(preset_ref, lambda n: load_preset(n, search)) if preset_ref else None
        fallback = load_preset(fallback_ref, search) if fallback_ref else None
        deadline = parse_deadline(args.deadline) if args.deadline else (job.deadline if job else None)
    except ConfigError as e:
        raise UsageError(str(e)) from e
    except ValueError as e:
        raise UsageError(f"--deadline: {e}") from e
    if args.max_restarts is not None and args.max_restarts < 0:
        raise UsageError("--max-restarts: must be an integer >= 0")
    for flag, value in (
        ("--stall-timeout", args.stall_timeout),
        ("--startup-idle", args.startup_idle),
        ("--silence-floor", args.silence_floor),
    ):
        if value is not None and not (0 < value < math.inf):
            raise UsageError(f"{flag}: must be a finite number of seconds > 0 (got {value})")
    if not (0 <= args.rescue_wait < math.inf):  # 0: no rescue save
        raise UsageError(f"--rescue-wait: must be a finite number of seconds >= 0 (got {args.rescue_wait})")
    if job is None or job.kind in ("command", "torchrun"):
        check_command(
            list(job.command) if job else list(args.command_argv),
            job_dir,
            (preset.child_env() if preset else {}).get("PATH"),
        )
    _refuse_keys_without_effect(args, job, job_dir, (preset, fallback))
    return job, job_dir, search, preset, fallback, deadline


def _refuse_keys_without_effect(args, job, job_dir, presets) -> None:
    """A preset key that cannot act on this job is refused now, with the reason."""
    from trainctl.agent.zero_code import python_command
    from trainctl.config.preset import keys_without_effect

    kind = job.kind if job else ("torchrun" if is_torchrun(args.command_argv) else "command")
    command = list(job.command) if job and job.kind != "ultralytics" else list(args.command_argv)
    instrument = not getattr(args, "no_instrument", False) and (job.instrument if job else True)
    python = instrument and kind == "command" and python_command(command, job_dir or ".")
    for p in presets:
        if p is not None and (why := keys_without_effect(p, kind, python)):
            raise UsageError("; ".join(why))


def _make_run_dir(run_dir_ref: str | None, name: str, made: list[Path]):
    """(run dir, its RunFiles): the one given (reused only when it is safe to, and no agent
    runs there), else a new one; a directory made here is added to ``made``."""
    from trainctl.store.paths import (
        RunFiles,
        UnsafePathError,
        check_run_dir,
        create_run_dir,
        make_private_dir,
        new_run_dir,
    )

    try:
        if run_dir_ref:
            # Not resolved: a symlink is refused, never followed to someone's directory.
            run_dir = Path(os.path.abspath(Path(run_dir_ref).expanduser()))
            if os.path.lexists(run_dir):  # reused only when it is safe to (never chmodded)
                check_run_dir(run_dir)
                if RunFiles(run_dir).sock.exists() and agent_alive(run_dir):
                    raise UsageError(
                        f"{run_dir}: an agent is already running there (trainctl attach {run_dir})"
                    )
            else:
                made.append(create_run_dir(run_dir))
        else:
            run_dir = new_run_dir(name)  # made here: two runs started at once never share one
            made.append(run_dir)
        files = RunFiles(run_dir)
        make_private_dir(files.presets)
    except UnsafePathError as e:
        raise UsageError(f"--run-dir: {e}" if run_dir_ref else str(e)) from None
    return run_dir, files


def _copy_presets(files, search: list[Path], preset, fallback) -> None:
    """The run keeps its own copy of every preset it may switch to: the editor edits these."""
    from trainctl.config import list_presets
    from trainctl.store.paths import copy_private

    for path in list_presets(search):
        dst = files.presets / path.name
        if not dst.exists():
            copy_private(path, dst)
    for p in (preset, fallback):
        if p is not None and p.path is not None and p.path.stem == p.name:  # a workers rung has none
            copy_private(p.path, files.presets / f"{p.name}.toml")


def _spec(
    args,
    job,
    job_dir: Path,
    name: str,
    kind: str,
    command: list[str],
    preset,
    fallback,
    resume_args: list[str],
    resume_from: str | None,
    deadline,
) -> RunSpec:
    from trainctl.store.spec import RunSpec

    stall = dict(job.stall) if job else {}
    if args.stall_timeout is not None:
        stall["train_timeout"] = args.stall_timeout
    if args.startup_idle is not None:
        stall["startup_idle"] = args.startup_idle
    if args.silence_floor is not None:
        stall["silence_floor"] = args.silence_floor
    return RunSpec(
        job_name=name,
        kind=kind,
        command=command,
        job_file=str(job.path.resolve()) if job and job.kind == "ultralytics" else None,
        preset=preset.name if preset else None,
        fallback=fallback.name if fallback else None,
        resume_args=resume_args,
        resume_from=resume_from,
        checkpoints=list(getattr(args, "checkpoints", None) or (job.checkpoints if job else ())),
        stall=stall,
        max_restarts=args.max_restarts if args.max_restarts is not None else (job.max_restarts if job else 3),
        auto_recover=not args.no_auto_recover,
        deadline=deadline,
        cost_per_hour=job.cost_per_hour if job else None,
        budget=job.budget if job else None,
        currency=job.currency if job else "$",
        host=os.uname().nodename,
        cwd=str(job_dir),
        rescue_wait_s=max(0.0, args.rescue_wait),
        progress=job.progress if job else None,
        setup=args.setup or "",
        remote=args.via_ssh,
        instrument=not getattr(args, "no_instrument", False) and (job.instrument if job else True),
        spare=not getattr(args, "no_spare", False) and (job.spare if job else True),
        checkpoint_every=job.checkpoint_every if job and job.kind == "command" else None,
        ladder=list(job.ladder.rungs) if job and job.ladder else [],
        ladder_stable_s=job.ladder.stable_s if job and job.ladder else None,
        checkpoint_auto=bool(job and job.checkpoint_auto),
        slurm=(dict(job.slurm or {}) if job else {})
        if getattr(args, "slurm", False) or (job is not None and job.slurm is not None)
        else None,
    )


def _write_alerts(args, job, run_dir: Path, name: str, host: str, note: Note) -> None:
    """<run_dir>/alerts.json (0600) when the run has alerts: the agent and the holder read it."""
    from trainctl.alerts.settings import AlertConfigError, read_private_json, write_run_alerts

    sent = getattr(args, "alert_file", None)
    if sent:  # --host: the client resolved them; its file came 0600, never argv
        try:
            data = read_private_json(sent)
        except (OSError, ValueError, AlertConfigError) as e:
            raise UsageError(f"--alert-file: {e}") from None
        urls, on, attach = list(data.get("urls", [])), list(data.get("on", [])), data.get("attach")
        with contextlib.suppress(OSError):
            os.unlink(sent)
    else:
        urls, on = resolve_alerts(args, job, note)
        attach = None
    if urls:
        write_run_alerts(
            run_dir,
            urls,
            on,
            job=name,
            host=host,
            attach=attach or f"trainctl attach {shlex.quote(str(run_dir))}",
        )


def check_command(argv: list[str], cwd: Path, path: str | None = None) -> None:
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
            raise UsageError(
                f"command {prog!r} is not an executable file (in {cwd}); "
                f"chmod +x it, or run it through its interpreter"
            )
    elif shutil.which(prog, path=path) is None:
        raise UsageError(f"command {prog!r} not found on PATH")


def node(args, job) -> tuple[int | None, list[str]]:
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
        raise UsageError(
            '--node-rank: only for a kind = "torchrun" job with nnodes > 1 (a '
            "torchrun command gives torchrun's own --node-rank)"
        )
    command = list(job.command) if job and job.kind != "ultralytics" else list(args.command_argv)
    nnodes, rank = layout_options(command)
    return (rank if nnodes > 1 else None), command


def resume_checkpoint(ref: str, kind: str, resume_args: list[str], note: Note, trusted: list[str]) -> str:
    """The checkpoint `--resume-from` names: a file, a checkpoint directory (a command's:
    Hugging Face, DeepSpeed), or an earlier run directory's newest checkpoint that verifies
    (a truncated one is never chosen).  One of a format that cannot be checked is used,
    saying so.  The checkpoint gate judges it first (store/checkpoint_gate.py): an
    Ultralytics one by the allowlist (the runner unpickles it), a command's by the globals
    that execute code (the command loads it itself); a file in ``trusted`` passes."""
    from trainctl.agent.launch import reported_checkpoints
    from trainctl.store.checkpoint import inspect_checkpoint, pick_resume_checkpoint
    from trainctl.store.checkpoint_gate import is_trusted, script_checkpoint_refusal
    from trainctl.store.checkpoint_verify import checkpoint_dir_kinds, first_loadable, verify_path
    from trainctl.store.paths import RunFiles, UnsafePathError, trusted_run_dir
    from trainctl.store.spec import RunSpec

    path = Path(ref).expanduser().resolve()
    if kind in ("command", "torchrun") and not resume_args:
        raise UsageError(
            "--resume-from: a command resumes through its resume arguments; give "
            "--resume-arg (e.g. --resume-arg=--resume --resume-arg={checkpoint}) "
            "or resume_args in the job"
        )

    def unverified(verdict) -> str:
        refused = None if is_trusted(verdict.path, trusted) else script_checkpoint_refusal(verdict.path)
        if refused is not None:
            raise UsageError(f"--resume-from {ref}: {refused}")
        if not verdict.ok:
            note(f"--resume-from {verdict.path}: {verdict.detail}; resuming from it anyway")
        return str(verdict.path)

    files = RunFiles(path)
    if path.is_dir() and files.events.exists():
        try:  # its journal names the checkpoint to resume from: only a run of the user's
            trusted_run_dir(path)
        except UnsafePathError as e:
            raise UsageError(f"--resume-from {ref}: {e}") from None
        # The agent's rule (src/trainctl/agent/launch.py): the journal's checkpoints, newest first.
        newest_first = reported_checkpoints(files, None, None)
        if kind == "ultralytics":
            passed: list[str] = []
            good = pick_resume_checkpoint(
                [files.checkpoints / "last_good.pt", *reversed(newest_first)],
                trusted=trusted,
                on_skip=lambda p, why: passed.append(f"\n  {p}: {why}"),
            )
            if good is None:
                raise UsageError(
                    f"--resume-from {ref}: that run has no checkpoint that verifies{''.join(passed)}"
                )
            return str(good)
        try:
            cwd = RunSpec.load(files.spec).cwd
        except (OSError, ValueError, TypeError, KeyError):
            cwd = None
        refused: list[str] = []
        verdict = first_loadable(newest_first, base=cwd, on_skip=lambda p, why: refused.append(f"{p}: {why}"))
        if verdict is None:
            why = "".join(f"\n  {r}" for r in refused) or " (it reported none that still exists)"
            raise UsageError(f"--resume-from {ref}: that run has no checkpoint that verifies{why}")
        for r in refused:
            note(f"--resume-from: passed over {r}")
        return unverified(verdict)
    if not path.exists():
        raise UsageError(f"--resume-from {ref}: no such file or run directory")
    if path.is_dir() and (kind == "ultralytics" or not any(checkpoint_dir_kinds(path))):
        raise UsageError(
            f"--resume-from {ref}: not a checkpoint file nor a trainctl run directory "
            "(no events.jsonl)"
            + ("" if kind == "ultralytics" else ", nor a Hugging Face or DeepSpeed checkpoint")
        )
    if kind == "ultralytics":
        check = inspect_checkpoint(path, trusted=trusted)
        if check.refused:  # the runner would unpickle it: the gate's own words
            raise UsageError(f"--resume-from {ref}: {check.detail}")
        ok, detail = check.ok, check.detail
    else:
        verdict = verify_path(path)
        ok, detail = verdict.usable, verdict.detail
    if not ok:
        raise UsageError(f"--resume-from {ref}: not a checkpoint that loads: {detail}")
    return str(path) if kind == "ultralytics" else unverified(verdict)


def link_latest(run_dir: Path) -> None:
    from trainctl.store.listing import register_run
    from trainctl.store.paths import latest_link

    register_run(run_dir)  # `trainctl ls` finds it wherever it is
    link = latest_link()
    try:
        link.parent.mkdir(parents=True, exist_ok=True)
        replace_with_symlink(link, run_dir)  # a random temporary name: runs may start at once
    except OSError:
        pass
