"""What runs inside the user's interpreter runs on Python 3.8 to 3.13 (issue 41, item 3).

The bootstrap, ``trainctl.inside`` and everything they import are run on the interpreters
pyenv holds on these machines (``/root/.pyenv/versions``; CI machines are built the same):
the bootstrap attaches each integration to a script whose library is a version the
integration does not support (it says so once on the side channel, the script runs as
written), every module of ``trainctl.inside`` imports, and the trainctl modules that pulls in
are the ones ruff checks for Python 3.8 (``[tool.ruff.per-file-target-version]``).
"""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from trainctl.agent.zero_code import instrument_env
from trainctl.core import events as E

ROOT = Path(__file__).resolve().parents[2]
PYENV = Path("/root/.pyenv/versions")
VERSIONS = ("3.8.18", "3.9.18", "3.10.13", "3.12.1", "3.13.0")

FAKELIB = '__version__ = "0.1"\nprint("fakelib imported", flush=True)\n'
SCRIPT = """\
import sys
import fakelib
print("trained on", sys.version_info[:2], "with fakelib", fakelib.__version__, flush=True)
"""
# Each integration refuses fakelib 0.1 with its own words (and imports all it needs first).
REFUSALS = {
    "ultralytics": "Ultralytics 0.1 is outside the tested range",
    "transformers": "transformers 0.1 is outside the tested range",
    "lightning": "is outside the tested range",
}

# Run by the old interpreter with trainctl's lib and fallback on its path: imports every
# module of trainctl.inside; one that needs a library this interpreter lacks (numpy for the
# Ultralytics trainer) is listed as such, never as trainctl's own failure.
IMPORT_ALL = """\
import importlib, json, pkgutil, sys, traceback
import trainctl.inside as inside
out = {"imported": [], "lacks": {}, "failed": {}}
for m in pkgutil.iter_modules(inside.__path__):
    name = "trainctl.inside." + m.name
    try:
        importlib.import_module(name)
        out["imported"].append(name)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] == "trainctl":
            out["failed"][name] = traceback.format_exc()
        else:
            out["lacks"][name] = e.name
    except Exception:
        out["failed"][name] = traceback.format_exc()
out["files"] = sorted(
    getattr(mod, "__file__", None) or "" for n, mod in sys.modules.items() if n.split(".")[0] == "trainctl"
)
from trainctl.config.validation import ConfigError, parse_toml
try:
    out["toml"] = parse_toml('[dataloader]\\nworkers = 2\\n', "preset.toml")
except ConfigError as e:
    out["toml"] = "ConfigError: " + str(e)
print(json.dumps(out))
"""


def _python(version: str) -> str:
    python = PYENV / version / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"no Python {version} at {python} (pyenv holds it on the CI machines)")
    return str(python)


@pytest.fixture
def world(tmp_path):
    user = tmp_path / "user"
    (user / "fakelib").mkdir(parents=True)
    (user / "fakelib" / "__init__.py").write_text(FAKELIB)
    run = tmp_path / "run"
    run.mkdir()
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    return {"user": user, "run": run, "script": script}


def _env(world, side: Path, watch: dict[str, str] | None = None) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINCTL_", "PYTHON"))}
    base.update(
        PYTHONPATH=str(world["user"]), TRAINCTL_EVENTS_PATH=str(side), TRAINCTL_RUN_DIR=str(world["run"])
    )
    env = instrument_env(base, world["run"])
    if watch is not None:
        settings = json.loads(env["TRAINCTL_INSTRUMENT"])
        settings["watch"] = watch
        env["TRAINCTL_INSTRUMENT"] = json.dumps(settings)
    return env


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("integration", list(REFUSALS))
def test_the_bootstrap_attaches_on_an_old_python_and_an_unsupported_version_is_said_once(
    world, version, integration
):
    python = _python(version)
    side = world["run"] / f"side-{integration}.jsonl"
    side.write_text("")
    env = _env(world, side, watch={"fakelib": integration})
    r = subprocess.run([python, str(world["script"])], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    major, minor = version.split(".")[:2]
    assert f"trained on ({major}, {minor}) with fakelib 0.1" in r.stdout, r.stdout
    assert r.stderr == "", r.stderr
    infos = [E.decode(line) for line in side.read_text().splitlines()]
    assert [i.key for i in infos] == ["instrument.refused"], [(i.key, i.text) for i in infos]
    assert REFUSALS[integration] in infos[0].text and "console parsing" in infos[0].text, infos[0].text


@pytest.mark.parametrize("version", VERSIONS)
def test_every_inside_module_imports_on_an_old_python(world, version):
    python = _python(version)
    env = _env(world, world["run"] / "side.jsonl")
    settings = json.loads(env.pop("TRAINCTL_INSTRUMENT"))
    env["PYTHONPATH"] = os.pathsep.join([settings["path"], settings["fallback"]])
    r = subprocess.run(
        [python, "-c", IMPORT_ALL], env=env, capture_output=True, text=True, timeout=60, cwd=world["run"]
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["failed"] == {}, "\n".join(out["failed"].values())
    # only the vendored Ultralytics trainer needs a library (numpy) a bare interpreter lacks
    assert set(out["lacks"]) <= {"trainctl.inside.ultralytics_trainer"}, out["lacks"]
    assert "trainctl.inside.session" in out["imported"] and "trainctl.inside.spare" in out["imported"]
    # what it pulled in is what ruff checks for Python 3.8, module for module
    pkg = Path(settings["path"]) / "trainctl"
    loaded = {str(Path(f).relative_to(pkg)) for f in out["files"] if f}
    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["per-file-target-version"]
    checked = {k.removeprefix("src/trainctl/") for k, v in ruff.items() if v == "py38"}
    unchecked = {f for f in loaded if f not in checked and not f.startswith("inside/")}
    assert unchecked == set(), f"imported inside the trainer, not checked for py38 by ruff: {unchecked}"
    # a preset is read where tomli or a tomlkit for this Python is there, else said in one line
    toml = out["toml"]
    assert toml == {"dataloader": {"workers": 2}} or (
        isinstance(toml, str) and "needs tomli or tomlkit" in toml and "pip install tomli" in toml
    ), toml
