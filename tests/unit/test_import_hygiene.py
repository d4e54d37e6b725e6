"""Below the screen nothing draws: importing any module outside tui/ and cli/ pulls in
neither textual nor rich; and the import-linter contracts in pyproject.toml hold, run as a
person runs them (`lint-imports` in the checkout)."""

import pkgutil
import subprocess
import sys
from pathlib import Path

import trainctl

ROOT = Path(__file__).resolve().parents[2]
SCREENLESS = ("core", "config", "store", "holder", "system", "inside", "client", "alerts", "agent", "hosts")


def _screenless_modules() -> list[str]:
    mods = []
    for info in pkgutil.walk_packages(trainctl.__path__, "trainctl."):
        if info.name.split(".")[1] in SCREENLESS:
            mods.append(info.name)
    return mods


def test_modules_below_the_screen_import_without_textual_or_rich():
    mods = _screenless_modules()
    assert "trainctl.agent" in mods and "trainctl.core.events" in mods
    code = (
        "import sys, importlib\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich', 'textual_plotext')"
        " or m.startswith('trainctl.tui'))\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_linter_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(lint), "--no-cache"], capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "KEPT" in r.stdout and "BROKEN" not in r.stdout
