"""``trainctl scan LOGFILE``: a postmortem of a trainer's console log.

Reads the raw log (bytes, ``\\r`` frames and ANSI codes included) through the same
:class:`~trainctl.core.feed.OutputFeed` the agent uses (splitter, parser and warning
matcher), and reports the phases seen,
the first and last progress, the warnings, and where the run stopped.  ``--explain``
(each line and the reader that claimed it) is :mod:`trainctl.agent.scan_explain`.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trainctl.core.events import Phase, Progress, merged_progress
from trainctl.core.events import Warning as WarningEvent
from trainctl.core.feed import OutputFeed
from trainctl.core.sanitize import sanitize

TAIL_LINES = 20
CHUNK = 1 << 20


class Matcher(Protocol):
    """What scan needs from :class:`trainctl.core.signatures.WarningMatcher`."""

    def feed(self, line: str, now: float, source: str = "trainer") -> WarningEvent | None: ...

    def counts(self) -> dict[str, int]: ...


@dataclass(frozen=True)
class ProgressPoint:
    """One parsed progress line and where it was (1-based line number after splitting)."""

    line_no: int
    epoch: int | None
    epochs: int | None
    batch: int | None
    batches: int | None
    losses: dict[str, float] = field(default_factory=dict)
    rate: float | None = None


@dataclass(frozen=True)
class WarningSummary:
    """A warning id found in the log: how often, and its first line."""

    id: str
    severity: str
    count: int
    first_line: str
    advice: str
    first_line_no: int


@dataclass(frozen=True)
class ScanReport:
    path: str
    lines: int
    progress_lines: int
    phases: tuple[str, ...]
    first_progress: ProgressPoint | None
    last_progress: ProgressPoint | None
    last_phase: str | None
    finished: bool
    warnings: tuple[WarningSummary, ...]
    warnings_checked: bool
    lines_after_progress: int
    tail: tuple[str, ...]
    where: str


def _default_matcher() -> Matcher | None:
    try:
        from trainctl.core.signatures import Catalog, WarningMatcher
    except ImportError:
        return None
    return WarningMatcher(Catalog.load())


def scan_log(path: str | Path, matcher: Matcher | None = None) -> ScanReport:
    """Read the log at ``path`` and summarise it.  Raises OSError when it cannot be read.

    ``matcher`` defaults to the signature catalog's matcher; a matcher with a
    ``feed_progress(progress, now)`` method also sees every progress (NaN losses).
    Times are meaningless in a postmortem, so every line is fed with ``now=0.0``.
    """
    if matcher is None:
        matcher = _default_matcher()
    feed_progress = getattr(matcher, "feed_progress", None)
    # OutputFeed asks only feed() (and .last, when there) of its matcher: scan's Matcher is
    # enough, but core/feed.py annotates the concrete WarningMatcher
    feed = OutputFeed(matcher)  # type: ignore[arg-type]  # a Matcher does all OutputFeed asks
    scan = _Scan(matcher, feed_progress)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            for fed in feed.feed(chunk, 0.0):
                scan.line(fed.text, fed.events, fed.warning)
    for fed in feed.flush(0.0):
        scan.line(fed.text, fed.events, fed.warning)
    return scan.report(str(path), feed.phase)


class _Scan:
    """The running totals of one scan."""

    def __init__(self, matcher: Matcher | None, feed_progress: Any) -> None:
        self.matcher = matcher
        self.feed_progress = feed_progress
        self.n = 0
        self.progress_lines = 0
        self.phases: list[str] = []
        self.first: ProgressPoint | None = None
        self.last: ProgressPoint | None = None
        self.last_event: Progress | None = None
        self.first_warning: dict[str, tuple[WarningEvent, int]] = {}
        self.own_counts: dict[str, int] = {}
        self.after = 0
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)

    def line(self, line: str, events: tuple, warning: WarningEvent | None) -> None:
        self.n += 1
        progressed = False
        for ev in events:
            if isinstance(ev, Phase):
                self.phases.append(ev.phase)
            elif isinstance(ev, Progress):
                progressed = True
                self._progress(ev)
        if progressed:
            self.after = 0
            self.tail.clear()
        else:
            self.after += 1
            self.tail.append(line)
        self._warning(warning)

    def _progress(self, ev: Progress) -> None:
        self.progress_lines += 1
        merged = merged_progress(self.last_event, ev)  # a loss-only line keeps the counter
        self.last_event = merged
        self.last = ProgressPoint(
            self.n,
            merged.epoch,
            merged.epochs,
            merged.batch,
            merged.batches,
            dict(merged.losses),
            merged.rate,
        )
        if self.first is None:
            self.first = self.last
        if self.feed_progress is not None:
            self._warning(self.feed_progress(ev, 0.0))

    def _warning(self, w: WarningEvent | None) -> None:
        if w is None:
            return
        self.own_counts[w.id] = self.own_counts.get(w.id, 0) + 1
        self.first_warning.setdefault(w.id, (w, self.n))

    def report(self, path: str, last_phase: str | None) -> ScanReport:
        counts = self.matcher.counts() if self.matcher is not None else {}
        warnings = tuple(
            WarningSummary(
                id=w.id,
                severity=w.severity,
                count=max(counts.get(w.id, 0), self.own_counts[w.id]),
                first_line=w.text,
                advice=w.advice,
                first_line_no=line_no,
            )
            for w, line_no in sorted(self.first_warning.values(), key=lambda t: t[1])
        )
        finished = last_phase == "finished"
        return ScanReport(
            path=path,
            lines=self.n,
            progress_lines=self.progress_lines,
            phases=tuple(self.phases),
            first_progress=self.first,
            last_progress=self.last,
            last_phase=last_phase,
            finished=finished,
            warnings=warnings,
            warnings_checked=self.matcher is not None,
            lines_after_progress=self.after,
            tail=tuple(self.tail),
            where=_where(self.last, last_phase, finished, self.after, self.n),
        )


# ---------------------------------------------------------------------------- text


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _of(n: int | None, total: int | None) -> str:
    if n is None:
        return "?"
    return f"{n}/{total}" if total is not None else str(n)


def describe_progress(p: ProgressPoint) -> str:
    """``epoch 2/50, batch 4886/41163`` (parts the log did not show are left out)."""
    parts = []
    if p.epoch is not None:
        parts.append(f"epoch {_of(p.epoch, p.epochs)}")
    if p.batch is not None:
        parts.append(f"batch {_of(p.batch, p.batches)}")
    return ", ".join(parts) or "progress"


def describe_position(p) -> str:
    """``epoch 1, batch 200/1000, loss 2.1`` of a progress (a :class:`ProgressPoint` or a
    Progress event: what it shows)."""
    losses = _fmt_losses(p.losses)
    return describe_progress(p) + (f", {losses}" if losses else "")


def _where(last: ProgressPoint | None, phase: str | None, finished: bool, after: int, lines: int) -> str:
    if last is None:
        state = "finished" if finished else f"phase {phase or 'startup'}"
        return f"no training progress in {lines} lines ({state})"
    at = describe_progress(last).replace(", batch", " at batch")
    if last.losses:
        at += f", {_fmt_losses(last.losses)}"
    if finished:
        return f"finished; last progress in {at}"
    distance = (
        "the last line is a progress line"
        if after == 0
        else f"after the last progress line {_plural(after, 'line')} from the end"
    )
    return f"stopped in {at}, phase {phase or 'train'}, {distance}"


def _fmt_losses(losses: dict[str, float]) -> str:
    return " ".join(f"{k} {v:.4g}" for k, v in losses.items())


def _fmt_phases(phases: tuple[str, ...]) -> str:
    if not phases:
        return "none"
    if len(phases) <= 12:
        return " -> ".join(phases)
    return " -> ".join(phases[:6]) + f" -> ... ({len(phases) - 12} more) -> " + " -> ".join(phases[-6:])


def format_report(report: ScanReport) -> str:
    """The report as text for a terminal."""
    out = [
        f"scan of {report.path}",
        f"  lines:          {report.lines} ({report.progress_lines} progress)",
        f"  phases:         {_fmt_phases(report.phases)}",
    ]
    for label, p in (("first progress", report.first_progress), ("last progress", report.last_progress)):
        if p is not None:
            extra = [
                s for s in (_fmt_losses(p.losses), f"{p.rate:.3g} it/s" if p.rate is not None else "") if s
            ]
            out.append(
                f"  {label + ':':15s} {describe_progress(p)} (line {p.line_no})"
                + (f"; {'; '.join(extra)}" if extra else "")
            )
    out.append(f"  where:          {report.where}")
    if not report.warnings_checked:
        out.append("  warnings:       not checked (no signature catalog)")
    elif not report.warnings:
        out.append("  warnings:       none")
    else:
        out.append(f"  warnings:       {len(report.warnings)}")
        for w in report.warnings:
            times = f" x{w.count}" if w.count != 1 else ""
            out.append(f"    [{w.severity}] {w.id}{times} (first at line {w.first_line_no})")
            out.append(f"      > {sanitize(w.first_line)}")
            if w.advice:
                out.append(f"      advice: {w.advice}")
    if report.last_progress is not None and report.tail:
        n, shown = report.lines_after_progress, len(report.tail)
        out.append(
            f"  after the last progress line ({_plural(n, 'line')}"
            + (f", last {shown} shown" if n > shown else "")
            + "):"
        )
        out.extend(f"    | {sanitize(line)}" for line in report.tail)
    return "\n".join(out)


def json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # 'nan', 'inf', '-inf', as the event codec writes them
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def report_to_dict(report: ScanReport) -> dict[str, Any]:
    """The report as plain JSON-able data (non-finite losses as ``"nan"``/``"inf"``)."""
    return json_safe(asdict(report))


def fatal_found(report: ScanReport, section: dict[str, Any] | None = None) -> bool:
    """Whether the log (or the kernel log beside it) has a finding of severity fatal."""
    kernel = [] if section is None else section.get("timeline") or section.get("kernel") or []
    return any(w.severity == "fatal" for w in report.warnings) or any(
        f.get("severity") == "fatal" for f in kernel
    )


def main_scan(path: str, as_json: bool, kernel_log: str | None = None) -> int:
    """``trainctl scan PATH [--json]``: print the report; 0 when read, 1 when it has a fatal
    finding, 2 when unreadable."""
    p = Path(path)
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "not a regular file" if p.exists() else "no such file"
        print(
            f"trainctl scan: cannot read log file {path}: {what} (give the path of a trainer "
            f"console log, e.g. <run_dir>/train.log)",
            file=sys.stderr,
        )
        return 2
    try:
        matcher = _default_matcher()
    except ValueError as e:  # CatalogError: the message names the file and the key
        print(f"trainctl scan: {e}", file=sys.stderr)
        return 2
    try:
        report = scan_log(p, matcher=matcher)
    except OSError as e:
        print(f"trainctl scan: cannot read log file {path}: {e.strerror or e}", file=sys.stderr)
        return 2
    section = None
    if kernel_log is not None and matcher is not None:
        try:  # fresh matchers: each finding counted from its own file
            fresh = _default_matcher()
            assert fresh is not None  # the catalog imported for the trainer log above
            section = kernel_section(p, kernel_log, fresh)
        except OSError as e:
            print(f"trainctl scan: cannot read kernel log {kernel_log}: {e.strerror or e}", file=sys.stderr)
            return 2
    if as_json:
        out = report_to_dict(report)
        if section is not None:
            out["kernel"] = section
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(format_report(report))
        if section is not None:
            print(format_kernel_section(section))
    return 1 if fatal_found(report, section) else 0


# ---------------------------------------------------------------------- kernel logs

_MONTHS = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}
# dmesg -T: "[Mon Nov 24 13:02:11 2025] amdgpu ..."
_DMESG_T = re.compile(r"^\[[A-Z][a-z]{2} ([A-Z][a-z]{2}) +(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4})\] ")
# journalctl -k (short): "Nov 24 13:02:11 host kernel: ..."; short-iso: "2025-11-24T13:02:11+0100 host kernel: ..."
_JOURNAL = re.compile(r"^([A-Z][a-z]{2}) +(\d{1,2}) (\d\d):(\d\d):(\d\d) \S+ kernel: ")
_ISO = re.compile(r"^\[?(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)")


@dataclass(frozen=True)
class Finding:
    """One matched line: where it is, when (None: the line has no time) and what."""

    source: str  # "trainer" | "kernel"
    line: int  # 1-based line number in its file
    ts: float | None
    id: str
    severity: str
    text: str


def line_time(line: str, year: int | None = None) -> float | None:
    """The local time a log line starts with (dmesg -T, journalctl -k, ISO 8601 as Python
    logging writes it), or None.  A journalctl line has no year: ``year`` (default: this one)."""
    import datetime as dt
    import time as _time

    try:
        if m := _DMESG_T.match(line):
            mon, day, hh, mm, ss, yy = m.groups()
            return dt.datetime(int(yy), _MONTHS[mon], int(day), int(hh), int(mm), int(ss)).timestamp()
        if m := _JOURNAL.match(line):
            mon, day, hh, mm, ss = m.groups()
            return dt.datetime(
                year or _time.localtime().tm_year, _MONTHS[mon], int(day), int(hh), int(mm), int(ss)
            ).timestamp()
        if m := _ISO.match(line):
            y, mo, d, h, mi, s = map(int, m.groups())
            return dt.datetime(y, mo, d, h, mi, s).timestamp()
    except (KeyError, ValueError, OverflowError):
        return None
    return None


def findings(path: str | Path, source: str, matcher: Matcher, year: int | None = None) -> list[Finding]:
    """The signature matches of a trainer log or a saved kernel log (``source``), each with
    the time of its line, or else of the last timed line before it (None when none)."""
    out: list[Finding] = []
    last_ts: float | None = None
    splitter = OutputFeed(None).splitter
    n = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(CHUNK)
            texts = splitter.feed(chunk) if chunk else splitter.flush()
            for text in texts:
                n += 1
                ts = line_time(text, year)
                last_ts = ts if ts is not None else last_ts
                w = matcher.feed(text, 0.0, source)
                sig = getattr(matcher, "last", None)
                # a trainer's warnings once per id (and at 10, 100, ...); every kernel line
                hit = w if w is not None else sig if source == "kernel" else None
                if hit is not None:
                    out.append(
                        Finding(
                            source,
                            n,
                            last_ts,
                            hit.id,
                            hit.severity,
                            sanitize(text)[:300],
                        )
                    )
            if not chunk:
                break
    return out


def kernel_section(log: str | Path, kernel_log: str | Path, matcher: Matcher) -> dict[str, Any]:
    """The kernel log's findings next to the trainer log's: interleaved by time when both
    files carry timestamps, else listed apart (``interleaved`` says which)."""
    import datetime as dt

    trainer = findings(log, "trainer", matcher)
    year = next((dt.datetime.fromtimestamp(f.ts).year for f in trainer if f.ts is not None), None)
    kernel = findings(kernel_log, "kernel", matcher, year)
    both = any(f.ts is not None for f in trainer) and kernel and all(f.ts is not None for f in kernel)
    if both:
        merged = sorted(
            kernel + [f for f in trainer if f.ts is not None],
            key=lambda f: (f.ts, f.source != "trainer", f.line),
        )
        return {"kernel_log": str(kernel_log), "interleaved": True, "timeline": [asdict(f) for f in merged]}
    why = (
        "no kernel finding"
        if not kernel
        else "the kernel log has no timestamps (save it with `dmesg -T` or `journalctl -k`)"
        if any(f.ts is None for f in kernel)
        else "the trainer log has no timestamps"
    )
    return {
        "kernel_log": str(kernel_log),
        "interleaved": False,
        "why": why,
        "kernel": [asdict(f) for f in kernel],
    }


def format_kernel_section(section: dict[str, Any]) -> str:
    import time as _time

    out = [f"Kernel log {section['kernel_log']}:"]
    rows = section.get("timeline") if section["interleaved"] else section.get("kernel")
    if not section["interleaved"]:
        out.append(f"  kernel findings listed apart: {section['why']}")
    if not rows:
        out.append("  no kernel finding")
    for f in rows or ():
        when = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(f["ts"])) if f["ts"] else "-"
        out.append(
            f"  {when}  {f['source']:7} line {f['line']:<6} {f['severity'].upper():7} "
            f"{f['id']}: {f['text'][:160]}"
        )
    return "\n".join(out)
