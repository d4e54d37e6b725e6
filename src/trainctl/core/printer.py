"""Plain-text lines for --headless and for the agent's tmux pane."""

from __future__ import annotations

import time

from trainctl.core import events as E
from trainctl.core.projection_text import format_money, humanize_duration, rate_phrase, signed_duration
from trainctl.core.resumed import resumed, resumed_phrase
from trainctl.core.sanitize import sanitize_text


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def _losses(losses: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in losses.items())


def format_event(ev: E.Event) -> str | None:
    """One human line per journal event; None for events not worth a line. Sanitised
    (`sanitize_text`): commands, warnings, reasons and paths came from the trainer or
    its files, and this goes to a terminal."""
    line = _format(ev)
    return sanitize_text(line) if line is not None else None


class Printer:
    """:func:`format_event` for a stream of events: "ETA unknown" is said once, not at
    every projection (every 30 s), until an ETA was known again."""

    def __init__(self) -> None:
        self._eta_unknown = False

    def format(self, ev: E.Event) -> str | None:
        if isinstance(ev, E.Projection) and not ev.finished:
            unknown = ev.eta is None
            if unknown and self._eta_unknown:
                return None
            self._eta_unknown = unknown
        return format_event(ev)


def _format(ev: E.Event) -> str | None:
    t = _clock(ev.ts)
    match ev:
        case E.Start():
            return f"{t} START  attempt {ev.attempt}, pid {ev.pid}, preset {ev.preset or '-'}: {' '.join(ev.command)}"
        case E.Phase():
            return f"{t} PHASE  {ev.phase}"
        case E.Progress():
            ep = f"epoch {ev.epoch}/{ev.epochs or '?'} " if ev.epoch is not None else ""
            rate = f" {ev.rate:.2f} it/s" if ev.rate else ""
            ep = (f"rank {ev.rank} " if ev.rank is not None else "") + ep
            return f"{t} PROG   {ep}batch {ev.batch}/{ev.batches or '?'}{rate} {_losses(ev.losses)}".rstrip()
        case E.Warning():
            count = f" (x{ev.count})" if ev.count > 1 else ""
            advice = f"\n         advice: {ev.advice}" if ev.advice else ""
            return f"{t} {ev.severity.upper():6} {ev.id}{count}: {ev.text}{advice}"
        case E.Stall():
            stacks = f", stacks: {ev.stacks}" if ev.stacks else ""
            ranks = f" (rank {', '.join(map(str, ev.ranks))})" if ev.ranks else ""
            return (
                f"{t} STALL  {ev.diagnosis}{ranks} in {ev.phase}: no batch for {ev.idle_s:.0f}s "
                f"(threshold {ev.threshold_s or 0:.0f}s){stacks}\n         {ev.detail}"
            )
        case E.StallDiagnosis():
            stacks = f", stacks: {ev.stacks}" if ev.stacks else ""
            ranks = f" (culprit rank {', '.join(map(str, ev.culprits))})" if ev.culprits else ""
            return (
                f"{t} DIAG   {ev.diagnosis}{ranks} in {ev.phase} (read in {ev.elapsed_s:.1f}s){stacks}"
                f"\n         {ev.detail}"
            )
        case E.Restart():
            frm = f" from {ev.resume_from}" if ev.resume_from else ""
            if ev.resume_source:  # a checkpoint the script wrote: which file, its age, what is redone
                frm = f"; {resumed_phrase(resumed(ev))}"
            return (
                f"{t} RESTART attempt {ev.attempt} with preset {ev.preset or '-'}{frm} "
                f"in {ev.delay_s:.1f}s: {ev.reason}"
            )
        case E.Exit():
            sig = f" ({ev.signal})" if ev.signal else ""
            exc = f": {ev.exception}" if ev.exception else ""
            tail = "".join(f"\n         | {line}" for line in ev.traceback)
            return f"{t} EXIT   returncode {ev.returncode}{sig}{exc}{tail}"
        case E.State():
            why = f": {ev.reason}" if ev.reason else ""
            return f"{t} STATE  {ev.state}{why}"
        case E.Checkpoint():
            return (
                f"{t} CKPT   {'good' if ev.ok else 'BAD'} {ev.path} (epoch {ev.epoch}) {ev.detail}".rstrip()
            )
        case E.Info():
            return f"{t} INFO   {ev.text}"
        case E.Projection():
            if ev.eta is None:
                return f"{t} ETA    unknown (no rate yet)"
            buf = f", buffer {signed_duration(ev.buffer_s)}" if ev.buffer_s is not None else ""
            cost = f", cost {format_money(ev.cost_so_far)}" if ev.cost_so_far is not None else ""
            if ev.finished:
                return f"{t} END    {time.strftime('%a %d %b %H:%M:%S', time.localtime(ev.eta))}{buf}{cost}"
            said = rate_phrase(ev.rate, ev.rate_source, ev.preset)
            rate = f" at {said}" if said else ""
            return (
                f"{t} ETA    {time.strftime('%a %d %b %H:%M', time.localtime(ev.eta))} "
                f"(in {humanize_duration(max(0.0, ev.eta - ev.ts))}{rate}){buf}"
            )
    return None
