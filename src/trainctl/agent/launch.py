"""How each job kind starts its trainer: the one place where a kind says how its trainer is started
(argv and env) and where a restart resumes from.  The job-file side of a kind (its table)
lives with the job model in config/; the code that runs inside the trainer lives in
src/trainctl/inside/.  A new kind is one more entry here."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from trainctl.core import events as E
from trainctl.store.paths import RunFiles
from trainctl.store.spec import RunSpec


class RunnerKind:
    name = ""

    @property
    def table(self):
        """The job file's table for this kind (config/kinds.py's JOB_TABLES)."""
        from trainctl.config.kinds import JOB_TABLES

        return JOB_TABLES[self.name]

    def argv(
        self,
        spec: RunSpec,
        files: RunFiles,
        preset_name: str | None,
        preset,
        resume_from: str | None,
        attempt: int,
    ) -> list[str]:
        raise NotImplementedError

    def env(
        self, spec: RunSpec, files: RunFiles, env: dict[str, str], argv: list[str], resume_from: str | None
    ) -> dict[str, str]:
        """The trainer's environment for ``argv`` (``env``: :func:`trainer_env`'s)."""
        return env

    def resume_checkpoint(
        self,
        spec: RunSpec,
        files: RunFiles,
        last_checkpoint: str | None,
        on_skip: Callable[[Path, str], None],
        on_unverified: Callable[[Path, str], None] | None = None,
    ) -> str | None:
        """The checkpoint a restart goes on from, or None (start over).  A candidate that
        does not load goes to ``on_skip(path, why)``; one chosen although its format cannot
        be checked, to ``on_unverified(path, why)``."""
        raise NotImplementedError


class CommandRunner(RunnerKind):
    """Any command (generic mode): the preset reaches it through env and ``args``; a restart
    from a good checkpoint (reported, or written by the script and found on disk:
    agent/checkpoint_watch.py) appends ``--resume-arg`` values ({checkpoint} replaced by
    it); with none, the restart starts over without them.

    A Python command gets the zero-code integrations (src/trainctl/inside/): the bootstrap on
    its PYTHONPATH.  Once an integration said it attached (journaled info
    ``instrument.attached.<name>``), a restart resumes by that integration's rule
    (:data:`INTEGRATION_RESUME`) and the checkpoint reaches the script in
    ``TRAINCTL_RESUME_FROM`` (the integration rewrites the library's own resume), not
    through ``--resume-arg``."""

    name = "command"

    def env(self, spec, files, env, argv, resume_from):
        from trainctl.agent.zero_code import instrument_env, python_command
        from trainctl.inside import CHECKPOINT_EVERY_ENV, RESUME_ENV

        if not spec.instrument or not python_command(argv, spec.cwd, env.get("PATH")):
            return env
        env = instrument_env(env, files.dir)
        if spec.checkpoint_every is not None:
            env[CHECKPOINT_EVERY_ENV] = repr(float(spec.checkpoint_every))
        if resume_from and integration_of(files) in INTEGRATION_RESUME:
            env[RESUME_ENV] = resume_from
        return env

    def argv(self, spec, files, preset_name, preset, resume_from, attempt):
        argv = list(spec.command) + list(preset.args if preset else ())
        if spec.instrument and integration_of(files) in INTEGRATION_RESUME:
            return argv  # the integration resumes (TRAINCTL_RESUME_FROM), not resume_args
        # Only with a good checkpoint (resume_checkpoint's): a resume flag before the first
        # save, or naming a file that does not load, would make the restart crash.
        if spec.resume_args and resume_from is not None:
            argv += [a.replace("{checkpoint}", resume_from) for a in spec.resume_args]
        return argv

    def resume_checkpoint(self, spec, files, last_checkpoint, on_skip, on_unverified=None):
        """Without a {checkpoint} placeholder, a resume argument that names a file is what
        the command resumes from; else the checkpoints it reported or wrote (the journal's,
        newest first, then the --resume-from one, then the copies earlier restarts kept).  The first that loads, or one that cannot be checked (said
        through ``on_unverified``); each refused one goes to ``on_skip``."""
        rule = INTEGRATION_RESUME.get(integration_of(files) or "") if spec.instrument else None
        if rule is not None:
            return rule(spec, files, last_checkpoint, on_skip, on_unverified)
        from trainctl.agent.checkpoint_keep import kept_copies
        from trainctl.store.checkpoint_accept import accept_script_checkpoint
        from trainctl.store.checkpoint_verify import first_loadable

        fixed = None if any("{checkpoint}" in a for a in spec.resume_args) else self._fixed_file(spec)
        candidates = (
            [fixed]
            if fixed
            else [*reported_checkpoints(files, last_checkpoint, spec.resume_from), *kept_copies(files)]
        )
        verdict = first_loadable(
            candidates,
            on_skip=on_skip,
            base=spec.cwd,
            verify=lambda p: accept_script_checkpoint(p, spec.trusted_checkpoints),
        )
        if verdict is None:
            return None
        if not verdict.ok and on_unverified is not None:
            on_unverified(verdict.path, verdict.detail)
        return str(verdict.path) if fixed is None else fixed

    @staticmethod
    def _fixed_file(spec: RunSpec) -> str | None:
        return next((a for a in spec.resume_args if os.path.isfile(os.path.join(spec.cwd, a))), None)


class UltralyticsRunner(RunnerKind):
    """The built-in Ultralytics runner (src/trainctl/inside/ultralytics_runner.py runs in the trainer)."""

    name = "ultralytics"

    def argv(self, spec, files, preset_name, preset, resume_from, attempt):
        argv = [
            sys.executable,
            "-m",
            "trainctl.inside.ultralytics_runner",
            "--job",
            str(spec.job_file),
            "--run-dir",
            str(files.dir),
        ]
        if preset_name is not None:
            argv += ["--preset", str(files.presets / f"{preset_name}.toml")]
        if resume_from:
            argv += ["--resume", resume_from]
        for path in spec.trusted_checkpoints:
            argv += ["--trust-checkpoint", path]
        return argv

    def resume_checkpoint(self, spec, files, last_checkpoint, on_skip, on_unverified=None):
        """The furthest that verifies (pick_resume_checkpoint ranks by position) of: the
        mid-epoch saves kept in checkpoints/, the checkpoints reported on the side channel
        (rescue, periodic, planned, epoch), and last_good.pt."""
        from trainctl.store.checkpoint import mid_epoch_checkpoints, pick_resume_checkpoint

        candidates = [
            *mid_epoch_checkpoints(files.checkpoints),
            *reported_checkpoints(files, last_checkpoint, None),
            files.checkpoints / "last_good.pt",
        ]
        chosen = pick_resume_checkpoint(candidates, on_skip=on_skip, trusted=spec.trusted_checkpoints)
        return str(chosen) if chosen else None


class TorchrunRunner(CommandRunner):
    """A torchrun job (a ``kind = "torchrun"`` job, or ``trainctl run -- torchrun ...``):
    its command, run the way trainctl supervises torchrun (src/trainctl/core/torchrun.py:
    ``--max-restarts 0``, each rank's output in ``ranks-<attempt>/``); the preset's ``args``
    go to the script, its env to every rank (torchrun passes its environment on); resumed
    like a command."""

    name = "torchrun"

    def env(self, spec, files, env, argv, resume_from):
        """A command's, and where the bootstrap rides along (a Python launcher), the ranks'
        Flight Recorder turned on (agent/flight.py)."""
        from trainctl.agent.flight import launch_env
        from trainctl.inside import INSTRUMENT_ENV

        env = super().env(spec, files, env, argv, resume_from)
        return launch_env(env, files.dir) if INSTRUMENT_ENV in env else env

    def argv(self, spec, files, preset_name, preset, resume_from, attempt):
        from trainctl.core.torchrun import supervised

        return supervised(
            super().argv(spec, files, preset_name, preset, resume_from, attempt), rank_log_dir(files, attempt)
        )


def rank_log_dir(files: RunFiles, attempt: int) -> Path:
    """Where attempt ``attempt``'s ranks write their output (torchrun's --log-dir)."""
    return files.dir / f"ranks-{attempt}"


def reported_checkpoints(
    files: RunFiles, last_checkpoint: str | None, resume_from: str | None
) -> list[str | None]:
    """The checkpoints the trainer reported as written (the journal's, which an adopting
    agent has too), newest first; then the one the run started from."""
    from trainctl.store.journal import read_events

    try:
        journaled = [
            ev.path for ev in read_events(files.events) if isinstance(ev, E.Checkpoint) and ev.ok and ev.path
        ]
    except OSError:
        journaled = []
    return [last_checkpoint, *reversed(journaled), resume_from]


_ATTACHED_SEEN: dict[str, tuple[int, str | None]] = {}  # journal -> (bytes read, last found)


def integration_of(files: RunFiles) -> str | None:
    """The zero-code integration that last said it attached in this run (the journal's
    ``instrument.attached.<name>`` info, which an adopting agent reads too), or None.  The
    journal only grows: each call reads what was appended since the last one."""
    from trainctl.inside import ATTACHED_KEY, attached_integration

    path = str(files.events)
    offset, found = _ATTACHED_SEEN.get(path, (0, None))
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size < offset:  # another journal there: from the start
                offset, found = 0, None
            f.seek(offset)
            data = f.read()
    except OSError:
        return found
    end = data.rfind(b"\n") + 1  # whole lines only
    needle = f'"{ATTACHED_KEY}.'.encode()
    for line in data[:end].splitlines():
        if needle in line:
            try:
                ev = E.decode(line)
            except (ValueError, TypeError, KeyError):
                continue
            if isinstance(ev, E.Info) and (name := attached_integration(ev.key)):
                found = name
    _ATTACHED_SEEN[path] = (offset + end, found)
    return found


RUNNERS: dict[str, RunnerKind] = {r.name: r for r in (CommandRunner(), UltralyticsRunner(), TorchrunRunner())}

ResumeRule = Callable[..., "str | None"]


def library_checkpoints(what: str, refuse: Callable[[Path], str | None]) -> ResumeRule:
    """The rule of an integration that resumes from the library's own checkpoints: the ones
    the trainer reported (newest first, then ``--resume-from``), the first that is of the
    library's shape (``refuse(path)`` says why not, else None) and verifies."""

    def rule(spec, files, last_checkpoint, on_skip, on_unverified=None):
        from trainctl.store.checkpoint_verify import first_loadable

        candidates = []
        for cand in reported_checkpoints(files, last_checkpoint, spec.resume_from):
            if not cand:
                continue
            path = Path(cand) if Path(cand).is_absolute() else Path(spec.cwd) / cand
            why = refuse(path) if path.exists() else None
            if why is None:
                candidates.append(str(path))
            else:
                on_skip(path, f"not {what}: {why}")
        verdict = first_loadable(candidates, on_skip=on_skip, base=spec.cwd)
        if verdict is None:
            return None
        if not verdict.ok and on_unverified is not None:
            on_unverified(verdict.path, verdict.detail)
        return str(verdict.path)

    return rule


def _trainer_dir(path: Path) -> str | None:
    if not path.is_dir():
        return "a file, not a checkpoint-<step> directory"
    if not (path / "trainer_state.json").is_file():
        return "no trainer_state.json (the Trainer writes it last: the save was cut short)"
    return None


def _lightning_file(path: Path) -> str | None:
    """A .ckpt file or a sharded strategy's directory; not a Transformers Trainer's."""
    return "a Transformers Trainer directory" if (path / "trainer_state.json").is_file() else None


INTEGRATION_RESUME: dict[str, ResumeRule] = {
    "ultralytics": RUNNERS["ultralytics"].resume_checkpoint,
    "transformers": library_checkpoints("a Transformers Trainer checkpoint", _trainer_dir),
    "lightning": library_checkpoints("a Lightning checkpoint", _lightning_file),
}
"""An attached integration -> where a restart of its command resumes from (the signature of
:meth:`RunnerKind.resume_checkpoint`).  An integration without an entry resumes as a
generic command (its reported checkpoints, ``--resume-arg``)."""


def runner_for(kind: str) -> RunnerKind:
    try:
        return RUNNERS[kind]
    except KeyError:
        raise ValueError(f"unknown runner kind {kind!r}; known: {', '.join(RUNNERS)}") from None


def trainer_env(
    files: RunFiles, preset_name: str | None, preset, attempt: int, base: dict[str, str] | None = None
) -> dict[str, str]:
    """The trainer's environment: ours, the preset's [env]/threads, and TRAINCTL_* facts."""
    env = dict(os.environ if base is None else base)
    env.pop("GITHUB_ACTIONS", None)  # Ultralytics prints no progress frames under it
    if preset is not None:
        env.update(preset.child_env())
    env.update(
        TRAINCTL_RUN_DIR=str(files.dir),
        TRAINCTL_ATTEMPT=str(attempt),
        TRAINCTL_PRESET=preset_name or "",
        PYTHONUNBUFFERED="1",
    )
    if preset_name is not None:  # the preset itself, for an integration to apply natively
        env["TRAINCTL_PRESET_FILE"] = str(files.presets / f"{preset_name}.toml")
    else:
        env.pop("TRAINCTL_PRESET_FILE", None)
    for key in ("TRAINCTL_RESUME_FROM", "TRAINCTL_INSTRUMENT"):  # never inherited from ours
        env.pop(key, None)
    return env
