"""The warm spare, the agent's side: the next attempt's Python interpreter started ahead of
need under its own holder, with torch (and ultralytics for the Ultralytics runner) imported,
parked on a read of its FIFO (:mod:`trainctl.inside.spare` runs in it), and released at the
restart to run the attempt's script.

What decides whether a parked spare may run an attempt is its environment
(:func:`env_differences`): threads, allocator settings, ``CUDA_*``/``HIP_*``/``MIOPEN_*``, the
Python start-up variables, a preset's ``[env]`` are read before or by ``import torch``.  The
spare is warmed with the environment of the attempt that just started (so for the same preset);
the check is made at the release, so a fallback preset with another ``[env]`` starts cold and
the journal says which variable differed.  Only ``python SCRIPT ...`` and ``python -m MODULE
...`` commands run on a spare, with the interpreter flags that change no more than where
imports come from and how output is buffered (``-u``, ``-I``, ``-E``, ``-s``, ``-P``): the spare
is started with the same flags, and resolves every import from where a cold start of the same
command would (:mod:`trainctl.inside.spare`); a command whose flags or script folder differ
from the spare's starts cold.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from trainctl.agent.zero_code import is_python
from trainctl.holder.handle import HeldTrainer, HolderLost, spare_fifo
from trainctl.holder.main import status_path
from trainctl.inside import spare as inside_spare
from trainctl.inside.spare import LAUNCH, RUN_ENV, cold_path0, encode_request
from trainctl.store.paths import read_private
from trainctl.system.process import kill_tree

PER_ATTEMPT = "TRAINCTL_"  # trainctl's facts of the attempt (number, preset name, paths): read
#                           after the release, never by ``import torch``
_PYTHON_FLAGS = re.compile(r"-[uIEsP]+")  # the flags a spare takes: carried to it as they are


def env_differences(spare: Mapping[str, str], wanted: Mapping[str, str]) -> list[str]:
    """The variables (sorted) whose value differs between the spare's environment and the
    attempt's, trainctl's per-attempt ``TRAINCTL_*`` facts aside; empty: the spare matches.
    Wider than what ``import torch`` reads (threads, ``PYTORCH_*_ALLOC_CONF``, ``CUDA_*``,
    ``HIP_*``, ``MIOPEN_*``, ``PYTHON*``): any other difference can only come from a preset's
    ``[env]``, which counts whole."""
    return sorted(
        k for k in set(spare) | set(wanted) if not k.startswith(PER_ATTEMPT) and spare.get(k) != wanted.get(k)
    )


@dataclass(frozen=True)
class SpareCommand:
    """A command a spare can run: its interpreter, the interpreter's flags, and what it runs:
    ("path", script, args) or ("module", name, args)."""

    interpreter: str
    flags: tuple[str, ...]
    run: tuple[str, str, list[str]]

    def path0(self, cwd: str) -> str:
        """What a cold start of it in ``cwd`` puts first on sys.path (without safe-path)."""
        return cold_path0(self.run[0], self.run[1], cwd)


def script_of(argv: Sequence[str]) -> SpareCommand | None:
    """The command as a spare would run it, or None: not a Python script or module, or an
    interpreter option a spare cannot take (``-X``, ``-W``, ``-O``, ``-c`` ...)."""
    if len(argv) < 2 or not is_python(argv[0]):
        return None
    rest = list(argv[1:])
    flags: list[str] = []
    while rest and _PYTHON_FLAGS.fullmatch(rest[0]):
        flags.append(rest.pop(0))
    if len(rest) >= 2 and rest[0] == "-m":
        return SpareCommand(argv[0], tuple(flags), ("module", rest[1], rest[2:]))
    if rest and not rest[0].startswith("-"):
        return SpareCommand(argv[0], tuple(flags), ("path", rest[0], rest[1:]))
    return None


def _plain_script(command: SpareCommand, cwd: str) -> bool:
    """A module, or a script that is a plain file (a folder or zip archive with a
    ``__main__.py`` is put on sys.path itself: never run on a spare)."""
    if command.run[0] == "module":
        return True
    path = os.path.join(cwd, command.run[1])
    try:
        return os.path.isfile(path) and not zipfile.is_zipfile(path)
    except OSError:
        return False


# What every PyTorch trainer imports before its first batch, torch aside: the first optimizer
# made imports torch._dynamo (1.8 s of the loop's 2.5 s warm start-up here, measured with
# `python -X importtime`), and the DataLoader its module.
_TORCH = ["torch", "torch._dynamo", "torch.utils.data"]


def imports_for(run: tuple[str, str, list[str]]) -> list[str]:
    """What the spare imports while parked: torch and what any trainer's first steps import,
    and the runner's framework."""
    if run[0] == "module" and run[1] == "trainctl.inside.ultralytics_runner":
        return [*_TORCH, "ultralytics"]
    return list(_TORCH)


def describe_start(attempt: int, differences: Sequence[str], why_cold: str | None, parked_s: float) -> str:
    """The journal's line for how an attempt started."""
    if why_cold is None and not differences:
        return f"attempt {attempt} started on the warm spare (parked {parked_s:.1f} s)"
    if differences:
        return f"attempt {attempt} started cold: the spare's environment differs in {', '.join(differences)}"
    return f"attempt {attempt} started cold: {why_cold}"


def same_interpreter(a: str, b: str, path: str | None) -> bool:
    import shutil

    def where(x: str) -> str:
        return os.path.realpath(x if os.sep in x else (shutil.which(x, path=path) or x))

    return where(a) == where(b)


class Spare:
    """One parked interpreter, for ``attempt``, under its own holder (its trainer as far as the
    holder knows: same output arrangement, session and pid bookkeeping as a cold start).  The
    agent holds the FIFO's only writer: closing it, or dying, ends the spare."""

    def __init__(
        self,
        held: HeldTrainer,
        attempt: int,
        fifo: Path,
        fd: int,
        launch: dict,
        command: SpareCommand,
        cwd: str,
    ) -> None:
        self.held, self.attempt, self.fifo, self._fd = held, attempt, fifo, fd
        self.launch_env = launch
        self.command, self.cwd = command, cwd
        self.started = time.monotonic()

    @classmethod
    async def start(
        cls, run_dir: Path, attempt: int, argv: list[str], env: dict[str, str], cwd: str, log: Path, lock_fd
    ) -> Spare | None:
        """A spare for ``attempt`` warmed with ``env`` (None: the command cannot run on one).
        OSError when it cannot be started."""
        found = script_of(argv)
        if found is None or not _plain_script(found, cwd):
            return None
        fifo = spare_fifo(run_dir, attempt)
        for old in (fifo, _ready_path(fifo)):
            old.unlink(missing_ok=True)
        os.mkfifo(fifo, 0o600)
        fd = os.open(fifo, os.O_RDWR | os.O_CLOEXEC)  # the only writer, held until the release
        launch = launch_env(found, env, fifo)
        try:
            held = await HeldTrainer.start(
                launch_argv(found, argv),
                launch,
                cwd,
                run_dir,
                attempt,
                lock_fd,
                log=log,
            )
        except (OSError, TimeoutError):
            os.close(fd)
            fifo.unlink(missing_ok=True)
            raise
        return cls(held, attempt, fifo, fd, launch, found, cwd)

    def ready(self) -> dict | None:
        """What the spare said once its imports were done (pid, import_s, cuda_initialized)."""
        try:
            data = json.loads(read_private(_ready_path(self.fifo), 1 << 16))
            return data if isinstance(data, dict) else None
        except (OSError, ValueError):
            return None

    async def wait_ready(self, limit_s: float = 300.0) -> bool:
        """Whether the spare got ready (its FIFO open, its imports done) within ``limit_s``:
        only then may it be released (a request written before would be lost)."""
        deadline = time.monotonic() + limit_s
        while self.ready() is None:
            if not self.held.alive() or time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    def memory(self) -> tuple[int, int] | None:
        """(RSS, PSS) of the parked spare in bytes; None once it is gone."""
        try:
            info = psutil.Process(self.held.pid).memory_full_info()
        except (psutil.Error, OSError):
            return None
        return info.rss, getattr(info, "pss", info.rss)

    def fit(self, argv: list[str], env: dict[str, str], cwd: str) -> tuple[list[str], str | None]:
        """(env differences, another reason) why the spare cannot run this attempt; both
        empty: it can."""
        found = script_of(argv)
        if found is None:
            return [], "the command does not run a Python script"
        if not self.held.alive():
            return [], "the spare had ended"
        if not self.held.holder_alive():  # nobody would keep its output and its exit
            return [], "the spare's holder had ended"
        if not same_interpreter(found.interpreter, self.command.interpreter, env.get("PATH")):
            return [], "the command runs another interpreter"
        if os.path.realpath(cwd) != os.path.realpath(self.cwd):
            return [], "the command runs in another directory"
        if found.flags != self.command.flags:
            return [], "the command gives the interpreter other flags"
        if found.run[0] != self.command.run[0] or found.path0(cwd) != self.command.path0(self.cwd):
            return [], "the command runs a script from another folder"
        if not _plain_script(found, cwd):
            return [], "the command runs a folder or an archive"
        return env_differences(self.launch_env, env), None

    def release(self, argv: list[str], env: dict[str, str], cwd: str) -> None:
        """Let the spare run the attempt (OSError: it could not be told)."""
        found = script_of(argv)
        assert found is not None
        data = encode_request(found.run, list(argv), env, self.launch_env, cwd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
        finally:
            self.close()
            self.fifo.unlink(missing_ok=True)  # its status file is the attempt's from now

    def close(self) -> None:
        """The FIFO's writer closed: a parked spare reads EOF and exits.  The FIFO itself stays
        until the spare is released or discarded: its status file is no attempt's meanwhile."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        _ready_path(self.fifo).unlink(missing_ok=True)

    def end(self) -> None:
        """Closed and killed at once, importing or parked: never released, it holds nothing of
        the user's (its process group: the holder started it in a session of its own)."""
        self.close()
        if self.held.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.held.pid, signal.SIGKILL)

    async def discard(self, wait_s: float = 5.0) -> None:
        """Ended (:meth:`end`), its holder gone within ``wait_s`` (else its tree killed), its
        files removed."""
        self.end()
        try:
            await asyncio.wait_for(self.held.wait(), wait_s)
        except (TimeoutError, HolderLost, OSError):
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, lambda: kill_tree(self.held.pid, self.held.pid, grace=1.0))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(status_path(str(self.held.run_dir), self.attempt))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.fifo)


def launch_code() -> str:
    """The ``python -c`` program that runs :mod:`trainctl.inside.spare` by its path."""
    return LAUNCH.format(path=os.path.realpath(inside_spare.__file__))


ROOM_BYTES = 512  # bytes of command line beyond this attempt's, for the next one's resume arguments


def launch_argv(command: SpareCommand, argv: Sequence[str]) -> list[str]:
    """The spare's own command: the attempt's interpreter with the attempt's flags, then
    blanks, so that its command line has room for the attempt's ``argv`` and
    :data:`ROOM_BYTES` bytes more (once released, the spare shows the argv it runs there)."""
    own = [command.interpreter, *command.flags, "-c", launch_code()]
    need = sum(len(os.fsencode(a)) + 1 for a in argv) + ROOM_BYTES
    have = sum(len(os.fsencode(a)) + 1 for a in own) + 1
    return [*own, " " * max(0, need - have)]


def launch_env(command: SpareCommand, env: Mapping[str, str], fifo: Path) -> dict[str, str]:
    """The attempt's environment and what the spare reads at its start: its FIFO, what it
    imports, and what it will run (where its imports come from)."""
    kind, target, _ = command.run
    return dict(
        env,
        TRAINCTL_SPARE_FIFO=str(fifo),
        TRAINCTL_SPARE_IMPORTS=",".join(imports_for(command.run)),
        **{RUN_ENV: f"{kind}:{target}"},
    )


def _ready_path(fifo: Path) -> Path:
    return fifo.with_name(fifo.name + ".ready")


def parked_line(spare: Spare) -> str | None:
    """The journal's line for a spare that is ready: imports, memory, no GPU context."""
    ready, mem = spare.ready(), spare.memory()
    if ready is None or mem is None:
        return None
    gpu = "a GPU context (unexpected)" if ready.get("cuda_initialized") else "no GPU context"
    return (
        f"warm spare parked for attempt {spare.attempt} (pid {spare.held.pid}): "
        f"{', '.join(ready.get('modules') or [])} imported in {float(ready.get('import_s') or 0):.1f} s; "
        f"RSS {mem[0] / 2**20:.0f} MiB, PSS {mem[1] / 2**20:.0f} MiB; {gpu}"
    )
