"""The Ultralytics integration: a plain script's ``YOLO(...).train(...)`` gets what the
built-in runner (src/trainctl/inside/ultralytics_runner.py) gives a job file, through the same code.

``attach`` wraps ``ultralytics.engine.model.Model.train`` (every YOLO task's); each call then
* applies the preset natively: its ``[train]`` and ``workers`` replace what the script
  passed (a warning names each key it changed), its DataLoader keywords reach Ultralytics'
  loaders (:func:`~trainctl.inside.ultralytics_setup.install_loader`), its threads are
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

from trainctl.config import ConfigError
from trainctl.inside import FAILED_KEY, Refused
from trainctl.inside.session import TrainerSession, keep_spawned_workers_out_of_main
from trainctl.inside.ultralytics_runner import mid_epoch_supported, resume_plan, supervise_model
from trainctl.inside.ultralytics_setup import install_loader, preset_train_args

TESTED = ("8.3.", "8.4.")  # Ultralytics versions the runner's callbacks and trainer classes know


def tested(version: str) -> bool:
    return version.startswith(TESTED)


def attach(module: Any) -> str:
    version = str(getattr(module, "__version__", "unknown"))
    if not tested(version):
        raise Refused(
            f"Ultralytics {version} is outside the tested range ({' or '.join(v + 'x' for v in TESTED)})"
        )
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

    train._trainctl = plan  # type: ignore[attr-defined]
    Model.train = train  # type: ignore[method-assign]  # the zero-code patch of Model.train
    return f"ultralytics {version}"


class TrainPlan:
    """What one script's train calls become under trainctl."""

    def __init__(self, session: TrainerSession, version: str) -> None:
        self.session = session
        self.version = version
        self.resume_from = session.resume_from  # for the first call only

    def arguments(self, kwargs: dict[str, Any], model: Any = None) -> dict[str, Any]:
        """The script's keywords with the preset's over them.  One warning says every change:
        each key the preset sets, beside what the script passed or, where it passed none,
        what the model or Ultralytics would have used; and the DataLoader settings that
        reach Ultralytics' own loaders, beside Ultralytics' own."""
        preset_args = preset_train_args(self.session.preset)
        changed: dict[str, tuple[Any, ...]] = {}
        defaults = _train_defaults(model)
        for k, v in preset_args.items():
            if k in kwargs:
                if kwargs[k] != v:
                    changed[k] = (kwargs[k], v)
            elif k in defaults and defaults[k][0] != v:
                changed[k] = (defaults[k][0], v, defaults[k][1])
        self.session.warn_overridden(
            "model.train()",
            changed,
            _loader_changes(self.session.preset),
            "Ultralytics' DataLoaders",
            _process_settings(self.session.preset),
        )
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
        if status is None:  # else resume_plan said why not: training starts over
            kwargs["resume"] = str(ckpt)
        return True

    def train(self, original: Any, model: Any, trainer: Any, kwargs: dict[str, Any]) -> Any:
        try:
            planned = self.prepare(model, trainer, dict(kwargs))
        except Exception as e:  # noqa: BLE001 - trainctl's part failed: the call as written
            self.session.info(
                f"ultralytics integration failed to prepare model.train() ({type(e).__name__}: "
                f"{e}); it runs as the script wrote it",
                FAILED_KEY,
            )
            return original(model, trainer=trainer, **kwargs)
        if planned is None:
            return None  # said by resume_plan: the run this checkpoint is from is complete
        return original(model, **planned)

    def prepare(self, model: Any, trainer: Any, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The call's keywords under trainctl (``trainer`` included), or None: nothing to train."""
        s = self.session
        kwargs = self.arguments(kwargs, model)
        place_results(model, kwargs, s.run_dir)
        keep_spawned_workers_out_of_main(s)
        install_loader(s.preset)  # idempotent: one subclass over Ultralytics' own loader
        if not self.resume(kwargs):
            return None
        supervise_model(
            model, kwargs, s.sink, s.preset, s.run_dir, s.checkpoint_every, self.version, trainer=trainer
        )
        kwargs.setdefault("trainer", trainer)
        return kwargs


def place_results(model: Any, kwargs: dict[str, Any], run_dir: Path | None, cwd: Path | None = None) -> None:
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
    except Exception:  # noqa: BLE001 - no settings to read: choose ourselves
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
    for module_file in (
        __file__,
        sys.modules["ultralytics"].__file__ if "ultralytics" in sys.modules else None,
    ):
        if module_file:
            here = Path(module_file).resolve().parent  # through the run's folder of links
            root = next((d for d in here.parents if (d / ".git").exists()), None)
            if root is not None and root not in out:
                out.append(root)
    return out


def _train_defaults(model: Any) -> dict[str, tuple[Any, str]]:
    """What ``model.train()`` uses for a key the script did not pass: the model's own
    overrides, else Ultralytics' defaults (``key -> (value, whose)``)."""
    out: dict[str, tuple[Any, str]] = {}
    try:
        from ultralytics.cfg import DEFAULT_CFG_DICT

        out.update({k: (v, "Ultralytics' default") for k, v in DEFAULT_CFG_DICT.items()})
    except Exception:  # noqa: BLE001 - an Ultralytics without it: only what the script passed
        pass
    overrides = getattr(model, "overrides", None)
    if isinstance(overrides, dict):
        out.update({k: (v, "the model's") for k, v in overrides.items() if k in out})
    return out


def _loader_changes(preset: Any) -> dict[str, tuple[Any, ...]]:
    """The preset's DataLoader settings that Ultralytics does not expose, beside what its
    loaders use without trainctl (a training loader with workers)."""
    import multiprocessing

    from trainctl.inside.ultralytics_setup import loader_overrides

    if preset is None:
        return {}
    own: dict[str, Any] = {
        "persistent_workers": False,
        "prefetch_factor": 4,
        "multiprocessing_context": multiprocessing.get_start_method(allow_none=True)
        or multiprocessing.get_all_start_methods()[0],
    }
    out: dict[str, tuple[Any, ...]] = {
        k: (own.get(k), v) for k, v in loader_overrides(preset).items() if own.get(k) != v
    }
    strategy = preset.dataloader.sharing_strategy
    if strategy:
        import torch.multiprocessing as mp

        if mp.get_sharing_strategy() != strategy:
            out["sharing_strategy"] = (mp.get_sharing_strategy(), strategy)
    return out


def _process_settings(preset: Any) -> str:
    """What the preset sets in the training process whatever the script had: its threads
    and its environment ('OMP_NUM_THREADS=2, torch threads 2, MIOPEN_USER_DB_PATH=/tmp/m')."""
    if preset is None:
        return ""
    parts = []
    if preset.threads.omp_num_threads is not None:
        parts.append(f"OMP_NUM_THREADS={preset.threads.omp_num_threads}")
    if preset.threads.torch_num_threads is not None:
        parts.append(f"torch threads {preset.threads.torch_num_threads}")
    parts += [f"{k}={v}" for k, v in preset.env.items()]
    return ", ".join(parts)
