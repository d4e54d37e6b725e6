"""The runner registry: the one place where a runner kind says how its trainer is started
(argv and env) and where a restart resumes from.  The job-file side of a kind (its table)
lives with the job model in engine/config; the code that runs inside the trainer lives in
engine/runners/.  A new kind is one more entry here."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from ..paths import RunFiles
from ..spec import RunSpec


class RunnerKind:
    name = ""

    @property
    def table(self):
        """The job file's table for this kind (engine/config's JOB_TABLES)."""
        from ..config.kinds import JOB_TABLES
        return JOB_TABLES[self.name]

    def argv(self, spec: RunSpec, files: RunFiles, preset_name: str | None, preset,
             resume_from: str | None, attempt: int) -> list[str]:
        raise NotImplementedError

    def resume_checkpoint(self, spec: RunSpec, files: RunFiles, last_checkpoint: str | None,
                          on_skip: Callable[[Path, str], None],
                          on_unverified: Callable[[Path, str], None] | None = None) -> str | None:
        """The checkpoint a restart goes on from, or None (start over).  A candidate that
        does not load goes to ``on_skip(path, why)``; one chosen although its format cannot
        be checked, to ``on_unverified(path, why)``."""
        raise NotImplementedError


class CommandRunner(RunnerKind):
    """Any command (generic mode): the preset reaches it through env and ``args``; a restart
    appends ``--resume-arg`` values ({checkpoint} replaced by the last good checkpoint)."""

    name = "command"

    def argv(self, spec, files, preset_name, preset, resume_from, attempt):
        argv = list(spec.command) + list(preset.args if preset else ())
        needs = any("{checkpoint}" in a for a in spec.resume_args)
        resuming = attempt > 1 or resume_from is not None
        # A fixed resume file that resume_checkpoint refused: start over, without it.
        refused = not needs and resume_from is None and self._fixed_file(spec) is not None
        if resuming and spec.resume_args and (resume_from or not needs) and not refused:
            argv += [a.replace("{checkpoint}", resume_from or "") for a in spec.resume_args]
        return argv

    def resume_checkpoint(self, spec, files, last_checkpoint, on_skip, on_unverified=None):
        """Without a {checkpoint} placeholder, a resume argument that names a file is what
        the command resumes from; else the checkpoints it reported (newest first, then the
        --resume-from one).  The first that loads, or one that cannot be checked (said
        through ``on_unverified``); each refused one goes to ``on_skip``."""
        from ..runners.verify import first_loadable
        fixed = None if any("{checkpoint}" in a for a in spec.resume_args) else self._fixed_file(spec)
        candidates = [fixed] if fixed else reported_checkpoints(files, last_checkpoint, spec.resume_from)
        verdict = first_loadable(candidates, on_skip=on_skip, base=spec.cwd)
        if verdict is None:
            return None
        if not verdict.ok and on_unverified is not None:
            on_unverified(verdict.path, verdict.detail)
        return str(verdict.path) if fixed is None else fixed

    @staticmethod
    def _fixed_file(spec: RunSpec) -> str | None:
        return next((a for a in spec.resume_args if os.path.isfile(os.path.join(spec.cwd, a))), None)

class UltralyticsRunner(RunnerKind):
    """The built-in Ultralytics runner (engine/runners/ultralytics.py runs in the trainer)."""

    name = "ultralytics"

    def argv(self, spec, files, preset_name, preset, resume_from, attempt):
        argv = [sys.executable, "-m", "trainctl.engine.runners.ultralytics",
                "--job", str(spec.job_file), "--run-dir", str(files.dir)]
        if preset_name is not None:
            argv += ["--preset", str(files.presets / f"{preset_name}.toml")]
        if resume_from:
            argv += ["--resume", resume_from]
        return argv

    def resume_checkpoint(self, spec, files, last_checkpoint, on_skip, on_unverified=None):
        """The furthest that verifies (pick_resume_checkpoint ranks by position) of: the
        mid-epoch saves kept in checkpoints/, the checkpoints reported on the side channel
        (rescue, periodic, planned, epoch), and last_good.pt."""
        from ..runners.checkpoint import mid_epoch_checkpoints, pick_resume_checkpoint
        candidates = [*mid_epoch_checkpoints(files.checkpoints),
                      *reported_checkpoints(files, last_checkpoint, None),
                      files.checkpoints / "last_good.pt"]
        chosen = pick_resume_checkpoint(candidates, on_skip=on_skip)
        return str(chosen) if chosen else None


class TorchrunRunner(CommandRunner):
    """A torchrun job (a ``kind = "torchrun"`` job, or ``trainctl run -- torchrun ...``):
    its command, run the way trainctl supervises torchrun (engine/torchrun.py:
    ``--max-restarts 0``, each rank's output in ``ranks-<attempt>/``); the preset's ``args``
    go to the script, its env to every rank (torchrun passes its environment on); resumed
    like a command."""

    name = "torchrun"

    def argv(self, spec, files, preset_name, preset, resume_from, attempt):
        from ..torchrun import supervised
        return supervised(super().argv(spec, files, preset_name, preset, resume_from, attempt),
                          rank_log_dir(files, attempt))


def rank_log_dir(files: RunFiles, attempt: int) -> Path:
    """Where attempt ``attempt``'s ranks write their output (torchrun's --log-dir)."""
    return files.dir / f"ranks-{attempt}"


def reported_checkpoints(files: RunFiles, last_checkpoint: str | None,
                         resume_from: str | None) -> list[str | None]:
    """The checkpoints the trainer reported as written (the journal's, which an adopting
    agent has too), newest first; then the one the run started from."""
    from ..journal import read_events
    try:
        journaled = [ev.path for ev in read_events(files.events)
                     if ev.type == "checkpoint" and ev.ok and ev.path]
    except OSError:
        journaled = []
    return [last_checkpoint, *reversed(journaled), resume_from]


RUNNERS: dict[str, RunnerKind] = {r.name: r for r in (CommandRunner(), UltralyticsRunner(),
                                                       TorchrunRunner())}


def runner_for(kind: str) -> RunnerKind:
    try:
        return RUNNERS[kind]
    except KeyError:
        raise ValueError(f"unknown runner kind {kind!r}; known: {', '.join(RUNNERS)}") from None


def trainer_env(files: RunFiles, preset_name: str | None, preset, attempt: int,
                base: dict[str, str] | None = None) -> dict[str, str]:
    """The trainer's environment: ours, the preset's [env]/threads, and TRAINCTL_* facts."""
    env = dict(os.environ if base is None else base)
    env.pop("GITHUB_ACTIONS", None)   # Ultralytics prints no progress frames under it
    if preset is not None:
        env.update(preset.child_env())
    env.update(TRAINCTL_RUN_DIR=str(files.dir), TRAINCTL_ATTEMPT=str(attempt),
               TRAINCTL_PRESET=preset_name or "", PYTHONUNBUFFERED="1")
    return env
