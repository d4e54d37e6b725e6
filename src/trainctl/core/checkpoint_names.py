"""Which written file belongs to a checkpoint a script saved itself, by its path below the
run's working directory: the job's ``checkpoints`` globs, or else the names that look like
checkpoints (``*.pt``, ``*.pth``, ``*.pth.tar``, ``*.ckpt``, ``*.safetensors`` files, and
``checkpoint-N/`` style folders, which are one checkpoint as a whole)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from fnmatch import fnmatchcase

SCRIPT_KIND = "script"  # the ``kind`` of a checkpoint event for a checkpoint found on disk
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".pth.tar", ".ckpt", ".safetensors")
CHECKPOINT_FOLDER = re.compile(r"(checkpoint|ckpt|step|global_step)[-_]?\d+")
# Folders never looked into: tools' and environments' own (a venv's thousands of folders)
SKIPPED_FOLDERS = frozenset({"__pycache__", "node_modules", "site-packages", "wandb", "mlruns"})


def skipped_folder(name: str) -> bool:
    """A folder below the working directory that holds no checkpoint of the script's."""
    return name.startswith(".") or name in SKIPPED_FOLDERS


def _match(parts: Sequence[str], pattern: Sequence[str]) -> bool:
    """``parts`` (a path's segments) against ``pattern``'s; ``**`` is any number of them."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_match(parts[i:], pattern[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], pattern[0]) and _match(parts[1:], pattern[1:])


class CheckpointNames:
    """``globs`` (the job's ``checkpoints``; empty: the default names)."""

    def __init__(self, globs: Sequence[str] = ()) -> None:
        self.globs = [tuple(p for p in g.strip("/").split("/") if p not in ("", ".")) for g in globs]

    def owner(self, rel: str) -> str | None:
        """The checkpoint that the file at ``rel`` (relative, with ``/``) is or is part of:
        itself, or the outermost folder above it that matches; None: no checkpoint."""
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if self.globs:
            for end in range(1, len(parts) + 1):
                if any(_match(parts[:end], g) for g in self.globs):
                    return "/".join(parts[:end])
            return None
        for end in range(1, len(parts)):
            if CHECKPOINT_FOLDER.fullmatch(parts[end - 1]):
                return "/".join(parts[:end])
        if parts and parts[-1].endswith(CHECKPOINT_SUFFIXES) and not parts[-1].startswith("."):
            return "/".join(parts)
        return None
