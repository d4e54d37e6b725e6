"""Is a checkpoint that a script wrote itself good to resume from?  The one place where
such a file or folder is accepted (found on disk during the run, or trainctl's copy of it
before a restart); nothing here unpickles it (store/checkpoint_verify.py reads it)."""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

from trainctl.core.checkpoint_names import CHECKPOINT_SUFFIXES
from trainctl.store.checkpoint_gate import script_checkpoint_refusal
from trainctl.store.checkpoint_verify import BAD, OK, UNVERIFIED, Verdict, checkpoint_dir_kinds, verify_path


def _folder(d: Path) -> Verdict:
    """A folder that is neither a Hugging Face nor a DeepSpeed checkpoint, as a whole:
    every checkpoint file in it whole (one torn one refuses the folder)."""
    files = sorted(
        Path(dirpath) / n for dirpath, _dirs, names in os.walk(d) for n in names if not n.startswith(".")
    )
    checked = [verify_path(f) for f in files if f.name.endswith((*CHECKPOINT_SUFFIXES, ".bin"))]
    if bad := [v for v in checked if v.status == BAD]:
        return Verdict(d, BAD, f"{bad[0].path.relative_to(d)}: {bad[0].detail}")
    if not checked:
        return Verdict(
            d, UNVERIFIED, f"cannot verify: a folder of {len(files)} files, none of a known format"
        )
    partial = [v for v in checked if not v.ok]
    detail = f"a folder of {len(files)} files, {len(checked) - len(partial)} checkpoint files complete"
    return Verdict(d, UNVERIFIED if partial else OK, detail)


def accept_script_checkpoint(path: Path, trusted: Collection[str] = ()) -> Verdict:
    """The verdict on a checkpoint a script saved itself: ``usable`` = it may be resumed
    from.  A folder is checked as a whole, a file's pickle is scanned, never run; a pickle
    that imports a global that executes code (the checkpoint gate's looser rule, for files the
    script loads itself) is BAD, the global named, unless ``trusted`` (resolved paths, the
    user's ``--trust-checkpoint``) holds it."""
    if os.path.realpath(path) not in trusted:  # first: code to run outweighs a torn tail
        why = script_checkpoint_refusal(path)
        if why is not None:
            return Verdict(path, BAD, why)
    verdict = verify_path(path)
    if verdict.status == UNVERIFIED and path.is_dir() and checkpoint_dir_kinds(path) == (False, False):
        return _folder(path)
    return verdict
