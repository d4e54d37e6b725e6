"""mkdocs hook: the site's home page is README.md, so the two never drift.

The README links to `docs/PAGE.md` and shows `docs/screenshots/...` (as GitHub renders it
from the repository's root); on the site those are `PAGE.md` and `screenshots/...`."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_as_home(text: str) -> str:
    """The README's text with its links made relative to docs/."""
    return text.replace("](docs/", "](")


def on_files(files: Files, config) -> Files:
    files.append(
        File.generated(config, "index.md", content=readme_as_home(README.read_text(encoding="utf-8")))
    )
    return files
