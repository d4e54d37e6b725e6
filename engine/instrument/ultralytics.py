"""The Ultralytics integration: a plain script's ``YOLO(...).train(...)`` gets what the
built-in runner (engine/runners/ultralytics.py) gives a job file, through the same code.

``attach`` wraps ``ultralytics.engine.model.Model.train`` (every YOLO task's); each call then
* applies the preset natively: its ``[train]`` and ``workers`` replace what the script
  passed (a warning names each key it changed), its DataLoader keywords reach Ultralytics'
  loaders (:func:`~trainctl.engine.runners.ultralytics.install_loader`), its threads are
  kept (the runner's callbacks);
* adds the runner's callbacks (phases, structured progress, the verified ``last_good.pt``),
  save on request and, on one device, the trainer class with mid-epoch saves and resume;
* on a restart (``TRAINCTL_RESUME_FROM``, the checkpoint the agent chose by the runner's
  rule), the first call resumes from it: ``resume=<checkpoint>``, which Ultralytics reads
  its own training arguments from.
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

from ..config import ConfigError
from ..runners.ultralytics import (install_loader, mid_epoch_supported, preset_train_args, resume_plan,
                                   supervise_model)
from . import FAILED_KEY, Refused
from .session import TrainerSession, keep_spawned_workers_out_of_main

TESTED = ("8.3.", "8.4.")   # Ultralytics versions the runner's callbacks and trainer classes know


def tested(version: str) -> bool:
    return version.startswith(TESTED)


def attach(module: Any) -> str:
    version = str(getattr(module, "__version__", "unknown"))
    if not tested(version):
        raise Refused(f"Ultralytics {version} is outside the tested range ({' or '.join(v + 'x' for v in TESTED)})")
    try:
        session = TrainerSession.from_env()
    except ConfigError as e:
        raise Refused(f"the preset does not load: {e}") from None
    from ultralytics.engine.model import Model
    original = Model.train
    if getattr(original, "_trainctl", None) is not None:
        return f"ultralytics {version}"
    plan = TrainPlan(session, version)

    @functools.wraps(original)
    def train(self: Any, trainer: Any = None, **kwargs: Any) -> Any:
        return plan.train(original, self, trainer, kwargs)

    train._trainctl = plan   # type: ignore[attr-defined]
    Model.train = train
    return f"ultralytics {version}"


class TrainPlan:
    """What one script's train calls become under trainctl."""

    def __init__(self, session: TrainerSession, version: str) -> None:
        self.session = session
        self.version = version
        self.resume_from = session.resume_from   # for the first call only

    def arguments(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The script's keywords with the preset's over them (the changes warned about)."""
        preset_args = preset_train_args(self.session.preset)
        changed = {k: (kwargs[k], v) for k, v in preset_args.items() if k in kwargs and kwargs[k] != v}
        self.session.warn_overridden("model.train()", changed)
        return {**kwargs, **preset_args}

    def resume(self, kwargs: dict[str, Any]) -> bool:
        """Rewrite the call to resume from the agent's checkpoint; False: nothing is left to
        train (the checkpoint is of a finished run)."""
        ckpt, self.resume_from = self.resume_from, None
        if ckpt is None:
            return True
        ckpt = Path(ckpt).expanduser().absolute()
        sink = self.session.sink
        status = resume_plan(sink, ckpt, mid_epoch_supported(sink, self.version))
        if status == 0:
            return False
        if status is None:   # else resume_plan said why not: training starts over
            kwargs["resume"] = str(ckpt)
        return True

    def train(self, original: Any, model: Any, trainer: Any, kwargs: dict[str, Any]) -> Any:
        try:
            planned = self.prepare(model, trainer, dict(kwargs))
        except Exception as e:   # noqa: BLE001 - trainctl's part failed: the call as written
            self.session.info(f"ultralytics integration failed to prepare model.train() ({type(e).__name__}: "
                              f"{e}); it runs as the script wrote it", FAILED_KEY)
            return original(model, trainer=trainer, **kwargs)
        if planned is None:
            return None   # said by resume_plan: the run this checkpoint is from is complete
        return original(model, **planned)

    def prepare(self, model: Any, trainer: Any, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The call's keywords under trainctl (``trainer`` included), or None: nothing to train."""
        s = self.session
        kwargs = self.arguments(kwargs)
        place_results(model, kwargs, s.run_dir)
        keep_spawned_workers_out_of_main(s)
        install_loader(s.preset)   # idempotent: one subclass over Ultralytics' own loader
        if not self.resume(kwargs):
            return None
        supervise_model(model, kwargs, s.sink, s.preset, s.run_dir, s.checkpoint_every, self.version,
                        trainer=trainer)
        kwargs.setdefault("trainer", trainer)
        return kwargs


def place_results(model: Any, kwargs: dict[str, Any], run_dir: Path | None,
                  cwd: Path | None = None) -> None:
    """Where a script's results go when it names no absolute ``project``.  Ultralytics puts
    them under its settings' ``runs_dir``, which it takes from the git checkout above its own
    package: with a venv inside trainctl's checkout (`make demo`), that checkout.  When
    ``runs_dir`` is inside such a checkout (trainctl's, or the one Ultralytics is installed
    in), the project becomes ``<cwd>/runs/<task>[/<project>]``: the trainer's working
    directory, where trainctl was started (what Ultralytics does outside a git checkout), or
    the run directory when that is inside trainctl's checkout too.  A ``runs_dir`` the user
    chose elsewhere (``yolo settings runs_dir=...``) is kept."""
    project = kwargs.get("project")
    if project and Path(str(project)).expanduser().is_absolute():
        return
    try:
        from ultralytics.utils import SETTINGS
        runs_dir = Path(SETTINGS["runs_dir"]).expanduser().resolve()
    except Exception:   # noqa: BLE001 - no settings to read: choose ourselves
        runs_dir = None
    checkouts = code_checkouts()
    if runs_dir is not None and not any(_within(runs_dir, c) for c in checkouts):
        return
    where = (cwd or Path.cwd()).resolve()
    if run_dir is not None and checkouts and _within(where, checkouts[0]):
        where = Path(run_dir)
    base = where / "runs" / str(getattr(model, "task", None) or "detect")
    kwargs["project"] = str(base / str(project)) if project else str(base)


def _within(path: Path, tree: Path) -> bool:
    return path == tree or tree in path.parents


def code_checkouts() -> list[Path]:
    """The git checkouts that hold trainctl's code (first) and Ultralytics' package, if any."""
    out = []
    for module_file in (__file__, sys.modules["ultralytics"].__file__ if "ultralytics" in sys.modules
                        else None):
        if module_file:
            here = Path(module_file).resolve().parent   # through the run's folder of links
            root = next((d for d in here.parents if (d / ".git").exists()), None)
            if root is not None and root not in out:
                out.append(root)
    return out
