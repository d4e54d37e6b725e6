"""Small text formatters shared by the widgets (pure; local time via ``time.localtime``)."""

from __future__ import annotations

from trainctl.core.projection_text import humanize_duration


def duration(seconds: float | None) -> str:
    """``2 h 5 m``, ``4 m 9 s``, ``12 s``; ``—`` when unknown (the engine's wording)."""
    return "—" if seconds is None else humanize_duration(seconds)


def size(n: float | None) -> str:
    """Bytes as ``812 MiB`` / ``2.1 GiB``; ``—`` when unknown."""
    if n is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit in ("B", "KiB", "MiB") else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def money(x: float | None, currency: str = "$") -> str:
    return "—" if x is None else f"{currency}{x:,.2f}"


def count(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


def home_path(path: str) -> str:
    """A path with the home directory as ``~``."""
    import os

    home = os.path.expanduser("~").rstrip("/")
    return "~" + path[len(home) :] if home and (path == home or path.startswith(home + "/")) else path


def percent(x: float | None) -> str:
    return "—" if x is None else f"{x:.0f}%"


def path(p: str | None, width: int = 60) -> str:
    """A path for a border: ``~`` for the home directory, the start cut (``…/runs/detect/train``)
    past ``width`` characters."""
    if not p:
        return ""
    import os

    home = os.path.expanduser("~").rstrip("/")
    if home and (p == home or p.startswith(home + "/")):
        p = "~" + p[len(home) :]
    return p if len(p) <= width else "…" + p[-(width - 1) :]
