"""The agent's side of the ranks' Flight Recorder (torchrun runs): the launch environment
that turns it on, and the request for each rank's records at a stall.

The launch: ``TRAINCTL_FLIGHT_DIR`` (``<run dir>/flight``), where each rank makes its FIFO
and writes its answer (trainctl.inside.bootstrap.trainctl_flight); torch's own variables,
each only when the user set neither it nor its older name: ``TORCH_FR_BUFFER_SIZE``
(entries kept), ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` (NCCL's watchdog dumps when its pipe
``<prefix><rank>.pipe`` is written; CUDA builds only) and ``TORCH_FR_DUMP_TEMP_FILE``
(where NCCL writes those dumps, and its dump on a timeout: pickles, left for
``torchfrtrace``; trainctl reads the JSON answers only).

At a stall (:func:`ask`): one line to every rank's FIFO and every NCCL pipe there, then the
answers that name the request, a bounded wait.  Never raises for a rank: what a rank did
not give is said per rank."""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainctl.core import flight_record
from trainctl.inside import FLIGHT_DIR_ENV

FLIGHT_DIR = "flight"  # in the run directory
BUFFER_ENTRIES = "2000"  # torch's own default for NCCL's recorder, now for every backend
NCCL_PREFIX = "nccl-rank"  # NCCL's pipe <prefix><rank>.pipe and its dump <prefix><rank>
ANSWER_WAIT_S = 3.0
RELISTEN_S = 0.5  # how long a FIFO with no reader is tried again
MAX_ANSWER_BYTES = 64 << 20

# a variable -> the older names the user may have set instead (torch reads either)
_TORCH_ENV = {
    "TORCH_FR_BUFFER_SIZE": ("TORCH_NCCL_TRACE_BUFFER_SIZE",),
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": (),
    "TORCH_FR_DUMP_TEMP_FILE": ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE",),
}


def launch_env(env: Mapping[str, str], run_dir: Path) -> dict[str, str]:
    """``env`` with the Flight Recorder's variables (the module doc); the user's own values
    stay; ``<run_dir>/flight`` made (private)."""
    directory = Path(run_dir) / FLIGHT_DIR
    directory.mkdir(mode=0o700, exist_ok=True)
    ours = {
        "TORCH_FR_BUFFER_SIZE": BUFFER_ENTRIES,
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(directory / NCCL_PREFIX),
        "TORCH_FR_DUMP_TEMP_FILE": str(directory / NCCL_PREFIX),
    }
    out = dict(env)
    for name, value in ours.items():
        if not any(n in out for n in (name, *_TORCH_ENV[name])):
            out[name] = value
    out[FLIGHT_DIR_ENV] = str(directory)
    return out


def _poke(path: Path, line: bytes) -> str:
    """One line into the FIFO ``path``; "" or why not."""
    try:
        if not stat.S_ISFIFO(os.lstat(path).st_mode):
            return "not a FIFO"
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        return "not listening" if e.errno == errno.ENXIO else (e.strerror or str(e))
    try:
        os.write(fd, line)
    except OSError as e:
        return e.strerror or str(e)
    finally:
        os.close(fd)
    return ""


def _answer(path: Path, request: str) -> dict[str, Any] | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_ANSWER_BYTES + 1)
    if len(data) > MAX_ANSWER_BYTES:
        return None
    try:
        answer = json.loads(data)
    except ValueError:
        return None  # not yet whole (it is renamed in whole) or not ours
    return answer if isinstance(answer, dict) and answer.get("request") == request else None


def ranks_listed(directory: Path) -> list[int]:
    """The ranks that made a FIFO in ``directory`` (this node's)."""
    out = []
    for p in directory.glob("rank*.fifo"):
        digits = p.name[len("rank") : -len(".fifo")]
        if digits.isdigit():
            out.append(int(digits))
    return sorted(out)


def ask(
    directory: Path, wait_s: float = ANSWER_WAIT_S, clock=time.monotonic
) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    """Every rank's records: (rank -> its answer, rank -> why it gave none).  NCCL's pipes
    are written too (its pickles land beside, for torchfrtrace)."""
    request = f"stall-{time.time_ns()}"
    line = f"{request}\n".encode()
    for pipe in sorted(directory.glob(f"{NCCL_PREFIX}*.pipe")):
        _poke(pipe, b"1\n")
    waiting: set[int] = set()
    missed: dict[int, str] = {}
    listed = ranks_listed(directory)
    deadline = clock() + RELISTEN_S  # a rank between two requests reopens its FIFO at once
    while listed:
        for rank in listed:
            why = _poke(directory / f"rank{rank}.fifo", line)
            if why:
                missed[rank] = why
            else:
                waiting.add(rank)
                missed.pop(rank, None)
        listed = [r for r, why in missed.items() if why == "not listening"]
        if not listed or clock() >= deadline:
            break
        time.sleep(0.05)
    answers: dict[int, dict[str, Any]] = {}
    deadline = clock() + wait_s
    while waiting:
        for rank in sorted(waiting):
            answer = _answer(directory / f"rank{rank}.json", request)
            if answer is not None:
                answers[rank] = answer
                waiting.discard(rank)
        if not waiting or clock() >= deadline:
            break
        time.sleep(0.05)
    for rank in waiting:
        missed[rank] = f"no answer within {wait_s:.0f}s"
    return answers, missed


def verdict(run_dir: Path, wait_s: float = ANSWER_WAIT_S) -> tuple[tuple[dict[str, Any], ...], str]:
    """The collectives that did not complete (their fields) and the sentence, from every
    rank's answer; ``((), "")`` where no rank made a FIFO."""
    directory = Path(run_dir) / FLIGHT_DIR
    if not directory.is_dir():
        return (), ""
    answers, missed = ask(directory, wait_s)
    if not answers and not missed:
        return (), ""
    collectives = tuple(c.as_dict() for c in flight_record.unfinished(answers))
    text = flight_record.said(collectives, missed)
    if not text and answers:
        text = "Flight Recorder: every collective the ranks entered completed."
    return collectives, text
