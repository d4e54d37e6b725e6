"""What an integration gets from the agent, inside the trainer (read from its environment):
the run directory, the attempt, the preset (applied natively), the checkpoint a restart
resumes from, and the side channel.  ``TrainerSession.from_env()`` once, in ``attach``."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainctl.config import ConfigError, Preset, load_preset
from trainctl.config.kinds import CHECKPOINT_EVERY_S
from trainctl.core import events as E
from trainctl.inside import CHECKPOINT_EVERY_ENV, PRESET_FILE_ENV, RESUME_ENV
from trainctl.inside.ultralytics_runner import EventSink


@dataclass
class TrainerSession:
    sink: EventSink  # the side channel (TRAINCTL_EVENTS_PATH); emit(event)
    run_dir: Path | None  # TRAINCTL_RUN_DIR
    attempt: int  # TRAINCTL_ATTEMPT (1-based)
    preset: Preset | None  # TRAINCTL_PRESET_FILE, loaded and validated
    resume_from: Path | None  # TRAINCTL_RESUME_FROM: set on a restart the agent resumes
    checkpoint_every: float  # TRAINCTL_CHECKPOINT_EVERY seconds (0: no periodic saves)

    @property
    def checkpoint_dir(self) -> Path | None:
        """Where trainctl keeps its verified copies and mid-epoch saves."""
        return self.run_dir / "checkpoints" if self.run_dir is not None else None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> TrainerSession:
        """Raises ConfigError when the preset file does not load (attach then refuses)."""
        run_dir = environ.get("TRAINCTL_RUN_DIR", "")
        preset_file = environ.get(PRESET_FILE_ENV, "")
        resume = environ.get(RESUME_ENV, "")
        try:
            every = max(0.0, float(environ.get(CHECKPOINT_EVERY_ENV, "")))
        except ValueError:
            every = CHECKPOINT_EVERY_S
        try:
            attempt = int(environ.get("TRAINCTL_ATTEMPT", "1"))
        except ValueError:
            attempt = 1
        return cls(
            sink=EventSink.from_env(environ),
            run_dir=Path(run_dir) if run_dir else None,
            attempt=attempt,
            preset=load_preset(preset_file) if preset_file else None,
            resume_from=Path(resume) if resume else None,
            checkpoint_every=every,
        )

    def info(self, text: str, key: str) -> None:
        self.sink.emit(E.Info(time.time(), text, key))

    def warn_overridden(
        self,
        library: str,
        changed: Mapping[str, tuple[Any, ...]],
        also: Mapping[str, tuple[Any, ...]] | None = None,
        also_in: str = "",
        sets: str = "",
    ) -> None:
        """The one warning (id ``trainctl.preset_overrides``) saying, in words, every change
        the preset makes to the script's own call: ``changed`` = key -> (the script's value,
        the preset's[, where the first came from when the script did not pass it, e.g.
        "Ultralytics' default"]); ``also`` the same for what it sets elsewhere
        (``also_in``: "Ultralytics' DataLoaders"); ``sets``: what it sets in the process
        whatever the script had (threads, environment)."""
        if not changed and not also and not sets:
            return
        name = self.preset.name if self.preset is not None else "?"
        parts = []
        if changed:
            parts.append(f"the script's {library}: {said_changes(changed)}")
        if also:
            parts.append(f"{also_in}: {said_changes(also)}")
        said = [f"changes {'; and '.join(parts)}"] if parts else []
        if sets:
            said.append(f"sets {sets}")
        text = f"preset {name} " + "; and ".join(said)
        self.sink.emit(
            E.Warning(
                time.time(),
                "trainctl.preset_overrides",
                "warning",
                text,
                f"Under trainctl the preset wins: `trainctl presets edit {name}` changes what it sets.",
                source="trainctl",
            )
        )


def said_changes(changed: Mapping[str, tuple[Any, ...]]) -> str:
    """'workers 2 -> 0, val True (Ultralytics' default) -> False'."""
    out = []
    for key, (old, new, *whence) in changed.items():
        where = f" ({whence[0]})" if whence and whence[0] else ""
        out.append(f"{key} {old!r}{where} -> {new!r}")
    return ", ".join(out)


def script_is_guarded(source: str) -> bool:
    """Whether a script's top level has an ``if __name__ == "__main__":`` block."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return True  # not ours to judge: leave it as it is
    for node in tree.body:
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and any(
                isinstance(n, ast.Name) and n.id == "__name__"
                for n in (node.test.left, *node.test.comparators)
            )
        ):
            return True
    return False


def keep_spawned_workers_out_of_main(session: TrainerSession) -> bool:
    """A preset whose DataLoader workers start with spawn or forkserver, and a script with no
    ``if __name__ == "__main__":`` guard: each worker would run the script's training again
    (multiprocessing runs the main script in a spawned child).  Mark ``__main__`` so that
    spawned children skip it (what they unpickle is the library's and trainctl's, importable
    by name); said in an info line.  True when it did."""
    import sys

    preset = session.preset
    if preset is None or preset.dataloader.multiprocessing_context not in ("spawn", "forkserver"):
        return False
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or getattr(main, "__spec__", None) is not None or not path:
        return False  # run with -m: children import it by name, guarded or not, as usual
    try:
        source = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    if script_is_guarded(source):
        return False
    from importlib.machinery import ModuleSpec

    main.__spec__ = ModuleSpec("__main__", None)  # multiprocessing.spawn skips a "__main__" name
    session.info(
        f"preset {preset.name} starts DataLoader workers with "
        f"{preset.dataloader.multiprocessing_context} and {Path(path).name} has no "
        '`if __name__ == "__main__":` guard: the workers do not run the script again '
        "(so objects defined in the script cannot reach them)",
        "instrument.spawn_main",
    )
    return True


__all__ = ["TrainerSession", "ConfigError", "keep_spawned_workers_out_of_main", "script_is_guarded"]
