"""The Transformers integration: a ``TrainerCallback`` in every ``transformers.Trainer``.

Attached when the script imports ``transformers`` (src/trainctl/inside/bootstrap); the
script's code is not changed.  ``transformers`` loads its ``Trainer`` lazily, so the patch
waits for ``transformers.trainer`` to be imported (a script that only tokenizes never pays
for it).  Then every ``Trainer``:

* gets :class:`TrainctlCallback` (its ``__init__`` is wrapped): structured progress
  (epoch, optimizer steps in it, steps per epoch, the logged losses), phases (train, val,
  save), a ``checkpoint`` event for each ``checkpoint-<step>`` directory the Trainer writes
  (``on_save``), and saves on request through ``control.should_save`` at the next step end
  (a rescue while the main thread waits for a batch, a DataLoader worker deadlock, is saved
  from the signal handler with the Trainer's own checkpoint writer);
* takes the preset's ``[dataloader]`` (``dataloader_num_workers``, ``_persistent_workers``,
  ``_prefetch_factor``; a warning names what it overrode and what it could not apply);
* resumes on a restart: the first ``train()`` gets the checkpoint directory the agent chose
  (``TRAINCTL_RESUME_FROM``) as ``resume_from_checkpoint``, over the script's own (said).

Positions: ``epoch`` 1-based in progress, ``batch`` the optimizer steps done in it
(``global_step = (epoch - 1) * batches + batch``, the Trainer's own arithmetic on resume).
Tested with transformers 5.24; other versions outside :data:`SUPPORTED` are refused.
"""

from __future__ import annotations

import importlib.abc
import math
import os
import sys
from types import FrameType, ModuleType
from typing import Any, cast

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

SUPPORTED = ((5, 24), (6,))  # low <= version < high: tested with 5.24
TRAINER_MODULE = "transformers.trainer"
SAVE_REQUESTS = SaveRequests()
_state: dict[str, Any] = {
    "session": None,
    "resume_used": False,
    "patched": False,
    "description": "transformers",
}


def attach(module: ModuleType) -> str:
    version = getattr(module, "__version__", "?")
    if not in_range(version, *SUPPORTED):
        raise Refused(f"transformers {version} is outside the tested range (5.24 to 5.x)")
    _state["session"] = open_session("transformers")
    if TRAINER_MODULE in sys.modules:
        patch_trainer(sys.modules[TRAINER_MODULE].Trainer)
    else:
        sys.meta_path.insert(0, _AfterImport(TRAINER_MODULE, lambda m: patch_trainer(m.Trainer)))
    _state["description"] = f"transformers {version}"
    return _state["description"]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` once ``name`` has been imported (by any route: the lazy
    ``from transformers import Trainer`` and ``import transformers.trainer`` alike)."""

    def __init__(self, name: str, then) -> None:
        self.name = name
        self.then = then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, then = spec.loader, self.then

        class Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                module.__loader__ = loader
                loader.exec_module(module)
                try:
                    then(module)
                except Exception as e:  # noqa: BLE001 - the script runs unaltered
                    report.report_info(
                        f"transformers integration failed to attach ({type(e).__name__}: "
                        f"{e}); the script runs unaltered",
                        "instrument.failed",
                    )

        spec.loader = Loader()
        return spec


def patch_trainer(trainer_cls: Any) -> None:
    """Wrap ``Trainer.__init__`` (add the callback, apply the preset) and ``Trainer.train``
    (resume).  Once."""
    if _state["patched"]:
        return
    _state["patched"] = True
    init, train = trainer_cls.__init__, trainer_cls.train

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        try:
            _setup(self)
        except Exception as e:  # noqa: BLE001 - never the script's failure
            report.report_info(
                f"transformers integration: not installed in this Trainer ({type(e).__name__}: {e})",
                "instrument.failed",
            )

    def train_(self, resume_from_checkpoint=None, *args, **kwargs):
        if not _state["resume_used"]:
            _state["resume_used"] = True
            try:
                resume_from_checkpoint = resume_argument(
                    _state["session"], resume_from_checkpoint, _not_a_trainer_dir, "resume_from_checkpoint"
                )
            except Exception as e:  # noqa: BLE001 - the script's own value then
                report.report_info(f"no resume ({type(e).__name__}: {e})", "runner.resume_failed")
        return train(self, resume_from_checkpoint, *args, **kwargs)

    cast(Any, __init__).__wrapped__ = init  # as functools.wraps would: inspect.unwrap finds the original
    cast(Any, train_).__wrapped__ = train
    trainer_cls.__init__ = __init__
    trainer_cls.train = train_


def _not_a_trainer_dir(path: str) -> str | None:
    if not os.path.isfile(os.path.join(path, "trainer_state.json")):
        return "not a Trainer checkpoint directory (no trainer_state.json)"
    return None


def _setup(trainer: Any) -> None:
    if not any(isinstance(cb, TrainctlCallback) for cb in trainer.callback_handler.callbacks):
        trainer.add_callback(callback_class()(trainer))
    SAVE_REQUESTS.claim()
    session = _state["session"]
    if session is not None:
        apply_preset(trainer.args, preset_dataloader(session), session)


_FIELDS = {
    "workers": "dataloader_num_workers",
    "persistent_workers": "dataloader_persistent_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
    "pin_memory": "dataloader_pin_memory",
}


def apply_preset(args: Any, settings: dict[str, Any], session: Any) -> dict[str, tuple[Any, Any]]:
    """The preset's ``[dataloader]`` onto the Trainer's ``TrainingArguments``; a warning
    names what it overrode, another what the Trainer has no setting for.  What changed:
    field -> (the script's value, the preset's)."""
    changed: dict[str, tuple[Any, Any]] = {}
    if not settings:
        return changed
    workers = settings.get("workers", getattr(args, "dataloader_num_workers", 0))
    wanted = {attr: settings[key] for key, attr in _FIELDS.items() if key in settings}
    if workers == 0:  # PyTorch refuses these without workers
        wanted["dataloader_persistent_workers"] = False
        wanted["dataloader_prefetch_factor"] = None
    for attr, value in wanted.items():
        if hasattr(args, attr) and getattr(args, attr) != value:
            changed[attr] = (getattr(args, attr), value)
            setattr(args, attr, value)
    session.warn_overridden("TrainingArguments", changed)
    apply_sharing_strategy(settings)
    warn_not_applied(
        session,
        "transformers",
        [k for k in settings if k not in _FIELDS and k != "sharing_strategy"],
        "TrainingArguments has no such setting",
    )
    return changed


_classes: dict[str, type] = {}


def callback_class() -> type:
    """:class:`TrainctlCallback` as a ``transformers.TrainerCallback`` (made on first use:
    importing this module imports nothing of transformers)."""
    if "cls" not in _classes:
        from transformers import TrainerCallback

        _classes["cls"] = type("TrainctlTrainerCallback", (TrainctlCallback, TrainerCallback), {})
    return _classes["cls"]


@guarded
class TrainctlCallback:
    """Progress, phases, checkpoints and save requests, from the Trainer's own events
    (the methods of :func:`callback_class`'s ``TrainerCallback``)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.throttle = Throttle(0.5)
        self.training = False
        self.per_epoch: int | None = None  # optimizer steps per epoch (None: no length)
        self.epochs: int | None = None
        self.losses: dict[str, float] = {}
        self.request: dict[str, Any] | None = None

    # ------------------------------------------------------------------ positions
    def position(self, step: int) -> tuple[int | None, int]:
        """(epoch 1-based in progress, steps done in it) of global step ``step``."""
        if not self.per_epoch:
            return None, step
        if step > 0 and step % self.per_epoch == 0:
            return step // self.per_epoch, self.per_epoch
        return step // self.per_epoch + 1, step % self.per_epoch

    def progress(self, state: Any, force: bool = False) -> None:
        if not self.throttle.due(force):
            return
        epoch, batch = self.position(state.global_step)
        batches = self.per_epoch if self.per_epoch else state.max_steps
        report.report_progress(epoch, self.epochs, batch, batches, dict(self.losses))

    # ------------------------------------------------------------------ the Trainer's events
    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.training = True
        length = None
        try:
            length = len(train_dataloader) if train_dataloader is not None else None
        except TypeError:
            pass
        accum = max(int(getattr(args, "gradient_accumulation_steps", 1) or 1), 1)
        if length:
            self.per_epoch = max(math.ceil(length / accum), 1)
            self.epochs = max(math.ceil(state.max_steps / self.per_epoch), 1)
        else:
            self.per_epoch = self.epochs = None
        if getattr(args, "world_size", 1) == 1:
            SAVE_REQUESTS.declare(on_blocked=self.rescue_while_blocked)
        else:
            report.report_info(
                f"saves on request need a single process; this Trainer runs {args.world_size}",
                "instrument.no_save_on_request",
            )
        report.report_info(
            f"{_state['description']}: its Trainer trains (a restart resumes through it)",
            f"{ATTACHED_KEY}.transformers",
        )
        report.report_phase("train")
        if state.global_step:
            self.progress(state, force=True)

    def on_log(self, args, state, control, logs=None, **kwargs):
        for key, value in (logs or {}).items():
            if "loss" in key and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.losses[key] = float(value)

    def on_step_end(self, args, state, control, **kwargs):
        self.progress(state, force=bool(self.per_epoch) and state.global_step % self.per_epoch == 0)
        self.take_request(control)
        self.next_phase(control)

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.throttle.restart()

    def on_epoch_end(self, args, state, control, **kwargs):
        self.take_request(control)
        self.next_phase(control)

    def on_evaluate(self, args, state, control, **kwargs):
        if self.training:
            self.throttle.restart()
            report.report_phase("save" if control.should_save else "train")

    def on_save(self, args, state, control, **kwargs):
        if not self.training or not state.is_world_process_zero:
            return
        path = os.path.abspath(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))
        epoch, batch = self.position(state.global_step)
        request, self.request = self.request, None
        whole = bool(self.per_epoch) and batch == self.per_epoch
        kind = request["kind"] if request else ("epoch" if whole else "periodic")
        ok = os.path.isfile(os.path.join(path, "trainer_state.json"))
        detail = f"{label(request)}step {state.global_step}" + (
            "" if ok else ": no trainer_state.json written"
        )
        report.report_checkpoint(path, epoch, ok=ok, detail=detail, batch=None if whole else batch, kind=kind)
        report.report_phase("train")
        self.throttle.restart()
        hold(request)

    def on_train_end(self, args, state, control, **kwargs):
        self.training = False
        self.progress(state, force=True)

    # ------------------------------------------------------------------ requests
    def take_request(self, control: Any) -> None:
        request = SAVE_REQUESTS.take()
        if request is not None:
            self.request = request
            control.should_save = True

    def next_phase(self, control: Any) -> None:
        if control.should_evaluate:
            report.report_phase("val")
        elif control.should_save:
            report.report_phase("save")

    def rescue_while_blocked(self, request: dict[str, Any], frame: FrameType | None) -> None:
        """A rescue while the main thread waits for its next batch (a DataLoader worker
        deadlock): no step end will come, so save from the signal handler, with the Trainer's
        own checkpoint writer (``_save_checkpoint``: model, optimizer, scheduler, RNG, trainer
        state of the last optimizer step; a resume skips the batches done).  Only while
        ``get_batch_samples`` fetches a training step's batches; elsewhere say at once that no
        save is coming (the agent then restarts without waiting out its rescue timeout)."""
        trainer, state = self.trainer, self.trainer.state
        epoch, batch = self.position(state.global_step)
        save = getattr(trainer, "_save_checkpoint", None)
        if not self.training or save is None or not _in_training_fetch(frame):
            report.report_checkpoint(
                "",
                epoch,
                ok=False,
                batch=batch,
                kind="rescue",
                detail=f"{label(request)}waiting for data outside a training step: no rescue save",
            )
            return
        path = os.path.abspath(os.path.join(trainer.args.output_dir, f"checkpoint-{state.global_step}"))
        report.report_phase("save")
        try:
            save(getattr(trainer, "model_wrapped", trainer.model), None)
            ok, detail = os.path.isfile(os.path.join(path, "trainer_state.json")), ""
        except Exception as e:  # noqa: BLE001 - a failed save is reported; the agent restarts anyway
            ok, detail = False, f": save failed: {type(e).__name__}: {e}"
        whole = bool(self.per_epoch) and batch == self.per_epoch
        report.report_checkpoint(
            path,
            epoch,
            ok=ok,
            batch=None if whole else batch,
            kind="rescue",
            detail=f"{label(request)}step {state.global_step} (while waiting for data){detail}",
        )
        report.report_phase("train")


def _in_training_fetch(frame: FrameType | None) -> bool:
    """The Trainer's loop is fetching a step's batches (``Trainer.get_batch_samples``)."""
    while frame is not None:
        if frame.f_code.co_name == "get_batch_samples" and frame.f_code.co_filename.endswith(
            os.path.join("transformers", "trainer.py")
        ):
            return True
        frame = frame.f_back
    return False
