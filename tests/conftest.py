"""Shared test setup: every test runs with private trainctl dirs, and nothing it starts survives it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # so tests can import tests.helpers.*


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """A short temporary base (``/tmp/tcXXXXXXXX``, fresh per session) unless ``--basetemp``
    is given: xdist puts each worker's temp dirs one level deeper (``popen-gwN``), and a run
    directory's ``agent.sock`` under pytest's default ``/tmp/pytest-of-USER/pytest-N/...``
    then passes the 108 bytes a Unix socket path may have.  Unique per session, so parallel
    sessions of other users of the machine never share one; removed when the session passes."""
    if hasattr(config, "workerinput") or config.option.basetemp:
        return  # an xdist worker gets its base from the controller (BASE/popen-gwN)
    import tempfile

    config.option.basetemp = tempfile.mkdtemp(prefix="tc", dir="/tmp")
    config._trainctl_short_basetemp = config.option.basetemp


def pytest_unconfigure(config):
    base = getattr(config, "_trainctl_short_basetemp", None)
    if base and getattr(config, "_trainctl_passed", False):
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def pytest_sessionfinish(session, exitstatus):
    session.config._trainctl_passed = exitstatus == 0


@pytest.fixture(autouse=True)
def _private_trainctl_dirs(tmp_path_factory, monkeypatch):
    base = tmp_path_factory.mktemp("trainctl-home")
    monkeypatch.setenv("TRAINCTL_CONFIG_DIR", str(base / "config"))
    monkeypatch.setenv("TRAINCTL_RUNS_DIR", str(base / "runs"))
    monkeypatch.setenv("TRAINCTL_DATA_DIR", str(base / "data"))
    monkeypatch.setenv("YOLO_OFFLINE", "1")
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(base / "yolo"))
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    # The helper scripts (tests/helpers/scripts) apply the preset themselves from its
    # TRAINCTL_* variables, their tests' own DataLoader settings on top; the tests of the
    # override of a plain script's DataLoaders (src/trainctl/inside/plain_torch.py) unset it.
    monkeypatch.setenv("TRAINCTL_LOADER_OVERRIDE", "off")
    # The demo cache is shared across tests (dataset generation is deterministic).
    monkeypatch.setenv(
        "TRAINCTL_CACHE_DIR", os.environ.get("TRAINCTL_TEST_CACHE", str(Path("/tmp") / "trainctl-test-cache"))
    )
    yield


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    """Fail a test that leaves a child process behind (after killing it, so CI never hangs)."""
    import time

    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    deadline = time.monotonic() + 3.0
    while True:
        left = [p for p in me.children(recursive=True) if p.pid not in before and _alive(p)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if left:
        desc = [f"{p.pid} {_cmd(p)}" for p in left]
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass
        pytest.fail(f"test left processes running: {desc}")


def _alive(p) -> bool:
    import psutil

    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cmd(p) -> str:
    try:
        return " ".join(p.cmdline())[:120]
    except Exception:  # noqa: BLE001 - a process that vanished or denies access is shown as '?'
        return "?"
