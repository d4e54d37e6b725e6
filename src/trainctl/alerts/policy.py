"""What to tell a person, and when: pure (time is an argument), like RecoveryPolicy.

Events go in (:meth:`AlertPolicy.feed`), messages come out (:meth:`AlertPolicy.due`):

* One message per incident: a stall (or a crash, or a fatal warning) opens one; the
  restart, fallback or failure that follows closes it, and the message says both what
  happened and what trainctl did.  An incident nothing closes within ``settle_s`` is sent
  as it is.
* At most one message per ``min_gap_s`` (60 s): what comes meanwhile (a crash loop, several
  incidents) waits and goes out as one digest when the minute is over, or at the end
  (:meth:`flush`, when the agent ends).
* The finished message and a digest say the run's goodput (core/goodput.py), folded from
  the events fed.
* ``on`` chooses among the alert kinds (``ALERT_KINDS``); an incident is sent when any of
  its parts is chosen.
Trainer text in messages goes through :func:`sanitize`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from trainctl.config import ALERT_KINDS
from trainctl.core import events as E
from trainctl.core.goodput import Goodput, describe
from trainctl.core.ladder import STEP_UP_REASON as LADDER_UP
from trainctl.core.sanitize import sanitize

SETTLE_S = 45.0  # a stall waits this long at most for what trainctl did about it
MIN_GAP_S = 60.0  # one message a minute at most; the rest goes in a digest
TEXT_MAX = 200


@dataclass(frozen=True)
class Alert:
    """One message: a one-line title and a short body."""

    title: str
    body: str
    kinds: tuple[str, ...]
    ts: float  # the newest event in it
    items: int = 1  # incidents and notices in it (a digest has several)


@dataclass
class _Item:
    opened: float
    head: str  # the title's gist: "stalled (deadlock)"
    parts: list[str] = field(default_factory=list)
    kinds: set[str] = field(default_factory=set)
    last: float = 0.0
    did: str = ""  # the title's second half: "restarted under B"


def _cut(text: str, n: int = TEXT_MAX) -> str:
    text = sanitize(text).strip()
    return text if len(text) <= n else text[: n - 1] + "…"


def _ago(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 90:
        return f"{s} s"
    if s < 5400:
        return f"{round(s / 60)} m"
    return f"{s / 3600:.1f} h"


def _clock(ts: float, now: float) -> str:
    lt, ln = time.localtime(ts), time.localtime(now)
    return time.strftime("%H:%M" if lt[:3] == ln[:3] else "%a %d %b %H:%M", lt)


class AlertPolicy:
    def __init__(
        self,
        job: str,
        host: str = "",
        attach: str = "",
        on=None,
        *,
        settle_s: float = SETTLE_S,
        min_gap_s: float = MIN_GAP_S,
    ) -> None:
        self.job, self.host, self.attach = job, host, attach
        self.on = set(on if on is not None else ALERT_KINDS)
        self.settle_s, self.min_gap_s = settle_s, min_gap_s
        self.open: _Item | None = None
        self.ready: list[_Item] = []
        self.last_sent: float | None = None
        # what the messages say about the run
        self.phase = "startup"
        self.position: tuple[int | None, int | None] = (None, None)
        self.checkpoint_ts: float | None = None
        self.projection: E.Projection | None = None
        self.goodput = Goodput()  # the finished message and a digest say it

    # ------------------------------------------------------------------ events in
    def feed(self, ev: E.Event, now: float) -> None:
        if ev.type not in E.EPHEMERAL:
            self.goodput.apply(ev)
        if isinstance(ev, E.Phase):
            self.phase = ev.phase
        elif isinstance(ev, E.Progress):
            if ev.epoch is not None or ev.batch is not None:
                self.position = (ev.epoch, ev.batch)
        elif isinstance(ev, E.Checkpoint) and ev.ok:
            self.checkpoint_ts = ev.ts
        elif isinstance(ev, E.Projection):
            self.projection = ev
        elif isinstance(ev, E.Stall):
            self._close(now)
            where = self._where(ev.phase)
            known = ev.diagnosis != E.DIAGNOSING  # else its verdict follows (StallDiagnosis)
            why = _cut((ev.diagnosis + ", " if known else "") + ev.detail if ev.detail else ev.diagnosis)
            self._open(
                ev.ts,
                f"stalled ({ev.diagnosis})" if known else "stalled",
                f"stalled {where} after {ev.idle_s:.0f} s without progress: {why}",
                "stall",
            )
        elif isinstance(ev, E.StallDiagnosis) and self.open is not None and "stall" in self.open.kinds:
            self.open.head = f"stalled ({ev.diagnosis})"
            self._add(
                ev.ts, f"diagnosis: {_cut(ev.diagnosis + (f', {ev.detail}' if ev.detail else ''))}", "", ""
            )
        elif isinstance(ev, E.Exit):
            if self.open is None and ev.returncode not in (0, None) or (self.open is None and ev.signal):
                how = f"killed by {ev.signal}" if ev.signal else f"exit code {ev.returncode}"
                self._open(ev.ts, "crashed", f"the trainer crashed {self._where(self.phase)} ({how})", None)
        elif isinstance(ev, E.Warning):
            self._warning(ev, now)
        elif isinstance(ev, E.LadderMove):
            self._ladder(ev, now)
        elif isinstance(ev, E.Restart):
            if "requested by the user" in ev.reason or ev.reason.startswith(LADDER_UP):
                if self.open is not None and self.open.head == "crashed":
                    self.open = None  # the kill of the user's own restart
                return
            kind = "fallback" if "falling back" in ev.reason else "restart"
            frm = "from the start"
            if ev.resume_from:
                frm = (
                    f"from the checkpoint of {_ago(ev.ts - self.checkpoint_ts)} ago"
                    if self.checkpoint_ts is not None
                    else "from its last checkpoint"
                )
            delay = f" in {ev.delay_s:.0f} s" if ev.delay_s >= 1 else ""
            did = f"restarted under preset {ev.preset}" if ev.preset else "restarted"
            if self.open is None:
                self._open(ev.ts, "restart", f"attempt {ev.attempt - 1} ended: {_cut(ev.reason)}", None)
            self._add(ev.ts, f"{did} {frm}{delay} (attempt {ev.attempt})", kind, did)
            self._close(now)
        elif isinstance(ev, E.State):
            if ev.state == "FAILED":
                if self.open is None:
                    self._open(ev.ts, "failed", "", None)
                self._add(
                    ev.ts, f"failed for good: {_cut(ev.reason)}; it needs you", "failed", "FAILED, needs you"
                )
                self._close(now)
            elif ev.state == "FINISHED":
                self._close(now)
                self._open(ev.ts, "finished", "", None)
                self._add(ev.ts, "finished" + (f" ({_cut(ev.reason)})" if ev.reason else ""), "finished", "")
                self._close(now)
            elif ev.state == "STOPPED" and self.open is not None:
                self._add(ev.ts, "then stopped by the user", "", "stopped")
                self._close(now)

    def _ladder(self, ev: E.LadderMove, now: float) -> None:
        """A step down joins the hang's own message (its restart closes it); a step up is one
        message of its own; pins, unpins and where a run starts are journaled, not sent."""
        where = f"{ev.to_preset} ({ev.rung} of {len(ev.rungs)})"
        if ev.direction == "down" and self.open is not None:
            self._add(ev.ts, f"ladder: one rung down to {where}", "ladder", "")
        elif ev.direction == "up":
            self._close(now)
            self._open(ev.ts, f"ladder up to {ev.to_preset}", _cut(ev.reason), "ladder")
            self._close(now)

    def _warning(self, ev: E.Warning, now: float) -> None:
        if ev.id in ("deadline.at_risk", "budget.at_risk"):
            self._close(now)
            self._open(
                ev.ts,
                ev.id.replace(".", " ").replace("_", " "),
                _cut(ev.text) + (f". {_cut(ev.advice)}" if ev.advice else ""),
                ev.id,
            )
            self._close(now)
        elif ev.severity == "fatal" and ev.id != "trainctl.failed":
            text = f"fatal warning {ev.id}: {_cut(ev.text)}"
            if self.open is None:
                self._open(ev.ts, f"fatal: {ev.id}", text, "fatal_warning")
            else:
                self._add(ev.ts, text, "fatal_warning", "")

    def _where(self, phase: str) -> str:
        epoch, batch = self.position
        at = ""
        if epoch is not None:
            at = f" at epoch {epoch}" + (f" batch {batch}" if batch is not None else "")
        elif batch is not None:
            at = f" at batch {batch}"
        return f"in {phase}{at}"

    def _open(self, ts: float, head: str, text: str, kind: str | None) -> None:
        self.open = _Item(ts, head, [text] if text else [], {kind} if kind else set(), ts)

    def _add(self, ts: float, text: str, kind: str, did: str) -> None:
        item = self.open
        assert item is not None
        item.parts.append(text)
        if kind:
            item.kinds.add(kind)
        item.last = max(item.last, ts)
        if did:
            item.did = did

    def _close(self, now: float) -> None:
        item, self.open = self.open, None
        if item is not None and item.kinds & self.on:
            self.ready.append(item)

    # ------------------------------------------------------------------ messages out
    def next_wake(self) -> float | None:
        """When :meth:`due` may next have something (for a sender's sleep)."""
        times = []
        if self.open is not None:
            times.append(self.open.opened + self.settle_s)
        if self.ready:
            times.append(self.last_sent + self.min_gap_s if self.last_sent is not None else 0.0)
        return min(times) if times else None

    def due(self, now: float) -> list[Alert]:
        if self.open is not None and now - self.open.opened >= self.settle_s:
            self._add(now, f"(nothing followed within {self.settle_s:.0f} s)", "", "")
            self._close(now)
        if not self.ready or (self.last_sent is not None and now - self.last_sent < self.min_gap_s):
            return []
        return [self._take(now)]

    def flush(self, now: float) -> list[Alert]:
        """Everything still held (the agent ends): one last message, past the rate limit."""
        self._close(now)
        return [self._take(now)] if self.ready else []

    def _take(self, now: float) -> Alert:
        items, self.ready = self.ready, []
        self.last_sent = now
        kinds = tuple(sorted(set().union(*(i.kinds for i in items)) & self.on))
        ts = max(i.last for i in items)
        if len(items) == 1:
            item = items[0]
            title = f"trainctl {self.job}: {item.head}" + (f", {item.did}" if item.did else "")
            what = "; ".join(item.parts)
        else:
            span = _ago(items[-1].last - items[0].opened)
            title = f"trainctl {self.job}: {len(items)} incidents in {span} (digest)"
            what = "\n".join(f"- {_clock(i.opened, now)} {'; '.join(i.parts)}" for i in items)
        if len(items) > 1 or items[-1].head == "finished":  # where the time went, so far or in all
            what += "\n" + describe(self.goodput.totals(None if self.goodput.closed else now))
        return Alert(_cut(title, 120), self._body(what, now), kinds, ts, len(items))

    def _body(self, what: str, now: float) -> str:
        lines = [f"job {self.job}" + (f" on {self.host}" if self.host else ""), what]
        eta = self._eta(now)
        if eta:
            lines.append(eta)
        if self.attach:
            lines.append(f"look: {self.attach}")
        return "\n".join(lines)

    def _eta(self, now: float) -> str:
        p = self.projection
        if p is None:
            return ""
        if p.finished and p.eta is not None:
            line = f"ended {_clock(p.eta, now)}"
        elif p.eta is not None:
            line = f"ETA {_clock(p.eta, now)}"
            if p.rate_source == "declared":  # a figure from elsewhere: nothing measured yet
                line += f" (at preset {p.preset or '?'}'s declared rate, not measured yet)"
        else:
            return "ETA unknown yet" + (f"; deadline {_clock(p.deadline, now)}" if p.deadline else "")
        if p.deadline is not None:
            margin = p.deadline - p.eta
            line += (
                f", {_ago(margin)} before the deadline {_clock(p.deadline, now)}"
                if margin >= 0
                else f", {_ago(-margin)} AFTER the deadline {_clock(p.deadline, now)}"
            )
        if p.budget is not None and p.cost_at_eta is not None:
            line += f"; cost {p.cost_at_eta:.2f} of budget {p.budget:.2f}"
        return line
