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
...`` commands (``-u`` allowed) run on a spare.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from trainctl.agent.zero_code import is_python
from trainctl.holder.handle import HeldTrainer, HolderLost, spare_fifo
from trainctl.holder.main import status_path
from trainctl.inside import spare as inside_spare
from trainctl.inside.spare import LAUNCH
from trainctl.store.paths import read_private
from trainctl.system.process import kill_tree

PER_ATTEMPT = "TRAINCTL_"  # trainctl's facts of the attempt (number, preset name, paths): read
#                           after the release, never by ``import torch``
_PYTHON_FLAGS = re.compile(r"-u")


def env_differences(spare: Mapping[str, str], wanted: Mapping[str, str]) -> list[str]:
    """The variables (sorted) whose value differs between the spare's environment and the
    attempt's, trainctl's per-attempt ``TRAINCTL_*`` facts aside; empty: the spare matches.
    Wider than what ``import torch`` reads (threads, ``PYTORCH_*_ALLOC_CONF``, ``CUDA_*``,
    ``HIP_*``, ``MIOPEN_*``, ``PYTHON*``): any other difference can only come from a preset's
    ``[env]``, which counts whole."""
    return sorted(
        k for k in set(spare) | set(wanted) if not k.startswith(PER_ATTEMPT) and spare.get(k) != wanted.get(k)
    )


def script_of(argv: Sequence[str]) -> tuple[str, tuple[str, str, list[str]]] | None:
    """(interpreter, ("path"|"module", target, args)) of a command a spare can run, else None."""
    if len(argv) < 2 or not is_python(argv[0]):
        return None
    rest = list(argv[1:])
    while rest and _PYTHON_FLAGS.fullmatch(rest[0]):
        rest = rest[1:]
    if len(rest) >= 2 and rest[0] == "-m":
        return argv[0], ("module", rest[1], rest[2:])
    if rest and not rest[0].startswith("-"):
        return argv[0], ("path", rest[0], rest[1:])
    return None


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
        self, held: HeldTrainer, attempt: int, fifo: Path, fd: int, launch: dict, command: list
    ) -> None:
        self.held, self.attempt, self.fifo, self._fd = held, attempt, fifo, fd
        self.launch_env = launch
        self.interpreter, self.cwd = command[0], command[1]
        self.started = time.monotonic()

    @classmethod
    async def start(
        cls, run_dir: Path, attempt: int, argv: list[str], env: dict[str, str], cwd: str, log: Path, lock_fd
    ) -> Spare | None:
        """A spare for ``attempt`` warmed with ``env`` (None: the command cannot run on one).
        OSError when it cannot be started."""
        found = script_of(argv)
        if found is None:
            return None
        interpreter, run = found
        fifo = spare_fifo(run_dir, attempt)
        for old in (fifo, _ready_path(fifo)):
            old.unlink(missing_ok=True)
        os.mkfifo(fifo, 0o600)
        fd = os.open(fifo, os.O_RDWR | os.O_CLOEXEC)  # the only writer, held until the release
        launch = dict(env, TRAINCTL_SPARE_FIFO=str(fifo), TRAINCTL_SPARE_IMPORTS=",".join(imports_for(run)))
        try:
            held = await HeldTrainer.start(
                [interpreter, "-c", launch_code()], launch, cwd, run_dir, attempt, lock_fd, log=log
            )
        except (OSError, TimeoutError):
            os.close(fd)
            fifo.unlink(missing_ok=True)
            raise
        return cls(held, attempt, fifo, fd, launch, [interpreter, cwd])

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
        if not same_interpreter(found[0], self.interpreter, env.get("PATH")):
            return [], "the command runs another interpreter"
        if os.path.realpath(cwd) != os.path.realpath(self.cwd):
            return [], "the command runs in another directory"
        return env_differences(self.launch_env, env), None

    def release(self, argv: list[str], env: dict[str, str], cwd: str) -> None:
        """Let the spare run the attempt (OSError: it could not be told)."""
        found = script_of(argv)
        assert found is not None
        request = {"run": found[1], "env": env, "launch_env": self.launch_env, "cwd": cwd}
        data = (json.dumps(request) + "\n").encode()
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
