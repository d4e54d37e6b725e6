"""Inside each torchrun rank (loaded by trainctl's bootstrap): the rank's Flight Recorder on
request, for a rank blocked in a collective.  Standard library only, imported lazily
(the bootstrap imports this module in every trainer).

torch records every collective of a process group in its Flight Recorder (gloo's and
NCCL's), but with no code change only NCCL's watchdog answers a request for it
(``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``, CUDA builds); gloo has no watchdog, no pipe and no
dump on timeout.  So a rank started under trainctl (``TRAINCTL_FLIGHT_DIR`` in its
environment, a ``RANK`` torchrun gave it) runs one daemon thread that waits on its own
FIFO ``<dir>/rank<R>.fifo``; whatever the agent writes there makes the thread write the
rank's records, ``<dir>/rank<R>.json``:
``{"rank": R, "pid": pid, "request": text, "fr": <torch's _dump_fr_trace_json>,
"nccl": <_dump_nccl_trace_json, or null>}`` (written to a temporary name, then renamed).

The thread never imports torch (an import from a second thread could deadlock the main
thread's): a rank that has not imported ``torch.distributed`` answers ``"fr": null``.  Its
main thread blocked in a gloo or NCCL wait has let go of the GIL, so the thread runs then.
"""

import os
import sys

DIR_ENV = "TRAINCTL_FLIGHT_DIR"


def fifo_path(directory, rank):
    return os.path.join(directory, f"rank{rank}.fifo")


def dump_path(directory, rank):
    return os.path.join(directory, f"rank{rank}.json")


def _records(name):
    import json

    c10d = sys.modules.get("torch._C._distributed_c10d")
    dump = getattr(c10d, name, None) if c10d is not None else None
    if dump is None:
        return None
    try:
        return json.loads(dump(True, False))
    except Exception as e:  # noqa: BLE001 - said in the file, the rank goes on
        return {"error": f"{type(e).__name__}: {e}"}


def answer(directory, rank, request):
    """Write this rank's records (see the module doc)."""
    import json

    out = {
        "rank": rank,
        "pid": os.getpid(),
        "request": request,
        "fr": _records("_dump_fr_trace_json"),
        "nccl": _records("_dump_nccl_trace_json"),
    }
    final = dump_path(directory, rank)
    tmp = f"{final}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(out, f)
    os.replace(tmp, final)


def _serve(directory, rank):
    fifo = fifo_path(directory, rank)
    while True:
        try:
            with open(fifo, "rb") as f:  # blocks until the agent opens it to write
                request = f.read(256).decode("ascii", "replace").strip()
            answer(directory, rank, request)
        except Exception:  # noqa: BLE001 - a request lost; the next one is answered
            import time

            time.sleep(1.0)


def start(directory, rank):
    """Make the rank's FIFO (a stale one of an earlier attempt replaced) and serve it."""
    fifo = fifo_path(directory, rank)
    try:
        os.unlink(fifo)
    except FileNotFoundError:
        pass
    os.mkfifo(fifo, 0o600)
    import threading

    threading.Thread(target=_serve, args=(directory, rank), name="trainctl-flight", daemon=True).start()


def is_rank(env):
    """A torchrun worker: torchrun gives each its ``RANK`` and ``LOCAL_RANK``."""
    return env.get("RANK", "").isdigit() and "LOCAL_RANK" in env
