"""engine/ never draws: importing any engine module pulls in neither textual nor rich,
and the import-linter contract in pyproject.toml holds."""
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import trainctl.engine

ROOT = Path(__file__).resolve().parents[2]


def _engine_modules() -> list[str]:
    mods = ["trainctl.engine"]
    for info in pkgutil.walk_packages(trainctl.engine.__path__, "trainctl.engine."):
        mods.append(info.name)
    return mods


def test_engine_modules_import_without_textual_or_rich():
    mods = _engine_modules()
    assert "trainctl.engine.agent" in mods and "trainctl.engine.events" in mods
    code = ("import sys, importlib\n"
            f"for m in {mods!r}:\n"
            "    importlib.import_module(m)\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich', 'textual_plotext')"
            " or m.startswith('trainctl.tui'))\n"
            "print(bad); sys.exit(1 if bad else 0)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_linter_contract_holds(tmp_path):
    # The installed names are mapped from top-level folders (engine/ → trainctl.engine), which
    # import-linter cannot follow through the editable finder: give it the same tree as links.
    pkg = tmp_path / "trainctl"
    pkg.mkdir()
    for entry in (ROOT / "trainctl").iterdir():
        if entry.suffix == ".py":
            (pkg / entry.name).symlink_to(entry)
    for name in ("engine", "tui", "presets"):
        (pkg / name).symlink_to(ROOT / name)
    lint = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    r = subprocess.run([str(lint), "--no-cache", "--config", str(ROOT / "pyproject.toml")],
                       capture_output=True, text=True, timeout=120, cwd=str(tmp_path), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "KEPT" in r.stdout and "BROKEN" not in r.stdout
