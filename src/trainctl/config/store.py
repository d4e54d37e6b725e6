"""The preset store: where preset names are looked up, and how preset files are edited.

Read with :mod:`tomllib`; edited with :mod:`tomlkit` so comments and order survive;
written atomically, and only after validation.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from trainctl.config.preset import Preset, preset_from_text
from trainctl.config.validation import SAFE_NAME, ConfigError, read_text, show
from trainctl.core.statefile import write_atomic


def user_config_dir() -> Path:
    """``$TRAINCTL_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/trainctl`` or ``~/.config/trainctl``."""
    if os.environ.get("TRAINCTL_CONFIG_DIR"):
        return Path(os.environ["TRAINCTL_CONFIG_DIR"])
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "trainctl"


def _packaged_presets_dir() -> Path | None:
    try:
        return Path(str(resources.files("trainctl.presets")))
    except (ModuleNotFoundError, TypeError):
        return None


def preset_search_dirs(search_dirs: Sequence[Path] | None = None) -> list[Path]:
    """Where preset names are looked up, first match wins: ``search_dirs``, ``./presets``,
    the user's ``<config dir>/presets``, then the presets shipped with trainctl."""
    dirs = [Path(d) for d in search_dirs or ()]
    dirs += [Path("presets"), user_config_dir() / "presets"]
    packaged = _packaged_presets_dir()
    unique: list[Path] = []
    for d in dirs:
        # The shipped ones come last, also from inside the checkout (`./presets` there is
        # them): the user's copies (`trainctl presets edit`) shadow them.
        if not any(_same_dir(d, u) for u in unique) and not (packaged and _same_dir(d, packaged)):
            unique.append(d)
    if packaged is not None:
        unique.append(packaged)
    return unique


def is_shipped(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a preset shipped with trainctl (in its package: inside the
    checkout for an editable install), which `presets edit` never changes."""
    packaged = _packaged_presets_dir()
    return packaged is not None and _same_dir(Path(path).parent, packaged)


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return a == b


def list_presets(search_dirs: Sequence[Path] | None = None) -> list[Path]:
    """The preset file each name resolves to (earlier directories shadow later), by name."""
    found: dict[str, Path] = {}
    for directory in preset_search_dirs(search_dirs):
        if directory.is_dir():
            for path in sorted(directory.glob("*.toml")):
                found.setdefault(path.stem, path)
    return [found[name] for name in sorted(found)]


def is_path_ref(ref: str | os.PathLike[str]) -> bool:
    if isinstance(ref, os.PathLike):
        return True
    return "/" in ref or os.sep in ref or ref.endswith(".toml")


def load_preset(ref: str | os.PathLike[str], search_dirs: Sequence[Path] | None = None) -> Preset:
    """Load a preset by path (``ref`` contains ``/`` or ends with ``.toml``) or by name.

    Names are looked up in :func:`preset_search_dirs`; an unknown name raises
    :class:`ConfigError` listing the names that exist.
    """
    path: Path | None
    if is_path_ref(ref):
        path = Path(ref)
    else:
        if not ref:
            raise ConfigError("", "preset", "empty preset name")
        matches = [d / f"{ref}.toml" for d in preset_search_dirs(search_dirs)]
        path = next((m for m in matches if m.is_file()), None)
        if path is None:
            names = ", ".join(p.stem for p in list_presets(search_dirs)) or "none"
            where = ", ".join(str(d) for d in preset_search_dirs(search_dirs))
            raise ConfigError(
                "", "preset", f"no preset named {show(ref)}; available: {names} (looked in {where})"
            )
    return preset_from_text(read_text(path, str(path)), path)


def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    write_atomic(path, text, mode)


def save_preset_text(path: str | os.PathLike[str], text: str) -> Preset:
    """Validate ``text`` (refused with :class:`ConfigError`), then write it atomically."""
    path = Path(path)
    preset = preset_from_text(text, path)
    _atomic_write(path, text)
    return preset


def update_preset_text(text: str, changes: Mapping[str, Any], file: str | os.PathLike[str] = "") -> str:
    """Apply ``changes`` to preset text, keeping comments and order (tomlkit).

    ``changes`` maps a section name to ``{key: value}`` or a top-level key to a value;
    ``None`` removes a key.  Returns the new text; nothing is validated or written.
    """
    # imported here: editing is the agent's and the CLI's, never the trainer's (whose Python,
    # 3.8 for one, may not import the tomlkit trainctl runs with)
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        doc = tomlkit.parse(text)
    except TOMLKitError as exc:
        line = getattr(exc, "line", None)
        raise ConfigError(str(file), "", f"invalid TOML: {exc}", line) from None
    for key, value in changes.items():
        if isinstance(value, Mapping):
            table = doc.get(key)
            if table is None:
                if all(v is None for v in value.values()):
                    continue
                table = tomlkit.table()
                doc[key] = table
            for sub, sub_value in value.items():
                if sub_value is None:
                    table.pop(sub, None)
                else:
                    table[sub] = sub_value
        elif value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    return tomlkit.dumps(doc)


def update_preset_values(path: str | os.PathLike[str], changes: Mapping[str, Any]) -> str:
    """:func:`update_preset_text` on the file at ``path``; returns the new text (not written)."""
    path = Path(path)
    return update_preset_text(read_text(path, str(path)), changes, path)


def diff_text(old: str, new: str, path: str | os.PathLike[str]) -> str:
    """A unified diff from the saved ``old`` text to the edited ``new`` text."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"{path} (saved)",
        tofile=f"{path} (edited)",
    )
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )


def new_preset_from(
    src_path: str | os.PathLike[str], new_path: str | os.PathLike[str], name: str | None = None
) -> Preset:
    """Copy a preset, comments and all, to a new file; never overwrites.

    ``new_path`` is the new file, or an existing directory to hold ``<name>.toml``.
    The source is validated first; the copy starts with a "Copied from" comment.
    """
    src, dest = Path(src_path), Path(new_path)
    if dest.is_dir():
        if not name or not SAFE_NAME.match(name):
            raise ConfigError(
                str(dest),
                "name",
                f"a new preset needs a name of letters, digits, '.', '_' or '-' (got {show(name)})",
            )
        dest = dest / f"{name}.toml"
    if dest.exists():
        raise ConfigError(str(dest), "", "already exists; choose another name")
    text = read_text(src, str(src))
    preset_from_text(text, src)
    header = f"# Copied from {src.name}.\n"
    return save_preset_text(dest, header + text)
