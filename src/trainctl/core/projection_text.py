"""A projection as words: durations, times of day, money, the ETA and rate phrases, the
projection and what-if lines, and the deadline and budget warnings
(:class:`trainctl.core.projection.Projector` raises them).  Pure: time is an argument.
"""

from __future__ import annotations

import math
import time
from typing import Any, cast

from trainctl.core.events import Projection
from trainctl.core.events import Warning as WarningEvent


def _best_alternative(p: Projection, key: str) -> dict[str, Any] | None:
    items = [w for w in p.what_if if w.get(key) is not None]
    return min(items, key=lambda w: w[key]) if items else None


def _guessed(w: dict[str, Any]) -> str:
    """Words for a what-if that stands on a declared rate, not one measured here."""
    if w.get("source") == "declared":
        return " (at its declared rate, not measured here)"
    if w.get("source") == "scaled":
        return f" (its declared rate scaled to {w.get('against')}'s measured one)"
    return ""


def deadline_warning(p: Projection, now: float) -> WarningEvent:
    band = ""
    if p.eta_low is not None and p.eta_high is not None:
        band = f" ± {humanize_duration((p.eta_high - p.eta_low) / 2)}"
    verb = "is after" if cast(float, p.eta) > cast(float, p.deadline) else "may miss"
    text = (
        f"ETA {format_when(p.eta, now)}{band} {verb} the deadline "
        f"{format_when(p.deadline, now)} (buffer {signed_duration(p.buffer_s)})"
    )
    best = _best_alternative(p, "eta")
    if best is not None and best["buffer_s"] is not None and best["buffer_s"] > 0:
        guess = _guessed(best)
        text += (
            f"; {best['preset']} would finish {format_when(best['eta'], now)} with "
            f"{humanize_duration(best['buffer_s'])} to spare{guess}"
        )
        advice = f"Switch to preset {best['preset']}, or move the deadline."
    else:
        advice = "No known preset finishes in time: move the deadline or speed the run up."
    return WarningEvent(now, "deadline.at_risk", "warning", text, advice, source="trainctl")


def budget_warning(p: Projection, now: float, cost: float) -> WarningEvent:
    text = (
        f"cost at ETA {format_money(cost)} is over the budget {format_money(p.budget)} "
        f"(spent {format_money(p.cost_so_far)}, ETA {format_when(p.eta, now)})"
    )
    best = _best_alternative(p, "cost_at_eta")
    if best is not None and best["cost_at_eta"] <= p.budget:
        text += f"; {best['preset']} would cost {format_money(best['cost_at_eta'])}{_guessed(best)}"
        advice = f"Switch to preset {best['preset']}, or raise the budget."
    else:
        advice = "No known preset stays within the budget: raise it or speed the run up."
    return WarningEvent(now, "budget.at_risk", "warning", text, advice, source="trainctl")


# ---------------------------------------------------------------------------- text
def humanize_duration(s: float | None) -> str:
    """Two most significant units: '2 d 3 h', '5 h 12 m', '3 m 20 s', '45 s'; '-' before
    a negative duration; '?' for None."""
    if s is None or not math.isfinite(s):
        return "?"
    sign = "-" if s < 0 else ""
    s = abs(s)
    if s < 60:
        return f"{sign}{round(s)} s"
    if s < 3600:
        m, sec = divmod(round(s), 60)
        return f"{sign}{m} m {sec} s" if sec else f"{sign}{m} m"
    if s < 86400:
        h, m = divmod(round(s / 60), 60)
        return f"{sign}{h} h {m} m" if m else f"{sign}{h} h"
    d, h = divmod(round(s / 3600), 24)
    return f"{sign}{d} d {h} h" if h else f"{sign}{d} d"


def signed_duration(s: float | None) -> str:
    if s is None:
        return "?"
    return humanize_duration(s) if s < 0 else "+" + humanize_duration(s)


def format_when(ts: float | None, now: float | None = None) -> str:
    """Local date and time like 'Nov 24 20:17' (with the year when it is not now's)."""
    if ts is None:
        return "?"
    t = time.localtime(ts)
    text = f"{time.strftime('%b', t)} {t.tm_mday} {time.strftime('%H:%M', t)}"
    if now is not None and time.localtime(now).tm_year != t.tm_year:
        text += f" {t.tm_year}"
    return text


def format_money(v: float | None, currency: str = "$") -> str:
    if v is None:
        return "?"
    return f"{currency}{v:,.0f}" if abs(v) >= 100 else f"{currency}{v:,.2f}"


def eta_phrase(p: Projection, now: float, compact: bool = False) -> str:
    """'ETA Nov 24 18:00 (in 2 h 5 m)' or, once the run ended, 'finished … (3 m ago)'.
    While stalled the ETA moves later by every second without a batch: the work left is
    said as it was when the projection was made, and marked, never counted down."""
    assert p.eta is not None
    if p.stalled_since is not None and not p.finished:
        left_s = max(0.0, p.eta - p.ts)
        earliest = format_when(max(p.eta, now + left_s), now)
        if compact:
            return f"ETA ≥ {earliest} (stalled)"
        return (
            f"ETA not before {earliest} (stalled for {humanize_duration(now - p.stalled_since)}: "
            f"{humanize_duration(left_s)} of work left, later by every second without a batch)"
        )
    rel = f"in {humanize_duration(p.eta - now)}" if p.eta >= now else f"{humanize_duration(now - p.eta)} ago"
    return f"{'finished' if p.finished else 'ETA'} {format_when(p.eta, now)} ({rel})"


RATE_WORDS = {"measured": "", "history": "measured in earlier runs", "declared": "declared"}


def rate_phrase(
    rate: float | None, source: str | None, preset: str | None = None, compact: bool = False
) -> str:
    """'14.30 it/s', '2.40 it/s (declared by preset A, not measured yet)', '2.10 it/s
    (measured in earlier runs)'; '' without a rate.  Only a rate this run measured goes
    without words."""
    if not rate:
        return ""
    text = f"{rate:.2f} it/s"
    if source == "declared":
        if compact:
            return text + " (declared)"
        by = f" by preset {preset}" if preset else ""
        return text + f" (declared{by}, not measured yet)"
    words = RATE_WORDS.get(source or "measured", "")
    if words and not compact:
        text += f" ({words})"
    elif words:
        text += " (earlier runs)"
    return text


def risk_phrase(risk: dict[str, Any] | None) -> str:
    """'3 incidents in 9 h (this job here, 12 runs; ≈ 40 s each)', '0 incidents in 30 h (this
    run)'; '' with no record, or with none in under an hour (a clean short record says nothing
    yet).  The scope says whose runs the count is of (:func:`scope_phrase`); a cost that was
    not measured says it is the default."""
    if not risk:
        return ""
    n = int(risk.get("incidents", 0))
    if n == 0 and float(risk.get("hours", 0.0)) < 1:
        return ""
    text = f"{n} incident{'s' if n != 1 else ''} in {hours_phrase(float(risk.get('hours', 0.0)))}"
    notes = [scope] if (scope := scope_phrase(risk)) else []
    if n:
        each = humanize_duration(float(risk.get("mean_cost_s", 0.0)))
        notes.append(f"≈ {each} each" if risk.get("cost_measured") else f"≈ {each} each, not measured yet")
    return text + (f" ({'; '.join(notes)})" if notes else "")


def scope_phrase(risk: dict[str, Any], compact: bool = False) -> str:
    """Whose runs a preset's counts are of: 'this run', 'this job here, 12 runs' (this run
    among them), '3 earlier runs' (of this job on this machine); '' where a projection from
    before the scope was journaled does not say."""
    runs = int(risk.get("runs") or 0)
    if runs <= 0:
        return ""
    if risk.get("this_run"):
        if runs == 1:
            return "this run"
        return f"{runs} runs" if compact else f"this job here, {runs} runs"
    earlier = f"{runs} earlier run{'s' if runs != 1 else ''}"
    return earlier if compact else f"{earlier} of this job here"


def hours_phrase(hours: float) -> str:
    """Hours run, as a person counts them: '40 m', '2.5 h', '30 h', '1,200 h'."""
    if hours < 1:
        return humanize_duration(hours * 3600)
    return f"{hours:.1f} h".replace(".0 h", " h") if hours < 10 else f"{hours:,.0f} h"


def band_phrase(eta: float | None, low: float | None, high: float | None) -> str:
    """' ± 20 m' (half the band), '' under a minute."""
    if eta is None or low is None or high is None or high - low < 60:
        return ""
    return f" ± {humanize_duration((high - low) / 2)}"


def format_projection(p: Projection, now: float, currency: str = "$") -> list[str]:
    """Human lines for `trainctl status` and the TUI (colouring is the TUI's job)."""
    lines = []
    said = rate_phrase(p.rate, p.rate_source, p.preset)
    rate = f" at {said}" if said else ""
    if said and (risky := risk_phrase(p.risk)):
        rate += f", {risky}"
    if p.eta is None:
        lines.append("ETA unknown: " + ("no rate yet" if not p.rate else "total work unknown") + rate)
    else:
        line = eta_phrase(p, now) + rate
        if p.eta_low is not None and p.eta_high is not None and p.eta_high - p.eta_low >= 60:
            line += f", likely {format_when(p.eta_low, now)} – {format_when(p.eta_high, now)}"
        lines.append(line)
    if p.deadline is not None:
        line = f"deadline {format_when(p.deadline, now)}"
        if p.buffer_s is not None:
            line += f": buffer {signed_duration(p.buffer_s)}" + (" (late)" if p.buffer_s < 0 else "")
        lines.append(line)
    if p.cost_so_far is not None:
        if p.finished:  # one figure
            line = f"cost {format_money(p.cost_so_far, currency)} in all"
        else:
            line = (
                f"cost {format_money(p.cost_so_far, currency)} so far, "
                f"{format_money(p.cost_at_eta, currency)} at ETA"
            )
        if p.budget is not None:
            line += f"; budget {format_money(p.budget, currency)}"
            if p.cost_at_eta is not None:
                spare = p.budget - p.cost_at_eta
                line += (
                    f" ({format_money(spare, currency)} to spare)"
                    if spare >= 0
                    else f" (over by {format_money(-spare, currency)})"
                )
        lines.append(line)
    elif p.budget is not None:
        lines.append(f"budget {format_money(p.budget, currency)} (no cost per hour set)")
    if p.redone:
        lines.append(f"batches redone per restart: {', '.join(map(str, p.redone))}")
    if p.checkpoint and not p.finished:
        lines += checkpoint_phrase(p.checkpoint, now).split("; ")
    for w in p.what_if:
        lines.append(format_what_if(w, now, currency))
    return lines


def checkpoint_phrase(c: dict[str, Any], now: float, compact: bool = False) -> str:
    """'last checkpoint 3 m ago, epoch 2 batch 700 (periodic); a restart now loses 12 batches'."""
    if c.get("epoch") is None:  # a position on an open step counter (nanoGPT's iter N)
        where, short = f"step {c.get('batch')}", f"s{c.get('batch')}"
    elif c.get("batch") is not None:
        where, short = f"epoch {c['epoch']} batch {c['batch']}", f"e{c['epoch']} b{c['batch']}"
    else:
        where, short = f"end of epoch {c['epoch']}", f"e{c['epoch']} bend"
    ago = humanize_duration(max(0.0, now - c.get("ts", now)))
    if compact:
        lose = f", loses {c['lose']}" if c.get("lose") is not None else ""
        return f"ckpt {ago} ago, {short}{lose}"
    line = f"last checkpoint {ago} ago, {where} ({c.get('kind', '?')})"
    if c.get("lose") is not None:
        n = c["lose"]
        line += f"; a restart now loses {n} batch{'es' if n != 1 else ''}"
    return line


def format_what_if(w: dict[str, Any], now: float, currency: str = "$") -> str:
    """'B (measured 2.1 it/s): ETA Nov 26 03:00, buffer +3 d 21 h, cost $412'; a declared
    rate says so, and a scaled one what it was scaled from."""
    name = w.get("preset", "?")
    if w.get("rate") is None:
        return f"{name} (rate unknown): no ETA"
    source = w.get("source", "?")
    if source == "scaled":
        head = (
            f"{name} (~{w['rate']:.3g} it/s: declared {w['declared']:.3g}, scaled to "
            f"{w.get('against') or '?'}'s measured)"
        )
    elif source == "declared":
        head = f"{name} (declared {w['rate']:.3g} it/s, not measured here)"
    elif source == "history":
        head = f"{name} (measured {w['rate']:.3g} it/s in earlier runs)"
    else:
        head = f"{name} ({source} {w['rate']:.3g} it/s)"
    if risky := risk_phrase(w.get("risk")):
        head += f", {risky}"
    band = band_phrase(w.get("eta"), w.get("eta_low"), w.get("eta_high"))
    parts = [f"ETA {format_when(w.get('eta'), now)}{band}" if w.get("eta") is not None else "no ETA"]
    if w.get("buffer_s") is not None:
        parts.append(f"buffer {signed_duration(w['buffer_s'])}")
    if w.get("cost_at_eta") is not None:
        parts.append(f"cost {format_money(w['cost_at_eta'], currency)}")
    return f"{head}: " + ", ".join(parts)
