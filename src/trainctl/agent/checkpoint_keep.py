"""Before a restart of a command: a copy of the checkpoint it resumes from, in the run
directory (``checkpoints/script/<attempt>/<name>``, store/checkpoint_copy.py: a reflink
where the filesystem has it, else a copy), so a script that starts over and overwrites or
deletes its own file cannot destroy it.  ``{checkpoint}`` is then the copy (whole and
checked, and the script cannot write it); resume arguments without ``{checkpoint}`` leave
the script to read its own file.  The restart event says which file, which copy, its age
and the batches done since it (redone); a later restart falls back to a copy when the
script's own file is gone or torn."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path

from trainctl.core import events as E
from trainctl.core.checkpoint_names import SCRIPT_KIND
from trainctl.store.checkpoint_accept import accept_script_checkpoint
from trainctl.store.checkpoint_copy import keep_copy
from trainctl.store.journal import read_events
from trainctl.store.paths import RunFiles
from trainctl.store.spec import RunSpec

KEEP = 2  # copies kept (the newest ones)
INFO_KEY = "checkpoints.kept"


def copies_dir(files: RunFiles) -> Path:
    return files.checkpoints / "script"


@dataclasses.dataclass(frozen=True)
class Kept:
    """What a restart resumes from: ``resume_from`` (the copy or the script's own file),
    ``source`` (the file the script wrote), ``copy`` (trainctl's), the checkpoint's
    ``age_s``, and ``said``: what to journal as infos."""

    resume_from: str | None
    source: str | None = None
    copy: str | None = None
    age_s: float | None = None
    said: tuple[str, ...] = ()

    def restart_fields(self, redone: int | None) -> dict:
        """The fields of the restart event (``redone``: batches done since the checkpoint)."""
        if self.source is None:
            return {}
        return {
            "resume_source": self.source,
            "resume_copy": self.copy,
            "resume_age_s": self.age_s,
            "resume_redone": redone,
        }


def _journaled(files: RunFiles) -> tuple[dict[str, str], set[str]]:
    """(the copies earlier restarts kept that are still there -> the file each is of,
    newest first; the checkpoints found on disk, written by the script)."""
    copies: dict[str, str] = {}
    written: set[str] = set()
    try:
        events = list(read_events(files.events))
    except OSError:
        return copies, written
    for ev in reversed(events):
        if isinstance(ev, E.Restart) and ev.resume_copy and ev.resume_source:
            if os.path.exists(ev.resume_copy):
                copies.setdefault(ev.resume_copy, ev.resume_source)
        elif isinstance(ev, E.Checkpoint) and ev.kind == SCRIPT_KIND:
            written.add(ev.path)
    return copies, written


def kept_copies(files: RunFiles) -> dict[str, str]:
    """The copies earlier restarts kept that are still there -> the file each is of, newest first."""
    return _journaled(files)[0]


def _same(a: Path, b: Path) -> bool:
    """``b`` is a copy of ``a`` as ``a`` is now (size and mtime of each file)."""

    def files(p: Path) -> list[tuple[str, int, int]]:
        if not p.is_dir():
            st = p.stat()
            return [("", st.st_size, st.st_mtime_ns)]
        return sorted(
            (
                os.path.relpath(os.path.join(d, n), p),
                (st := os.stat(os.path.join(d, n))).st_size,
                st.st_mtime_ns,
            )
            for d, _dirs, names in os.walk(p)
            for n in names
        )

    try:
        return files(a) == files(b)
    except OSError:
        return False


def keep_for_restart(spec: RunSpec, files: RunFiles, chosen: str | None, attempt: int) -> Kept:
    """The copy of ``chosen`` (the checkpoint the resume rule picked) that attempt
    ``attempt`` resumes from, made now (or an earlier one of the same file, unchanged)."""
    if chosen is None:
        return Kept(None)
    path = Path(chosen) if os.path.isabs(chosen) else Path(spec.cwd) / chosen
    placeholder = any("{checkpoint}" in a for a in spec.resume_args)
    age = _age(path)
    earlier, written = _journaled(files)
    if str(path) not in written and not path.is_relative_to(files.dir):
        return Kept(chosen)  # one the trainer reported (its own, or a rescue save): as it is
    if path.is_relative_to(files.dir):  # a copy an earlier restart kept (its file is gone or torn)
        source = earlier.get(str(path))
        note = f"resuming from the copy {path} of {source}: the script's own file is gone or no longer whole"
        return Kept(str(path), source, str(path), age, (note,)) if source else Kept(chosen)
    copy = next((Path(c) for c, src in earlier.items() if src == str(path) and _same(path, Path(c))), None)
    said: list[str] = []
    if copy is None:
        copy = copies_dir(files) / str(attempt) / path.name
        try:
            if copy.exists() or copy.is_symlink():  # an attempt's copy from an earlier agent
                _remove(copy)
            how = keep_copy(path, copy)
        except OSError as e:
            said.append(f"no copy of {path} kept: {e}; resuming from the file itself")
            return Kept(chosen, str(path), None, age, tuple(said))
        trusted = spec.trusted_checkpoints
        if os.path.realpath(path) in trusted:  # the user trusted the file: its copy too
            trusted = [*trusted, os.path.realpath(copy)]
        verdict = accept_script_checkpoint(copy, trusted)
        if not verdict.usable:  # the script wrote it again meanwhile
            said.append(f"the copy of {path} is not whole ({verdict.detail}); resuming from the file itself")
            _remove(copy)
            return Kept(chosen, str(path), None, age, tuple(said))
        said.append(f"kept a copy of {path} ({how}) as {copy}")
        _prune(files)
    use = str(copy) if placeholder else chosen
    which = "the copy" if placeholder else "the script's own file (its resume arguments name no {checkpoint})"
    said.append(f"attempt {attempt} resumes from {which}: {use}")
    return Kept(use, str(path), str(copy), age, tuple(said))


def _age(path: Path) -> float | None:
    try:
        return max(0.0, time.time() - path.stat().st_mtime)
    except OSError:
        return None


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def _prune(files: RunFiles) -> None:
    """The :data:`KEEP` newest attempts' copies stay."""
    try:
        numbered = sorted((int(d.name), d) for d in copies_dir(files).iterdir() if d.name.isdigit())
    except OSError:
        return
    for _n, d in numbered[:-KEEP]:
        _remove(d)
