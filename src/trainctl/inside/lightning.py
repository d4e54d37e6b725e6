"""The Lightning integration: a ``Callback`` in every ``Trainer`` (``lightning`` and
``pytorch_lightning``, attached when the script imports either; its code is not changed).

* ``Trainer.__init__`` is wrapped to add :class:`TrainctlCallback`: structured progress
  (epoch, batches done in it, batches per epoch, optimizer steps, the logged losses from
  ``trainer.callback_metrics``), phases (train, val, save) and saves on request:
  ``trainer.save_checkpoint`` at the next training batch end, into
  ``<run_dir>/checkpoints/lightning-<kind>-e<epoch>-b<batch>.ckpt`` (temp file, then
  renamed; the last two kept).  A rescue request while the main thread waits for a batch
  (a DataLoader worker deadlock) is saved from the signal handler at once: the module is
  between two batches.
* ``Trainer.save_checkpoint`` is wrapped: every checkpoint the Trainer writes (ModelCheckpoint's
  and the script's own) is phase save, then a ``checkpoint`` event with its path.
* ``Trainer.fit`` is wrapped: the first ``fit`` of a restart resumes from the checkpoint the
  agent chose (``TRAINCTL_RESUME_FROM``) as ``ckpt_path``, over the script's own (said); the preset's ``[dataloader]`` goes onto
  the DataLoaders the script gives (``train_dataloaders``/``val_dataloaders``, a DataModule's
  or the LightningModule's ``*_dataloader()``); a warning names what it overrode, and what it
  could not apply.

Positions: ``epoch`` 1-based in progress, ``batch`` the training batches done in it.
Tested with lightning 2.4.0 and 2.6.6; versions outside :data:`SUPPORTED` are refused.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, cast

from trainctl.core.statefile import atomic_path
from trainctl.inside import ATTACHED_KEY, Refused, report
from trainctl.inside.callback_support import (
    Throttle,
    apply_sharing_strategy,
    guarded,
    in_range,
    open_session,
    preset_dataloader,
    resume_argument,
    warn_not_applied,
)
from trainctl.inside.save_requests import SaveRequests, hold, label

SUPPORTED = ((2, 4), (3,))  # low <= version < high: tested with 2.4.0 and 2.6.6
KEEP = 2  # our own saves kept in <run_dir>/checkpoints
PREFIX = "lightning-"
SAVE_REQUESTS = SaveRequests()
_state: dict[str, Any] = {"session": None, "resume_used": False, "patched": set()}


def attach(module: ModuleType) -> str:
    version = getattr(module, "__version__", "?")
    name = module.__name__
    if not in_range(version, *SUPPORTED):
        raise Refused(f"{name} {version} is outside the tested range (2.4 to 2.x)")
    trainer_cls, callback_cls = module.Trainer, module.Callback
    _state["session"] = _state["session"] or open_session(name)
    if name not in _state["patched"]:
        patch_trainer(trainer_cls, callback_class(callback_cls))
        _state["patched"].add(name)
    return f"{name} {version}"


def callback_class(base: type) -> type:
    """:class:`TrainctlCallback` as a Callback of this package (lightning or pytorch_lightning)."""
    return type("TrainctlLightningCallback", (TrainctlCallback, base), {})


def patch_trainer(trainer_cls: Any, callback: type) -> None:
    init, fit, save = trainer_cls.__init__, trainer_cls.fit, trainer_cls.save_checkpoint

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        try:
            if not any(isinstance(cb, TrainctlCallback) for cb in self.callbacks):
                self.callbacks.append(callback())
            SAVE_REQUESTS.claim()
        except Exception as e:  # noqa: BLE001 - never the script's failure
            report.report_info(
                f"lightning integration: not installed in this Trainer ({type(e).__name__}: {e})",
                "instrument.failed",
            )

    def fit_(
        self,
        model,
        train_dataloaders=None,
        val_dataloaders=None,
        datamodule=None,
        ckpt_path=None,
        *args,
        **kwargs,
    ):
        try:
            if _state["session"] is not None:
                apply_preset(model, train_dataloaders, val_dataloaders, datamodule, _state["session"])
        except Exception as e:  # noqa: BLE001
            report.report_info(
                f"lightning integration: preset not applied ({type(e).__name__}: {e})", "instrument.failed"
            )
        if not _state["resume_used"]:
            _state["resume_used"] = True
            try:
                ckpt_path = resume_argument(_state["session"], ckpt_path, _not_a_checkpoint, "ckpt_path")
            except Exception as e:  # noqa: BLE001 - the script's own value then
                report.report_info(f"no resume ({type(e).__name__}: {e})", "runner.resume_failed")
        return fit(self, model, train_dataloaders, val_dataloaders, datamodule, ckpt_path, *args, **kwargs)

    def save_checkpoint(self, filepath, *args, **kwargs):
        cb = _ours(self)
        if cb is None or cb.own_save:
            return save(self, filepath, *args, **kwargs)
        report.report_phase("save")
        try:
            save(self, filepath, *args, **kwargs)
        except BaseException as e:
            cb.on_saved(self, filepath, ok=False, detail=f"save failed: {type(e).__name__}: {e}")
            raise
        cb.on_saved(self, filepath)

    for fn, orig in ((__init__, init), (fit_, fit), (save_checkpoint, save)):
        cast(Any, fn).__wrapped__ = orig  # as functools.wraps would: inspect.unwrap finds the original
    trainer_cls.__init__, trainer_cls.fit, trainer_cls.save_checkpoint = __init__, fit_, save_checkpoint


def _ours(trainer: Any) -> TrainctlCallback | None:
    return next((cb for cb in getattr(trainer, "callbacks", ()) if isinstance(cb, TrainctlCallback)), None)


def _not_a_checkpoint(path: str) -> str | None:
    """A .ckpt file, or a directory of a sharded strategy's (not a Transformers Trainer's)."""
    if os.path.isfile(os.path.join(path, "trainer_state.json")):
        return "a Transformers Trainer checkpoint, not a Lightning one"
    return None if os.path.exists(path) else "it is gone"


# ------------------------------------------------------------------ the preset's [dataloader]
def apply_preset(model: Any, train: Any, val: Any, datamodule: Any, session: Any) -> None:
    """The preset's ``[dataloader]`` onto the DataLoaders the script hands ``fit``: given
    directly, or made by its DataModule's or LightningModule's ``*_dataloader()`` (wrapped on
    the instance, applied when Lightning calls them).  A warning names what it overrode,
    another what it could not reach."""
    settings = preset_dataloader(session)
    if not settings:
        return
    apply_sharing_strategy(settings)
    owner = datamodule if datamodule is not None else (train if _is_datamodule(train) else None)
    if owner is None and train is None:
        owner = model
    if owner is not None:
        for name in ("train_dataloader", "val_dataloader"):
            _wrap_maker(owner, name, settings, session)
    changed: dict[str, tuple[Any, Any]] = {}
    found = False
    for loaders in (train, val):
        if loaders is not None and not _is_datamodule(loaders):
            for dl in _loaders(loaders):
                found = True
                changed.update(set_loader(dl, settings))
    session.warn_overridden("DataLoader", changed)
    if owner is None and train is not None and not found:
        warn_not_applied(
            session, "lightning", sorted(settings), "the training loaders are not torch DataLoaders"
        )


def _is_datamodule(obj: Any) -> bool:
    return callable(getattr(obj, "train_dataloader", None)) and hasattr(obj, "prepare_data")


def _loaders(obj: Any):
    """The torch DataLoaders in a loader, a list/tuple/dict of them, or a CombinedLoader."""
    from torch.utils.data import DataLoader

    if isinstance(obj, DataLoader):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _loaders(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _loaders(item)
    elif hasattr(obj, "flattened"):
        for item in obj.flattened:
            yield from _loaders(item)


def _wrap_maker(owner: Any, name: str, settings: dict[str, Any], session: Any) -> None:
    """Wrap the script's own ``name()`` (never Lightning's default, which Lightning reads as
    "not implemented")."""
    maker = getattr(owner, name, None)
    if maker is None or getattr(maker, "_trainctl", False) or not _user_defined(owner, name):
        return

    def made(*args: Any, **kwargs: Any) -> Any:
        out = maker(*args, **kwargs)
        try:
            changed: dict[str, tuple[Any, Any]] = {}
            for dl in _loaders(out):
                changed.update(set_loader(dl, settings))
            if name == "train_dataloader":
                session.warn_overridden(f"{name}()", changed)
        except Exception as e:  # noqa: BLE001
            report.report_info(
                f"lightning integration: preset not applied to {name}() ({e})", "instrument.failed"
            )
        return out

    cast(Any, made)._trainctl = True  # the mark that it is ours (not wrapped twice)
    try:
        setattr(owner, name, made)  # on the instance: the script's class is untouched
    except AttributeError:
        pass


def _user_defined(owner: Any, name: str) -> bool:
    for cls in type(owner).__mro__:
        if name in vars(cls):
            return not cls.__module__.startswith(("lightning.", "pytorch_lightning."))
    return False


_SETTING = {
    "num_workers": "workers",
    "persistent_workers": "persistent_workers",
    "prefetch_factor": "prefetch_factor",
    "multiprocessing_context": "multiprocessing_context",
}


def set_loader(dl: Any, settings: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The preset's values on a DataLoader made but not iterated yet (its workers start at
    ``iter``).  ``persistent_workers`` is read-only after ``__init__`` for PyTorch's checks,
    which only matter at construction.  What changed: attribute -> (old, new), for the
    settings the preset names."""
    workers = settings.get("workers", dl.num_workers)
    wanted: dict[str, Any] = {"num_workers": workers}
    if "persistent_workers" in settings or workers == 0:
        wanted["persistent_workers"] = bool(settings.get("persistent_workers")) and workers > 0
    if "prefetch_factor" in settings and workers > 0:
        wanted["prefetch_factor"] = settings["prefetch_factor"]
    elif workers == 0:
        wanted["prefetch_factor"] = None
    if "multiprocessing_context" in settings and workers > 0:
        wanted["multiprocessing_context"] = settings["multiprocessing_context"]
    changed = {}
    for attr, value in wanted.items():
        old = getattr(dl, attr, None)
        if attr == "multiprocessing_context" and old is not None:
            old = old.get_start_method()
        if old == value:
            continue
        if attr == "persistent_workers":
            object.__setattr__(dl, attr, value)
        else:
            setattr(dl, attr, value)
        if _SETTING[attr] in settings:
            changed[attr] = (old, value)
    return changed


# ------------------------------------------------------------------ the callback
@guarded
class TrainctlCallback:
    """Progress, phases, checkpoints and save requests, from the Trainer's hooks."""

    def __init__(self) -> None:
        self.throttle = Throttle(0.5)
        self.batch_done = 0
        self.own_save = False
        self.trainer: Any = None
        self.training = False

    # positions
    def batches(self, trainer: Any) -> int | None:
        n = trainer.num_training_batches
        return int(n) if isinstance(n, (int, float)) and n != float("inf") else None

    def epochs(self, trainer: Any) -> int | None:
        if trainer.max_epochs is not None and trainer.max_epochs > 0:
            if trainer.max_steps and trainer.max_steps > 0 and self.batches(trainer):
                per_epoch = max(self.batches(trainer) // max(trainer.accumulate_grad_batches, 1), 1)
                return min(trainer.max_epochs, -(-trainer.max_steps // per_epoch))
            return trainer.max_epochs
        return None

    def losses(self, trainer: Any) -> dict[str, float]:
        out = {}
        for key, value in dict(trainer.callback_metrics).items():
            if "loss" not in key:
                continue
            try:
                out[key] = float(value)
            except (TypeError, ValueError, RuntimeError):
                continue
        return out

    def done(self, trainer: Any) -> int:
        """Training batches done in this epoch (Lightning's own count: a checkpoint callback
        that runs before this one at a batch end sees the batch as done too)."""
        try:
            return int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)
        except (AttributeError, TypeError, ValueError):
            return self.batch_done

    def progress(self, trainer: Any, force: bool = False) -> None:
        if not self.throttle.due(force):
            return
        report.report_progress(
            trainer.current_epoch + 1,
            self.epochs(trainer),
            self.done(trainer),
            self.batches(trainer),
            self.losses(trainer),
        )

    # hooks
    def on_train_start(self, trainer, pl_module):
        self.trainer = trainer
        self.training = True
        if trainer.world_size == 1:
            SAVE_REQUESTS.declare(on_blocked=self.rescue_while_blocked)
        else:
            report.report_info(
                f"saves on request need a single process; this Trainer runs {trainer.world_size}",
                "instrument.no_save_on_request",
            )
        package = type(trainer).__module__.split(".")[0]
        version = getattr(sys.modules.get(package), "__version__", "")
        report.report_info(
            f"{package} {version}: its Trainer trains (a restart resumes through it)",
            f"{ATTACHED_KEY}.lightning",
        )
        report.report_phase("train")

    def on_train_epoch_start(self, trainer, pl_module):
        self.batch_done = 0
        self.throttle.restart()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batch_done = batch_idx + 1
        batches = self.batches(trainer)
        self.progress(trainer, force=batches is not None and self.done(trainer) >= batches)
        request = SAVE_REQUESTS.take()
        if request is not None:
            self.save_now(trainer, request)

    def on_validation_start(self, trainer, pl_module):
        if self.training and not trainer.sanity_checking:
            report.report_phase("val")

    def on_validation_end(self, trainer, pl_module):
        if self.training and not trainer.sanity_checking:
            self.throttle.restart()
            report.report_phase("train")

    def on_train_end(self, trainer, pl_module):
        self.training = False

    # checkpoints
    def on_saved(self, trainer: Any, path: Any, ok: bool = True, detail: str = "") -> None:
        """The Trainer wrote a checkpoint (ModelCheckpoint's or the script's own)."""
        self.report_saved(trainer, path, None, ok=ok, detail=detail)

    def report_saved(
        self, trainer: Any, path: Any, request: dict[str, Any] | None, ok: bool = True, detail: str = ""
    ) -> None:
        if not trainer.is_global_zero:
            return
        batches, done = self.batches(trainer), self.done(trainer)
        whole = batches is not None and done >= batches
        kind = request["kind"] if request else ("epoch" if whole else "periodic")
        ok = ok and os.path.exists(path)  # a file, or a sharded strategy's directory
        text = f"{label(request)}step {trainer.global_step}" + (f": {detail}" if detail else "")
        report.report_checkpoint(
            os.path.abspath(path),
            trainer.current_epoch + 1,
            ok=ok,
            detail=text,
            batch=None if whole else done,
            kind=kind,
        )
        report.report_phase("train" if self.training else "finished")
        self.throttle.restart()

    def save_now(self, trainer: Any, request: dict[str, Any]) -> None:
        """``trainer.save_checkpoint`` into the run's checkpoints/ (temp, then renamed)."""
        run_dir = os.environ.get("TRAINCTL_RUN_DIR", "")
        folder = Path(run_dir) / "checkpoints" if run_dir else Path(trainer.default_root_dir) / "checkpoints"
        dest = folder / f"{PREFIX}{request['kind']}-e{trainer.current_epoch + 1}-b{self.done(trainer)}.ckpt"
        report.report_phase("save")
        t0 = time.perf_counter()
        self.own_save = True
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with atomic_path(dest) as tmp:  # a random name beside it, fsynced, renamed
                trainer.save_checkpoint(tmp)
            ok, detail = True, f"{(time.perf_counter() - t0) * 1000:.0f} ms"
        except Exception as e:  # noqa: BLE001 - a failed save is reported, training goes on
            ok, detail = False, f"save failed: {type(e).__name__}: {e}"
        finally:
            self.own_save = False
        self.report_saved(trainer, dest, request, ok=ok, detail=detail)
        if ok:
            ours = sorted(folder.glob(f"{PREFIX}*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True)
            for old in ours[KEEP:]:
                old.unlink(missing_ok=True)
        hold(request)

    def rescue_while_blocked(self, request: dict[str, Any], frame: FrameType | None) -> None:
        """From the SIGUSR1 handler while the main thread waits for its next batch: the
        module is between two batches, so a save now is the state after the last one."""
        trainer = self.trainer
        if trainer is None or not self.training or not in_training_fetch(frame):
            report.report_checkpoint(
                "",
                None,
                ok=False,
                kind="rescue",
                detail=f"{label(request)}waiting for data outside the training loop: no rescue save",
            )
            return
        self.save_now(trainer, request)


def in_training_fetch(frame: FrameType | None) -> bool:
    """The wait for data is the training loop's (not validation's)."""
    training = False
    while frame is not None:
        name = frame.f_code.co_filename
        if name.endswith("evaluation_loop.py"):
            return False
        training = training or name.endswith("training_epoch_loop.py")
        frame = frame.f_back
    return training
