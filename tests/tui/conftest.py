"""Fixtures for the TUI tests: a FakeAgent over the journal fixture, a fixed clock, UTC."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tui_fakes import FakeAgent, replay_journal

from trainctl.core.events import Event
from trainctl.tui.app import TrainctlApp

ROOT = Path(__file__).resolve().parents[2]
RUN_DIR = "/home/ana/runs/yolo-rocm-20251115"
HELLO = {
    "version": "0.1.0",
    "job": "yolo-rocm",
    "run_dir": RUN_DIR,
    "host": "gpu-box",
    "state": "RUNNING",
    "auto_recover": True,
    "preset": "B",
    "fallback": "B",
}


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch):
    """Local time is UTC, so dates in the panels (and snapshots) do not move."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def journal() -> list[Event]:
    return replay_journal()


@pytest.fixture
def presets(tmp_path: Path) -> dict[str, Path]:
    folder = tmp_path / "presets"
    folder.mkdir()
    out = {}
    for name in ("A", "B"):
        out[name] = Path(
            shutil.copy(ROOT / "src" / "trainctl" / "presets" / f"{name}.toml", folder / f"{name}.toml")
        )
    return out


@pytest.fixture
def agent(journal: list[Event], presets: dict[str, Path]) -> FakeAgent:
    return FakeAgent(journal, dict(HELLO), presets, shown_dir=f"{RUN_DIR}/presets")


@pytest.fixture
def make_app(agent: FakeAgent, journal: list[Event]) -> Callable[..., TrainctlApp]:
    now = journal[-1].ts + 2.0

    def make(**kwargs: object) -> TrainctlApp:
        kwargs.setdefault("clock", lambda: now)
        return TrainctlApp(agent.client, **kwargs)  # type: ignore[arg-type]

    return make
