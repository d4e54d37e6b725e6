"""The documentation: the site builds with no broken link or anchor and every page in its nav
(`mkdocs build --strict`), docs/internals.md's layers are pyproject's import-linter layers in
order, the README stays short and is the site's home page, and its job file loads."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from trainctl.config import load_job

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 150


def pyproject_layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers" and c.get("containers") == ["trainctl"]]
    return [" | ".join(part.strip() for part in layer.split("|")) for layer in layers["layers"]]


def internals_layers() -> list[str]:
    """The layers docs/internals.md lists: in its "## Layers" section, the lines that start
    with "- `folder`" or "- `a | b`" (then the layer's role)."""
    text = (ROOT / "docs" / "internals.md").read_text(encoding="utf-8")
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    return [m.group(1) for m in re.finditer(r"^- `([^`]+)`:", section, re.MULTILINE)]


def test_internals_lists_the_layers_of_pyproject_in_order():
    documented = internals_layers()
    assert documented, "docs/internals.md has no layer list in its ## Layers section"
    assert documented == pyproject_layers()


def test_every_folder_of_the_package_is_a_layer_and_every_layer_a_folder():
    package = ROOT / "src" / "trainctl"
    folders = {p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    folders -= {"presets"}  # data: the shipped presets, no code
    named = {name.strip() for layer in pyproject_layers() for name in layer.split("|")}
    assert folders == named - {"__main__"}


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def test_the_readme_links_only_to_what_exists():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if "://" not in t]
    assert local, "the README links to no page"
    assert [t for t in local if not (ROOT / t).exists()] == []


def test_the_readme_tour_job_file_is_a_valid_job(tmp_path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    example = readme.split("## A five-minute tour", 1)[1].split("```toml", 1)[1].split("```", 1)[0]
    (tmp_path / "trainctl.toml").write_text(example)
    job = load_job(tmp_path / "trainctl.toml")
    assert (job.kind, job.preset, job.fallback, job.resume_args) == (
        "command",
        "A",
        "B",
        ("--resume", "{checkpoint}"),
    )
    assert job.load_preset().dataloader.workers == 2 and job.load_fallback().dataloader.workers == 0


def test_the_site_builds_strictly(tmp_path):
    """Every page in the nav, no broken link or anchor, the README as the home page."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip(
            "mkdocs and mkdocs-material are not installed (they come with the test extra: "
            "pip install -e '.[test]')"
        )
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "five-minute tour" in home and "screenshots/dashboard.svg" in home
    for page in (
        "job-file",
        "zero-code",
        "torchrun",
        "slurm",
        "alerts",
        "remote",
        "dashboard",
        "cli",
        "troubleshooting",
        "internals",
        "benchmarks",
    ):
        assert (site / page / "index.html").exists(), page
