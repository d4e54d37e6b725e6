"""The events every part of trainctl speaks: frozen dataclasses and one JSON codec.

One JSON object per line: ``{"ts": <unix seconds>, "type": "<type>", ...}``.  The
journal (``events.jsonl``), ``--json`` stdout, the runner's side channel and the agent
socket all use :func:`encode` / :func:`decode`.  A missing metric is ``None``.

Journal events carry ``seq`` (their 0-based line number in the journal) once the
journal has written them; ephemeral events (``tick``, ``log``) are never journaled.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

from trainctl.core.recovery import RunState

PHASES = ("startup", "train", "val", "save", "finished")
SEVERITIES = ("info", "warning", "error", "fatal")
DIAGNOSES = ("deadlock", "spin", "stopped", "dead_worker", "io_wait", "unknown")
#: A Stall's diagnosis while the stacks are still being read: its StallDiagnosis follows.
DIAGNOSING = "diagnosing"
STATES = tuple(s.value for s in RunState)


@dataclass(frozen=True)
class Event:
    type: ClassVar[str] = ""
    ts: float
    if sys.version_info >= (3, 10):
        seq: int | None = field(default=None, kw_only=True, compare=False)
    else:
        # Python 3.8/3.9 (the trainer's interpreter, where trainctl.inside runs) have no
        # kw_only: there seq is no argument at all.  Nothing sets it there: the side channel's
        # events carry none; the agent (3.11) numbers the journal.
        seq: int | None = field(default=None, init=False, compare=False)


@dataclass(frozen=True)
class Start(Event):
    type: ClassVar[str] = "start"
    attempt: int
    pid: int
    preset: str | None
    command: tuple[str, ...] = ()
    slurm_job: str | None = None  # the Slurm job this attempt runs in
    env: tuple[str, ...] = ()  # the names (never the values) of the trainer's environment


@dataclass(frozen=True)
class Phase(Event):
    type: ClassVar[str] = "phase"
    phase: str


@dataclass(frozen=True)
class Progress(Event):
    type: ClassVar[str] = "progress"
    epoch: int | None
    epochs: int | None
    batch: int | None
    batches: int | None
    losses: dict[str, float] = field(default_factory=dict)
    rate: float | None = None
    rank: int | None = None


def merged_progress(prev: Progress | None, new: Progress) -> Progress:
    """``new`` with what it does not say taken from ``prev`` (the same rank's last one): a
    line that carries only a loss (HF Trainer's ``{'loss': ...}`` after its tqdm bar) keeps
    the batch counter read before it in the same epoch, a counter with no epoch keeps the
    last epoch, and a counter with no loss keeps the last losses.  Pure."""
    if prev is None or prev.rank != new.rank:
        return new
    same_epoch = new.epoch is None or prev.epoch is None or new.epoch == prev.epoch
    changes: dict[str, Any] = {}
    if new.batch is None and prev.batch is not None and same_epoch:
        changes.update(batch=prev.batch, batches=prev.batches)
    if new.epoch is None and prev.epoch is not None:
        changes["epoch"] = prev.epoch
    if new.epochs is None and prev.epochs is not None and same_epoch:
        changes["epochs"] = prev.epochs
    if not new.losses and prev.losses:
        changes["losses"] = dict(prev.losses)
    return dataclasses.replace(new, **changes) if changes else new


@dataclass(frozen=True)
class Warning(Event):
    type: ClassVar[str] = "warning"
    id: str
    severity: str
    text: str
    advice: str = ""
    source: str = "trainer"  # trainer | kernel | trainctl
    count: int = 1
    rank: int | None = None  # torchrun: the rank whose output (or an NCCL/gloo line's tag) said it


@dataclass(frozen=True)
class Stall(Event):
    type: ClassVar[str] = "stall"
    phase: str
    idle_s: float
    diagnosis: str
    cpu_percent: float | None = None
    stacks: str | None = None
    threshold_s: float | None = None
    detail: str = ""
    ranks: tuple[int, ...] = ()  # torchrun: the stalled ranks (victims included)
    # the rule of core/stall_certain.py that proved the hang (stopped, worker_gone,
    # deadlock); None: a threshold decided
    certain: str | None = None


@dataclass(frozen=True)
class StallDiagnosis(Event):
    """The verdict on the stall just announced (whose diagnosis was DIAGNOSING): what the
    stacks and the process tree say, read while the rescue save was asked."""

    type: ClassVar[str] = "stall_diagnosis"
    phase: str
    diagnosis: str  # one of DIAGNOSES
    cpu_percent: float | None = None
    stacks: str | None = None
    detail: str = ""
    # torchrun: the culprit ranks, read from their stacks (the stall's ``ranks`` are the
    # stalled ones, victims included); journals before 2026-12 wrote them as ``ranks``
    culprits: tuple[int, ...] = ()
    elapsed_s: float = 0.0  # how long the diagnosis took
    # torchrun: the collectives that did not complete, read from the ranks' Flight Recorder:
    # {"group", "seq", "name" (torch's: "gloo:all_reduce"), "state", "entered": [ranks],
    # "missing": [ranks that never entered it]} (core/flight_record.py)
    collectives: tuple[dict[str, Any], ...] = ()
    # the run's devices as read for the verdict: {"index", "name", "util", "power_w"}
    devices: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Restart(Event):
    type: ClassVar[str] = "restart"
    attempt: int
    reason: str
    preset: str | None
    resume_from: str | None = None
    delay_s: float = 0.0
    # A checkpoint the script wrote itself (agent/checkpoint_keep.py): the file, trainctl's
    # copy of it in the run directory (resume_from is one of the two), its age when the
    # restart was decided, and the batches done since it that the next attempt does again.
    resume_source: str | None = None
    resume_copy: str | None = None
    resume_age_s: float | None = None
    resume_redone: int | None = None


@dataclass(frozen=True)
class LadderMove(Event):
    """The run moved on its ladder (core/ladder.py): ``direction`` down | up | start | pin |
    unpin, the rungs by preset name, why, and the numbers behind it."""

    type: ClassVar[str] = "ladder"
    direction: str
    from_preset: str | None
    to_preset: str
    rung: int  # 1-based index of ``to_preset``
    rungs: tuple[str, ...]
    reason: str
    numbers: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Exit(Event):
    type: ClassVar[str] = "exit"
    returncode: int | None
    signal: str | None = None
    exception: str | None = None  # the trainer's last exception line, from its output
    traceback: tuple[str, ...] = ()  # the tail of that traceback (a few lines)


@dataclass(frozen=True)
class Projection(Event):
    type: ClassVar[str] = "projection"
    eta: float | None
    deadline: float | None
    buffer_s: float | None
    rate: float | None
    cost_so_far: float | None
    cost_at_eta: float | None
    eta_low: float | None = None
    eta_high: float | None = None
    budget: float | None = None
    what_if: tuple[dict[str, Any], ...] = ()
    finished: bool = False  # the run ended (eta is when); not inferred from eta <= ts
    checkpoint: dict[str, Any] | None = None  # the last good one: ts, epoch, batch, kind, lose
    # (batches a restart now would redo)
    redone: tuple[int, ...] = ()  # batches redone per restart (resume point vs furthest before)
    rate_source: str | None = None  # where `rate` comes from: measured (this run), history
    # (earlier runs), declared (the preset's expected_rate)
    preset: str | None = None  # the preset `rate` is of
    risk: dict[str, Any] | None = None  # that preset's incident rate and cost (the preset history)
    stalled_since: float | None = None  # the last batch before a stall not yet ended: the ETA
    # then moves later by every second without a batch (shown frozen and marked)


@dataclass(frozen=True)
class State(Event):
    type: ClassVar[str] = "state"
    state: str
    reason: str = ""


@dataclass(frozen=True)
class Checkpoint(Event):
    """The runner verified a checkpoint and kept a good copy of it."""

    type: ClassVar[str] = "checkpoint"
    path: str
    epoch: int | None = None
    ok: bool = True
    detail: str = ""
    batch: int | None = None  # the position within the epoch; None at an epoch's end
    kind: str = "epoch"  # epoch | periodic | rescue | planned


@dataclass(frozen=True)
class Info(Event):
    """Something trainctl itself wants the user to know (not a trainer warning)."""

    type: ClassVar[str] = "info"
    text: str
    key: str = ""


RESULTS_KEY = "runner.results_dir"
_RESULTS_TEXT = "results in "


def results_info(ts: float, path: str) -> Info:
    """Where the library writes the run's results (Ultralytics' ``save_dir``), as an info."""
    return Info(ts, _RESULTS_TEXT + path, RESULTS_KEY)


def results_path(e: Event) -> str | None:
    """The results directory an info of :func:`results_info` names, else None."""
    if isinstance(e, Info) and e.key == RESULTS_KEY and e.text.startswith(_RESULTS_TEXT):
        return e.text[len(_RESULTS_TEXT) :]
    return None


@dataclass(frozen=True)
class Error(Event):
    """A part of the agent failed (``where``); supervision goes on.  ``traceback``: the
    path of the full traceback in the run directory (or null)."""

    type: ClassVar[str] = "error"
    where: str
    text: str
    traceback: str | None = None


@dataclass(frozen=True)
class Tick(Event):
    """Ephemeral, about once a second: the stall meter and the resource probes."""

    type: ClassVar[str] = "tick"
    phase: str | None = None
    idle_s: float | None = None
    threshold_s: float | None = None
    auto_recover: bool = True
    processes: tuple[dict[str, Any], ...] = ()
    gpu: dict[str, Any] | None = None
    ladder: str | None = None  # where the run is on its ladder (agent/ladder.py describe)

    @property
    def workers(self) -> int:
        """The DataLoader worker processes seen in the trainer's tree (measured: what is in
        effect, whatever the preset asked)."""
        return sum(1 for p in self.processes if p.get("role") == "worker")


@dataclass(frozen=True)
class Log(Event):
    """Ephemeral: raw trainer output lines (ANSI stripped) for the log tail."""

    type: ClassVar[str] = "log"
    lines: tuple[str, ...] = ()


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        Start,
        Phase,
        Progress,
        Warning,
        Stall,
        StallDiagnosis,
        Restart,
        LadderMove,
        Exit,
        Projection,
        State,
        Checkpoint,
        Info,
        Error,
        Tick,
        Log,
    )
}
EPHEMERAL = frozenset({"tick", "log"})
_FIELDS = {cls: frozenset(f.name for f in dataclasses.fields(cls)) for cls in EVENT_TYPES.values()}


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as strings so a NaN loss survives the trip."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # 'nan', 'inf', '-inf'
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def to_dict(event: Event) -> dict[str, Any]:
    out: dict[str, Any] = {"ts": event.ts, "type": event.type}
    for f in dataclasses.fields(event):
        if f.name in ("ts", "seq"):
            continue
        out[f.name] = _clean(getattr(event, f.name))
    if event.seq is not None:
        out["seq"] = event.seq
    return out


def float_or_special(v: Any) -> Any:
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    return v


def from_dict(d: dict[str, Any]) -> Event:
    """Build an event from a decoded JSON object; unknown fields are dropped."""
    try:
        cls = EVENT_TYPES[d["type"]]
    except KeyError as e:
        raise ValueError(f"unknown event type {d.get('type')!r}") from e
    names = _FIELDS[cls]
    kw = {k: v for k, v in d.items() if k in names}
    if cls is StallDiagnosis and "ranks" in d and "culprits" not in d:
        kw["culprits"] = d["ranks"]  # the field's former name
    if cls is Progress and isinstance(kw.get("losses"), dict):
        kw["losses"] = {k: float_or_special(v) for k, v in kw["losses"].items()}
    for k in (
        "command",
        "env",
        "what_if",
        "processes",
        "lines",
        "redone",
        "traceback",
        "ranks",
        "culprits",
        "collectives",
        "devices",
        "rungs",
    ):
        if k in kw and isinstance(kw[k], list):
            kw[k] = tuple(kw[k])
    return cls(**kw)


class EventError(ValueError):
    """An event that does not fit its schema; ``str()`` names the type and field."""


def _is_num(v: Any) -> bool:
    return type(v) in (int, float)


def _opt(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _tuple_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, tuple) and all(check(x) for x in v)


def _is_dict(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) for k in v)


_SCHEMA: dict[str, tuple[Any, str]] = {  # a field's annotation -> (check, what it must be)
    "float": (_is_num, "a number"),
    "int": (_is_int, "an integer"),
    "str": (_is_str, "a string"),
    "bool": (lambda v: type(v) is bool, "true or false"),
    "float | None": (_opt(_is_num), "a number or null"),
    "int | None": (_opt(_is_int), "an integer or null"),
    "str | None": (_opt(_is_str), "a string or null"),
    "dict[str, float]": (
        lambda v: _is_dict(v) and all(_is_num(x) for x in v.values()),
        "an object of numbers",
    ),
    "dict[str, Any] | None": (_opt(_is_dict), "an object or null"),
    "tuple[str, ...]": (_tuple_of(_is_str), "a list of strings"),
    "tuple[int, ...]": (_tuple_of(_is_int), "a list of integers"),
    "tuple[dict[str, Any], ...]": (_tuple_of(_is_dict), "a list of objects"),
}


def check(event: Event) -> Event:
    """``event`` when each of its fields has its schema's type (the table above), else
    EventError naming the first field that does not: what comes from outside the agent
    (the trainer's side channel) is checked one event at a time."""
    for f in dataclasses.fields(event):
        if f.name == "seq":
            continue
        ok, what = _SCHEMA[cast(str, f.type)]  # the annotation's text (PEP 563)
        value = getattr(event, f.name)
        if not ok(value):
            shown = json.dumps(_clean(value), default=str)
            raise EventError(
                f"{event.type}.{f.name} must be {what} (got "
                f"{shown if len(shown) <= 40 else shown[:37] + '...'})"
            )
    return event


def decode_checked(line: str | bytes) -> Event:
    """:func:`decode` and :func:`check`: ValueError (EventError among them) for a line that
    is not one whole, well-typed event."""
    d = json.loads(line)
    if not isinstance(d, dict):
        raise EventError("not a JSON object")
    try:
        return check(from_dict(d))
    except TypeError as e:  # a field missing, or one it does not know how to take
        raise EventError(f"{d.get('type')}: {e}") from None


def encode(event: Event) -> str:
    return json.dumps(to_dict(event), separators=(",", ":"), ensure_ascii=False)


def decode(line: str | bytes) -> Event:
    return from_dict(json.loads(line))


def decode_at(line: str | bytes, seq: int) -> Event:
    """Decode a journal line whose seq (line number) is ``seq``."""
    d = json.loads(line)
    if not isinstance(d, dict):
        raise ValueError("not a JSON object")
    d["seq"] = seq
    return from_dict(d)


def with_seq(event: Event, seq: int) -> Event:
    return dataclasses.replace(event, seq=seq)
