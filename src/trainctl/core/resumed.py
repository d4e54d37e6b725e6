"""Where a restart resumed from, as `status`, the dashboard, the journal's text and the
report say it: read from the fields of the restart event (never from its text)."""

from __future__ import annotations

from typing import Any

from trainctl.core.events import Restart
from trainctl.core.projection_text import humanize_duration


def resumed(e: Restart) -> dict[str, Any]:
    """The restart's resume as data: ``from`` (what the next attempt is given, None: it
    starts over), ``source`` (the file the script wrote) and ``copy`` (trainctl's copy),
    the checkpoint's ``age_s`` and the batches ``redone``."""
    return {
        "attempt": e.attempt,
        "ts": e.ts,
        "from": e.resume_from,
        "source": e.resume_source,
        "copy": e.resume_copy,
        "age_s": e.resume_age_s,
        "redone": e.resume_redone,
    }


def resumed_phrase(d: dict[str, Any]) -> str:
    """'resumed from the copy C of F (written 2 m before, 40 batches redone)' and the like."""
    frm, source, copy = d.get("from"), d.get("source"), d.get("copy")
    if not frm:
        return "started over: no good checkpoint yet"
    if source and frm == copy:
        what = f"resumed from the copy {copy} of {source}"
    elif source:
        what = f"resumed from {source} (the script's own file" + (
            f"; a copy is kept as {copy})" if copy else ")"
        )
    else:
        what = f"resumed from {frm}"
    facts = []
    if isinstance(d.get("age_s"), (int, float)):
        facts.append(f"written {humanize_duration(float(d['age_s']))} before")
    if isinstance(d.get("redone"), int):
        facts.append(f"{d['redone']} batches redone")
    return what + (f" ({', '.join(facts)})" if facts else "")
