"""The warm spare, inside its own process: the next attempt's interpreter, started ahead of
need.  It imports the heavy modules (torch; ultralytics for the Ultralytics runner), says it is
ready, then blocks on one read of its FIFO (no CPU while parked).  The agent writes one JSON
line there at the restart: the attempt's argv (a script or ``-m module``), cwd and
environment; the spare takes them and runs the script with :mod:`runpy` as ``__main__``.
EOF on the FIFO (the agent closed it, or died) ends the spare: it never outlives its agent.

Run by path, stdlib only (``python -c`` with :data:`LAUNCH`), so that nothing of trainctl is
needed on the trainer's sys.path; the agent side is :mod:`trainctl.agent.spare`.
"""

from __future__ import annotations

import fcntl
import json
import os
import runpy
import sys
import time

MARK = "trainctl-warm-spare"  # in the spare's command line: how the agent's sweep knows one
LAUNCH = "import runpy, sys; sys.argv[:1] = ['" + MARK + "']; runpy.run_path({path!r}, run_name='__spare__')"


def park(fifo: str, modules: list[str]) -> dict | None:
    """Import ``modules``, write ``<fifo>.ready``, wait for the release; the request, or None
    when the FIFO reached EOF (the agent is gone)."""
    # opened first: once it says it is ready, a request written and closed at once stays here
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # never blocks: a writer gone is EOF
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    t0 = time.monotonic()
    saved = _quiet()  # while parked, nothing reaches the attempt's output (train.log)
    for name in modules:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - not installed here: the script will say so itself
            pass
    _loud(saved)
    ready = {"pid": os.getpid(), "import_s": round(time.monotonic() - t0, 3), "modules": modules}
    ready["cuda_initialized"] = _cuda_initialized()
    # run by path, importing only what it must: trainctl.core.statefile's way by hand, a
    # temporary file of a random name made O_EXCL|O_NOFOLLOW (never a planted link)
    tmp = f"{fifo}.ready.{os.urandom(8).hex()}.tmp"
    tfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(tfd, "w") as f:
        json.dump(ready, f)
    os.replace(tmp, f"{fifo}.ready")
    data = b""
    try:
        while not data.endswith(b"\n"):
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:  # no writer had it open yet
                return None
            if not chunk:
                return None
            data += chunk
    finally:
        os.close(fd)
    return json.loads(data)


def _quiet() -> tuple[int, int]:
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    return saved


def _loud(saved: tuple[int, int]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, old in zip((1, 2), saved, strict=True):
        os.dup2(old, fd)
        os.close(old)


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a torch without cuda
        return False


def final_env(current: dict[str, str], launch: dict[str, str], wanted: dict[str, str]) -> dict[str, str]:
    """The environment the script runs with: ``wanted``, except where it equals what the spare
    was launched with; there the spare's own value stands (the bootstrap took its settings out
    of the environment at start-up, as it does in a cold start)."""
    out = {}
    for key, value in wanted.items():
        if launch.get(key) != value:
            out[key] = value
        elif key in current:
            out[key] = current[key]
    return out


def release(req: dict) -> None:
    """Become the attempt: its environment, cwd, argv and sys.path, then its script."""
    env = final_env(dict(os.environ), req["launch_env"], req["env"])
    os.environ.clear()
    os.environ.update(env)
    os.chdir(req["cwd"])
    kind, target, args = req["run"]
    if kind == "module":
        sys.argv = [target, *args]  # runpy puts the module's file there
        sys.path[0] = os.getcwd()
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.realpath(target))
        runpy.run_path(target, run_name="__main__")


def main() -> None:
    fifo, modules = os.environ.pop("TRAINCTL_SPARE_FIFO"), os.environ.pop("TRAINCTL_SPARE_IMPORTS")
    try:
        req = park(fifo, [m for m in modules.split(",") if m])
    except Exception:  # noqa: BLE001 - its FIFO gone (the run directory deleted...): quietly, no
        req = None  # traceback in the attempt's output; the restart starts cold
    if req is None:
        sys.exit(0)
    release(req)


if __name__ == "__spare__":
    main()
