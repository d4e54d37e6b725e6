"""The warm spare, inside its own process: the next attempt's interpreter, started ahead of
need.  It imports the heavy modules (torch; ultralytics for the Ultralytics runner), says it is
ready, then blocks on one read of its FIFO (no CPU while parked).  The agent writes one request
there at the restart (:func:`encode_request`: the attempt's argv, a script or ``-m module``,
cwd and environment); the spare takes them and runs the script with :mod:`runpy` as
``__main__``.  EOF on the FIFO (the agent closed it, or died) ends the spare: it never outlives
its agent.

Imports resolve as in a cold start of the same command (``python [flags] train.py``): the
spare is started with the command's own interpreter flags (``-I``, ``-E``, ``-s``, ``-P``,
``-u``), and before its first import it takes off ``sys.path`` the cwd that ``python -c`` put
first and puts there what the cold start would: the script's folder (symlinks resolved), the
cwd for ``-m``, nothing under ``-I``/``-P``/``PYTHONSAFEPATH`` (:func:`cold_path0`).  Its own
code imports only modules built in or frozen into the interpreter (``sys``, ``time``, ``os``;
``runpy`` at the release, after the path is the attempt's), so nothing planted in the cwd or the
script's folder runs in it unless the cold start would run it too.

Run by path, stdlib only (``python -c`` with :data:`LAUNCH`), so that nothing of trainctl is
needed on the trainer's sys.path; the agent side is :mod:`trainctl.agent.spare`.
"""

import os
import sys
import time

MARK = "trainctl-warm-spare"  # in the spare's command line: how the agent's sweep knows one
# compiled and run by path: no import at all, so nothing is looked up on sys.path yet
LAUNCH = (
    "import sys; sys.argv[:] = ['" + MARK + "']; p = {path!r}; "
    "exec(compile(open(p, 'rb').read(), p, 'exec'), {{'__name__': '__spare__', '__file__': p}})"
)
RUN_ENV = "TRAINCTL_SPARE_RUN"  # "path:<script>" or "module:<name>", set by the agent


def cold_path0(kind: str, target: str, cwd: str) -> str:
    """What ``python SCRIPT`` (``kind`` "path") or ``python -m MODULE`` ("module") run in
    ``cwd`` puts first on ``sys.path`` (unless safe-path is on): the script's real folder, or
    the cwd (``os.getcwd()``: symlinks resolved)."""
    if kind == "module":
        return os.path.realpath(cwd)
    return os.path.dirname(os.path.realpath(os.path.join(cwd, target)))


def as_a_cold_start(kind: str, target: str) -> None:
    """``sys.path[0]`` made what a cold start of the attempt would have: ``python -c`` put
    ``''`` (the cwd) there, unless safe-path is on (``-P``, ``-I``, ``PYTHONSAFEPATH``), and
    then the cold start puts nothing there either."""
    if getattr(sys.flags, "safe_path", False) or sys.flags.isolated:
        return
    if sys.path and sys.path[0] == "":
        del sys.path[0]
    sys.path.insert(0, cold_path0(kind, target, os.getcwd()))


# ---------------------------------------------------------------- the release request
# b"<length>\n" then NUL-terminated fields: kind, target, cwd, then four counted lists (args,
# the attempt's whole argv, its env as KEY=VALUE, the spare's launch env).  No NUL can be in argv or the
# environment, and no json module is needed to read it (json could be planted).


def encode_request(
    run: "tuple[str, str, list[str]]",
    argv: "list[str]",
    env: "dict[str, str]",
    launch_env: "dict[str, str]",
    cwd: str,
) -> bytes:
    kind, target, args = run
    fields = [kind, target, cwd, str(len(args)), *args, str(len(argv)), *argv]
    for mapping in (env, launch_env):
        fields += [str(len(mapping)), *(f"{k}={v}" for k, v in mapping.items())]
    payload = b"".join(os.fsencode(f) + b"\0" for f in fields)
    return b"%d\n" % len(payload) + payload


class BadRequest(ValueError):
    """What reached the FIFO is no release request."""


def decode_request(payload: bytes) -> dict:
    """The request :func:`encode_request` made (:class:`BadRequest`: not one)."""
    fields = [os.fsdecode(f) for f in payload.split(b"\0")]
    try:
        if fields[-1:] != [""]:
            raise ValueError("cut short")
        kind, target, cwd, *rest = fields[:-1]
        lists: list[list[str]] = []
        for _ in range(4):
            n = int(rest[0])
            if n < 0 or len(rest) < 1 + n:
                raise ValueError("cut short")
            lists.append(rest[1 : 1 + n])
            rest = rest[1 + n :]
        if rest or kind not in ("path", "module") or not all("=" in kv for kv in lists[2] + lists[3]):
            raise ValueError("not a release request")
    except (ValueError, IndexError) as e:
        raise BadRequest(f"unreadable release request ({e})") from None
    args, argv, env, launch = lists
    return {
        "run": [kind, target, args],
        "argv": argv,
        "env": dict(kv.split("=", 1) for kv in env),
        "launch_env": dict(kv.split("=", 1) for kv in launch),
        "cwd": cwd,
    }


def _read_request(fd: int) -> "dict | None":
    """The request read from the FIFO; None at EOF before its end (the agent is gone, or
    died while writing it: nothing was released)."""
    data = b""
    while True:
        head, sep, rest = data.partition(b"\n")
        if sep:
            if not head.isdigit():
                raise BadRequest("unreadable release request (no length)")
            if len(rest) >= int(head):
                return decode_request(rest[: int(head)])
        elif len(data) > 32:
            raise BadRequest("unreadable release request (no length)")
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:  # no writer had it open yet
            return None
        if not chunk:
            return None
        data += chunk


def _ready_json(ready: dict) -> str:
    """``ready`` as JSON (names of modules, numbers, a bool: nothing to escape)."""
    parts = []
    for key, value in ready.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, list):
            text = "[" + ", ".join('"' + str(v) + '"' for v in value) + "]"
        else:
            text = repr(value)
        parts.append(f'"{key}": {text}')
    return "{" + ", ".join(parts) + "}"


def park(fifo: str, modules: "list[str]") -> "dict | None":
    """Import ``modules``, write ``<fifo>.ready``, wait for the release; the request, or None
    when the FIFO reached EOF (the agent is gone)."""
    # opened first: once it says it is ready, a request written and closed at once stays here
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # never blocks: a writer gone is EOF
    os.set_blocking(fd, True)
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
        f.write(_ready_json(ready))
    os.replace(tmp, f"{fifo}.ready")
    try:
        return _read_request(fd)
    finally:
        os.close(fd)


def _quiet() -> "tuple[int, int]":
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    return saved


def _loud(saved: "tuple[int, int]") -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, old in zip((1, 2), saved):  # two and two (no strict=: Python 3.8 runs this)
        os.dup2(old, fd)
        os.close(old)


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a torch without cuda
        return False


def final_env(
    current: "dict[str, str]", launch: "dict[str, str]", wanted: "dict[str, str]"
) -> "dict[str, str]":
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
    """Become the attempt: its environment, cwd and argv (its sys.path is already the cold
    start's), then its script."""
    env = final_env(dict(os.environ), req["launch_env"], req["env"])
    os.environ.clear()
    os.environ.update(env)
    os.chdir(req["cwd"])
    retitle(req["argv"])
    kind, target, args = req["run"]
    scope = sys.modules["__main__"].__dict__  # what LAUNCH left there goes
    scope.clear()
    scope["__builtins__"] = sys.modules["builtins"]
    if kind == "module":
        import runpy  # frozen in CPython 3.11+; else found where the cold start finds it

        sys.argv = [target, *args]  # runpy puts the module's file there
        runpy._run_module_as_main(target, alter_argv=True)  # type: ignore[attr-defined]  # what python -m calls
    else:
        run_script(target, args)


PR_SET_MM, PR_SET_MM_ARG_END = 35, 9


def retitle(argv: "list[str]") -> None:
    """The process's command line (``/proc/PID/cmdline``: ``ps``, ``pgrep -f``, htop,
    nvidia-smi) made the attempt's ``argv`` in place of the spare's ``python -c ...``: written
    over the argv area the kernel shows (its bounds from /proc/self/stat, written through
    /proc/self/mem: no module needed, none imported), the rest NUL; what does not fit is cut
    (the agent starts the spare with room to spare, :func:`trainctl.agent.spare.launch_argv`).
    With CAP_SYS_RESOURCE and ctypes loaded already (torch loads it) the area is then ended
    at the argv's end, so no empty arguments follow it.  Best effort: a failure leaves the
    spare's own."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2 :].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
        data = b"".join(os.fsencode(a) + b"\0" for a in argv)
        if len(data) > end - start:
            data = data[: end - start - 1] + b"\0"
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(data + b"\0" * (end - start - len(data)))
    except (OSError, ValueError, IndexError):
        return
    ctypes = sys.modules.get("ctypes")
    if ctypes is not None and len(data) < end - start:
        try:
            ctypes.CDLL(None).prctl(PR_SET_MM, PR_SET_MM_ARG_END, ctypes.c_ulong(start + len(data)), 0, 0)
        except (OSError, AttributeError):
            pass


def run_script(target: str, args: "list[str]") -> None:
    """``target`` run as ``python SCRIPT`` runs it: in the ``__main__`` module, with its
    globals, ``__file__`` and loader as CPython gives them; no module imported for it."""
    path = target if os.path.isabs(target) else os.path.join(os.getcwd(), target)
    loader = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", path)
    scope = sys.modules["__main__"].__dict__
    scope.update(
        __name__="__main__",
        __doc__=None,
        __package__=None,
        __spec__=None,
        __loader__=loader,
        __file__=path,
        __cached__=None,
    )
    sys.argv = [target, *args]
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec")
    exec(code, scope)


def main() -> None:
    fifo, modules = os.environ.pop("TRAINCTL_SPARE_FIFO"), os.environ.pop("TRAINCTL_SPARE_IMPORTS")
    kind, _, target = os.environ.pop(RUN_ENV).partition(":")
    as_a_cold_start(kind, target)  # before the first import
    try:
        req = park(fifo, [m for m in modules.split(",") if m])
    except BadRequest as e:  # released, but with nothing it can run: never an exit 0
        print(f"trainctl: the warm spare cannot run the attempt: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    except Exception:  # noqa: BLE001 - its FIFO gone (the run directory deleted...): quietly, no
        req = None  # traceback in the attempt's output; the restart starts cold
    if req is None:
        sys.exit(0)
    release(req)


if __name__ == "__spare__":
    main()
