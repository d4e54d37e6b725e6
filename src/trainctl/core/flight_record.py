"""The ranks' Flight Recorder read at a stall: which collective did not complete, which
ranks entered it and which never did.  Pure: it reads the JSON the ranks wrote
(trainctl.inside.bootstrap.trainctl_flight: torch's ``_dump_fr_trace_json`` for gloo's
records, ``_dump_nccl_trace_json`` for NCCL's), never a pickle.

What torch records, per rank (torch 2.14, read on a 2-rank gloo job): one entry per
collective of each process group, ``collective_seq_id`` counting them (1, 2, ... in each
group, the same on every rank), ``profiling_name`` (``gloo:all_reduce``,
``nccl:all_reduce``), ``process_group`` ``[name, description]``, ``state``
(``scheduled``, ``started``, ``completed``: gloo's stay ``scheduled``) and ``retired``
(true once the work completed); ``pg_status`` per group: ``last_enqueued_collective`` and
``last_completed_collective``; ``pg_config`` per group: its ranks (``"[0, 1]"``).

A collective that did not complete is the lowest sequence number of a group that some rank
entered and did not finish; the group's ranks whose last entered collective is before it
never entered it (the culprits of a hang in a collective); the ones that entered wait in
it.  Ranks that did not answer are neither."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SOURCES = ("fr", "nccl")  # the rank's answer: gloo's (CPU) records, NCCL's


@dataclass
class _Group:
    desc: str = ""
    ranks: tuple[int, ...] = ()
    last: dict[int, int] = field(default_factory=dict)  # rank -> its last entered seq
    open: dict[int, dict[int, tuple[str, str]]] = field(default_factory=dict)  # seq -> rank -> (name, state)


@dataclass(frozen=True)
class Unfinished:
    """A collective that did not complete (one per process group at most)."""

    group: str  # the process group's description (``default_pg``), else its name
    seq: int  # its collective_seq_id in the group
    name: str  # torch's profiling name: ``gloo:all_reduce``
    state: str  # as recorded by the ranks that entered it
    entered: tuple[int, ...]  # ranks that entered it (they wait in it)
    missing: tuple[int, ...]  # ranks of the group that never entered it

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "seq": self.seq,
            "name": self.name,
            "state": self.state,
            "entered": list(self.entered),
            "missing": list(self.missing),
        }


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _ranks(raw: Any) -> tuple[int, ...]:
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
        return tuple(sorted(int(r) for r in value))
    except (TypeError, ValueError):
        return ()


def _read(groups: dict[str, _Group], rank: int, dump: Any) -> None:
    if not isinstance(dump, dict):
        return
    for name, config in (dump.get("pg_config") or {}).items():
        if isinstance(config, dict):
            g = groups.setdefault(str(name), _Group())
            g.desc = g.desc or str(config.get("desc") or "")
            g.ranks = g.ranks or _ranks(config.get("ranks"))
    for name, status in (dump.get("pg_status") or {}).items():
        last = _int(status.get("last_enqueued_collective")) if isinstance(status, dict) else None
        if last is not None and last >= 0:
            g = groups.setdefault(str(name), _Group())
            g.last[rank] = max(g.last.get(rank, 0), last)
    for entry in dump.get("entries") or ():
        if not isinstance(entry, dict) or entry.get("is_p2p"):
            continue
        pg = entry.get("process_group") or ()
        seq = _int(entry.get("collective_seq_id"))
        if not pg or seq is None or seq <= 0:
            continue
        g = groups.setdefault(str(pg[0]), _Group())
        if len(pg) > 1 and not g.desc:
            g.desc = str(pg[1])
        g.last[rank] = max(g.last.get(rank, 0), seq)
        state = str(entry.get("state") or "")
        if entry.get("retired") or state == "completed":
            continue
        g.open.setdefault(seq, {})[rank] = (str(entry.get("profiling_name") or "?"), state)


def unfinished(answers: Mapping[int, Mapping[str, Any]]) -> tuple[Unfinished, ...]:
    """The collectives that did not complete, from each rank's answer (rank -> its JSON
    object), lowest sequence number of each group first; groups by name."""
    groups: dict[str, _Group] = {}
    for rank, answer in answers.items():
        for source in SOURCES:
            _read(groups, rank, answer.get(source))
    out = []
    for name in sorted(groups):
        g = groups[name]
        if not g.open:
            continue
        seq = min(g.open)
        names = sorted({n for n, _ in g.open[seq].values()})
        states = sorted({s for _, s in g.open[seq].values()})
        members = [r for r in (g.ranks or tuple(g.last)) if r in answers]
        entered = tuple(sorted(r for r in members if g.last.get(r, 0) >= seq))
        missing = tuple(sorted(r for r in members if g.last.get(r, 0) < seq))
        out.append(Unfinished(g.desc or name, seq, "/".join(names), "/".join(states), entered, missing))
    return tuple(out)


def _ranks_said(ranks: tuple[int, ...] | list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def said(collectives: tuple[Mapping[str, Any], ...], unanswered: Mapping[int, str]) -> str:
    """The verdict's sentence from the fields (:meth:`Unfinished.as_dict`'s) and the ranks
    that did not answer (rank -> why)."""
    parts = []
    for c in collectives:
        what = f"{c['name']} #{c['seq']} of {c['group']}"
        bits = []
        if c["missing"]:
            bits.append(f"{_ranks_said(c['missing'])} never entered it")
        if c["entered"]:
            waits = "wait" if len(c["entered"]) > 1 else "waits"
            bits.append(f"{_ranks_said(c['entered'])} {waits} in it ({c['state']})")
        parts.append(f"{what} did not complete: {'; '.join(bits)}" if bits else f"{what} did not complete")
    for rank, why in sorted(unanswered.items()):
        parts.append(f"rank {rank} gave no record ({why})")
    if not parts:
        return ""
    return f"Flight Recorder: {'. '.join(parts)}."
