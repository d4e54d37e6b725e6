"""``trainctl scan --explain LOGFILE``: each line of a trainer's console log, the reader of
:class:`~trainctl.core.parse.ConsoleParser` that claimed it, and what it read.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainctl.agent.scan import CHUNK, ProgressPoint, describe_progress, json_safe
from trainctl.core.events import Progress
from trainctl.core.feed import OutputFeed
from trainctl.core.sanitize import sanitize


@dataclass(frozen=True)
class Explained:
    """One console line and what the parser made of it: ``parser`` names the reader that
    claimed it (None: no reader did), ``events`` the progress/phase events it gave."""

    line_no: int
    text: str
    parser: str | None
    events: tuple[dict[str, Any], ...]


def explain_log(path: str | Path, progress: dict | None = None) -> Iterator[Explained]:
    """Each line of the log at ``path``, with the reader that claimed it and what it read.
    ``progress``: a job's ``[progress]`` table (its pattern is tried first).  Raises OSError."""
    feed = OutputFeed(None, progress=progress)
    parser = feed.parser
    n = 0

    def lines(texts: list[str]) -> Iterator[Explained]:
        nonlocal n
        for text in texts:
            n += 1
            parser.last_format = None
            events = parser.feed(text, 0.0)
            yield Explained(n, text, parser.last_format, tuple(_event_dict(e) for e in events))

    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            yield from lines(feed.splitter.feed(chunk))
    yield from lines(feed.splitter.flush())


def _event_dict(ev: Any) -> dict[str, Any]:
    if isinstance(ev, Progress):
        d: dict[str, Any] = {
            "type": "progress",
            "epoch": ev.epoch,
            "epochs": ev.epochs,
            "batch": ev.batch,
            "batches": ev.batches,
            "losses": dict(ev.losses),
        }
        if ev.rate is not None:
            d["rate"] = ev.rate
        if ev.rank is not None:
            d["rank"] = ev.rank
        return json_safe(d)
    return {"type": "phase", "phase": ev.phase}


def format_explained(e: Explained, width: int = 100) -> str:
    """``  12 timm            epoch 3, batch 100/1251; loss 6.91  | Train: 3 [ 100/1251 ...``"""
    said = []
    for ev in e.events:
        if ev["type"] == "phase":
            said.append(f"phase {ev['phase']}")
        else:
            p = ProgressPoint(e.line_no, ev["epoch"], ev["epochs"], ev["batch"], ev["batches"])
            losses = " ".join(
                f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in ev["losses"].items()
            )
            said.append(describe_progress(p) + (f"; {losses}" if losses else ""))
    if e.parser is not None and not said:
        said.append("context")  # an "Epoch 2/10" or Ultralytics header line: read, no event
    text = sanitize(e.text)
    if len(text) > width:
        text = text[: width - 1] + "…"
    return f"{e.line_no:6d} {e.parser or '-':15s} {'; '.join(said) or '-':40s} | {text}"


def main_explain(path: str, as_json: bool, job: str | None = None) -> int:
    """``trainctl scan --explain LOG [--json] [--job FILE]``: each line, the reader that
    claimed it and what it read (JSON: one object a line)."""
    progress = None
    if job is not None:
        from trainctl.config import ConfigError, load_job

        try:
            progress = load_job(job).progress
        except ConfigError as e:
            print(f"trainctl scan: {e}", file=sys.stderr)
            return 2
    if not Path(path).is_file():
        print(f"trainctl scan: cannot read log file {path}: not a regular file", file=sys.stderr)
        return 2
    try:
        for ex in explain_log(path, progress):
            if as_json:
                print(
                    json.dumps(
                        {"line": ex.line_no, "parser": ex.parser, "events": list(ex.events), "text": ex.text},
                        ensure_ascii=False,
                    )
                )
            else:
                print(format_explained(ex))
    except BrokenPipeError:
        raise  # the reader of our output left (`| head`): the CLI ends quietly
    except OSError as e:
        print(f"trainctl scan: cannot read log file {path}: {e.strerror or e}", file=sys.stderr)
        return 2
    return 0
