"""A :class:`~trainctl.report.collect.Report` as one self-contained HTML page (inline SVG and
CSS: no script, no network) or as Markdown (the same numbers; tables for the charts)."""

from __future__ import annotations

from trainctl.core.goodput import BUCKETS, describe
from trainctl.core.resumed import resumed_phrase
from trainctl.report.collect import Report
from trainctl.report.svg import BUCKET_COLORS, clock, duration, esc, line_chart, stacked_bar, swatch

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1000px; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; } td, th { border-bottom: 1px solid #ddd;
  padding: 3px 8px; text-align: left; vertical-align: top; } th { background: #f4f4f4; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
svg.chart text { font: 11px sans-serif; fill: #444; } .dim { color: #777; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
"""


def _marks(r: Report) -> list[tuple[float, str, str]]:
    marks = [(i.ts, i.kind, i.text) for i in r.incidents]
    marks += [
        (a["ts"], "restart", f"attempt {a['attempt']} ({a['preset']})")
        for a in r.attempts
        if a.get("restart")
    ]
    return marks


def _span(r: Report) -> tuple[float, float]:
    t0 = r.started if r.started is not None else 0.0
    t1 = max(r.ended or 0.0, r.last_ts or 0.0, t0 + 1.0)
    return t0, t1


def preset_changes(r: Report) -> list[dict]:
    """The attempts whose preset differs from the one before (the first one too)."""
    out, last = [], None
    for a in r.attempts:
        if a.get("restart"):
            continue
        if a["preset"] != last:
            out.append(a)
            last = a["preset"]
    return out


def _reasons(r: Report) -> dict[int, str]:
    """Each restart's reason, and where it resumed from when it did (core/resumed.py)."""
    return {
        a["attempt"]: a["reason"]
        + (f"; {resumed_phrase(a['resumed'])}" if (a.get("resumed") or {}).get("from") else "")
        for a in r.attempts
        if a.get("restart")
    }


def ends(r: Report) -> list[tuple[str, str]]:
    """Projected vs actual end, as (what, when) rows."""
    ts, eta = r.eta
    rows = []
    if eta:
        rows.append((f"first projection ({clock(ts[0])})", clock(eta[0])))
        mid = len(eta) // 2
        rows.append((f"half-way ({clock(ts[mid])})", clock(eta[mid])))
        rows.append((f"last projection ({clock(ts[-1])})", clock(eta[-1])))
    if r.deadline is not None:
        rows.append(("deadline", clock(r.deadline)))
    rows.append(("actual end" if r.state == "FINISHED" else f"{r.state.lower()} at", clock(r.ended)))
    return rows


def goodput_rows(g: dict) -> list[tuple[str, float, float, str]]:
    """(bucket, seconds, share, colour) for productive and every loss over 0, biggest loss
    first."""
    wall = g.get("wall_s") or 0.0
    rows = [("productive", g.get("productive_s") or 0.0)]
    rows += sorted(
        ((k, v) for k, v in g.get("buckets", {}).items() if v > 0 and k in BUCKETS), key=lambda kv: -kv[1]
    )
    colors = dict(zip(BUCKETS, BUCKET_COLORS))
    return [(BUCKETS[k], v, v / wall if wall else 0.0, colors[k]) for k, v in rows]


def _goodput_table(g: dict) -> str:
    out = ["<table><tr><th></th><th>time</th><th>share</th></tr>"]
    for label, seconds, share, color in goodput_rows(g):
        out.append(
            f'<tr><td>{swatch(color)} {esc(label)}</td><td class="n">{esc(duration(seconds))}</td>'
            f'<td class="n">{share * 100:.1f} %</td></tr>'
        )
    return "\n".join(out) + "</table>"


def _table(head: tuple[str, ...], rows: list[tuple], numeric: tuple[int, ...] = ()) -> str:
    out = ["<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>"]
    for row in rows:
        cells = "".join(
            f'<td class="n">{esc(c)}</td>' if i in numeric else f"<td>{esc(c)}</td>"
            for i, c in enumerate(row)
        )
        out.append(f"<tr>{cells}</tr>")
    out.append("</table>")
    return "\n".join(out)


def _incident_rows(r: Report) -> list[tuple]:
    reasons = _reasons(r)
    return [
        (
            clock(i.ts),
            i.attempt or "-",
            i.kind,
            i.text,
            duration(i.cost_s),
            reasons.get((i.attempt or 0) + 1, ""),
        )
        for i in r.incidents
    ]


def _checkpoint_rows(r: Report) -> list[tuple]:
    return [
        (
            clock(c["ts"]),
            c["epoch"] or "-",
            c["batch"] if c["batch"] is not None else "end",
            c["kind"],
            "yes" if c["ok"] else "NO",
            c["path"],
        )
        for c in r.checkpoints
    ]


def _resumed_rows(r: Report) -> list[tuple]:
    """Each restart given a checkpoint: the checkpoints a run went on from, journaled as a
    checkpoint event or not (a ``--resume-from`` file, a rescue save)."""
    return [
        (a["attempt"], clock(a["ts"]), a["resume_from"], resumed_phrase(a["resumed"]))
        for a in r.attempts
        if a.get("restart") and a.get("resume_from")
    ]


def _preset_rows(r: Report) -> list[tuple]:
    reasons = _reasons(r)
    return [
        (clock(a["ts"]), a["attempt"], a["preset"], reasons.get(a["attempt"], "")) for a in preset_changes(r)
    ]


def _dropped(r: Report, name: str) -> str:
    n = r.dropped.get(name)
    return f'<p class="dim">{n} older rows left out.</p>' if n else ""


def html_report(r: Report) -> str:
    t0, t1 = _span(r)
    marks = _marks(r)
    g = r.goodput
    state = f"{r.state} ({r.state_reason})" if r.state_reason else r.state
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        f"<title>trainctl report: {esc(r.job)}</title><style>{CSS}</style></head><body>",
        f"<h1>{esc(r.job)}</h1>",
        f"<p>{esc(r.run_dir)}<br>{esc(state)}{' (live: this page is of ' + esc(clock(r.last_ts)) + ')' if r.live else ''}"
        f"<br>from {esc(clock(r.started))} to {esc(clock(r.ended or r.last_ts))}"
        f" · {r.events:,} journal events</p>",
        f"<h2>Goodput</h2><p><b>{esc(describe(g))}</b> (wall {esc(duration(g.get('wall_s')))})</p>",
        stacked_bar([(k, v, c) for k, v, _, c in goodput_rows(g)], g.get("wall_s") or 0.0),
        _goodput_table(g),
        "<h2>Losses</h2>",
        line_chart(r.losses, t0, t1, marks, "losses")
        if r.losses
        else '<p class="dim">no loss in the journal</p>',
        "<h2>Rate (batches/s)</h2>",
        line_chart({"rate": r.rate}, t0, t1, marks, "rate")
        if r.rate[0]
        else '<p class="dim">no measured rate</p>',
        "<h2>Incidents</h2>",
        _table(("when", "attempt", "kind", "diagnosis", "cost", "then"), _incident_rows(r))
        + _dropped(r, "incidents")
        if r.incidents
        else '<p class="dim">none</p>',
        "<h2>Presets</h2>",
        _table(
            ("from", "attempt", "preset", "why"),
            _preset_rows(r),
        )
        + f"<p>{len([a for a in r.attempts if not a.get('restart')])} attempts.</p>",
        "<h2>Projected and actual end</h2>",
        _eta_chart(r, t0, t1),
        _table(("", "when"), ends(r)),
        "<h2>Checkpoints</h2>",
        _table(
            ("when", "epoch", "batch", "kind", "usable", "path"),
            _checkpoint_rows(r),
        )
        + _dropped(r, "checkpoints")
        if r.checkpoints
        else '<p class="dim">no checkpoint journaled</p>',
        "<h3>Resumed from</h3>",
        _table(("attempt", "when", "checkpoint", "how"), _resumed_rows(r))
        if _resumed_rows(r)
        else '<p class="dim">no restart resumed from a checkpoint</p>',
        f'<p class="dim">trainctl report, read in {r.read_s:.2f} s.</p>',
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _eta_chart(r: Report, t0: float, t1: float) -> str:
    ts, eta = r.eta
    if not eta:
        return '<p class="dim">no projection in the journal</p>'
    hours = [(e - t0) / 3600 for e in eta]
    end = ((r.ended - t0) / 3600, "actual end") if r.ended is not None and r.state == "FINISHED" else None
    return "<p>The projected end over the run (hours after its start).</p>" + line_chart(
        {"projected end (h)": (ts, hours)}, t0, t1, [], "projected end", end
    )


def markdown_report(r: Report) -> str:
    """The same numbers as :func:`html_report`; the charts' lines are left out (said so)."""
    g = r.goodput

    def cell(v: object) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")

    def table(head: tuple[str, ...], rows: list[tuple]) -> list[str]:
        return [
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
            *("| " + " | ".join(cell(c) for c in row) + " |" for row in rows),
            "",
        ]

    lines = [
        f"# {cell(r.job)}",
        "",
        f"{cell(r.run_dir)}, {cell(r.state)}{' (live)' if r.live else ''}, from {clock(r.started)} "
        f"to {clock(r.ended or r.last_ts)}, {r.events:,} journal events.",
        "",
        "## Goodput",
        "",
        f"**{cell(describe(g))}** (wall {duration(g.get('wall_s'))})",
        "",
        *table(
            ("", "time", "share"), [(k, duration(v), f"{s * 100:.1f} %") for k, v, s, _ in goodput_rows(g)]
        ),
        "## Losses",
        "",
        "(charts in the HTML report: `trainctl report` without --md)",
        "",
        *table(
            ("loss", "first", "last", "min"),
            [(n, f"{ys[0]:.4g}", f"{ys[-1]:.4g}", f"{min(ys):.4g}") for n, (_, ys) in r.losses.items() if ys],
        ),
        "## Incidents",
        "",
        *(
            table(("when", "attempt", "kind", "diagnosis", "cost", "then"), _incident_rows(r))
            if r.incidents
            else ["none", ""]
        ),
        "## Presets",
        "",
        *table(
            ("from", "attempt", "preset", "why"),
            _preset_rows(r),
        ),
        "## Projected and actual end",
        "",
        *table(("", "when"), ends(r)),
        "## Checkpoints",
        "",
        *(
            table(
                ("when", "epoch", "batch", "kind", "usable", "path"),
                _checkpoint_rows(r),
            )
            if r.checkpoints
            else ["no checkpoint journaled", ""]
        ),
        "### Resumed from",
        "",
        *(
            table(("attempt", "when", "checkpoint", "how"), _resumed_rows(r))
            if _resumed_rows(r)
            else ["no restart resumed from a checkpoint", ""]
        ),
    ]
    return "\n".join(lines)
