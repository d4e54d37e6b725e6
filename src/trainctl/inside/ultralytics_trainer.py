"""Mid-epoch checkpoints, mid-epoch resume and save-on-request for Ultralytics 8.4.

Imported only inside the trainer (it imports torch and ultralytics).  :func:`trainer_class`
builds, on the task's own trainer (``DetectionTrainer``, ...), a subclass that

* saves during the epoch, every ``checkpoint_every`` seconds, at the end of a batch that
  made an optimizer step (no gradient is left half accumulated): Ultralytics' own
  checkpoint dict (``epoch`` = the epoch in progress, EMA, optimizer, scaler, ...) plus
  :data:`~.checkpoint.TRAINCTL_KEY`, the position (see :meth:`MidEpochTrainer._mid_state`);
  written to ``checkpoints/mid-<epoch>-<samples>.pt`` atomically (temp, fsync, rename),
  verified (zip CRCs + pickle scan) before the rename, the last two kept;
* resumes inside the epoch from such a file: the epoch's sample order is the sampler
  generator's state saved at that epoch's start, the samples already consumed are
  skipped, and the loop's own counters (batch index, last optimizer step, running loss)
  continue, so warm-up, accumulation and the LR schedule go on where they were;
* saves on request (SIGUSR1 + ``<run_dir>/save-request.json``, see :class:`SaveRequests`).

``BaseTrainer._do_train`` keeps the batch index, the last optimizer step and the running
loss in local variables, so :meth:`MidEpochTrainer._do_train` is a copy of Ultralytics
8.4.190's loop with those made resumable (marked ``trainctl:``).  It is pinned to
:data:`SUPPORTED` versions; on others the runner keeps Ultralytics' own loop, takes no
mid-epoch saves, and a mid-epoch checkpoint resumes at the start of its epoch
(:class:`EpochStartTrainer`), which the runner says.
"""
from __future__ import annotations

import collections
import io
import json
import math
import os
import random
import signal
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import RandomSampler

from trainctl.core import events as E
from trainctl.core.statefile import read_text, temp_beside
from trainctl.inside.checkpoint_every import follower  # noqa: F401 - the runner reaches it here
from trainctl.store.checkpoint import MID_PREFIX, TRAINCTL_KEY, fsync_dir, inspect_checkpoint, mid_epoch_checkpoints

SUPPORTED = ("8.4.",)          # Ultralytics versions whose training loop MidEpochTrainer copies
KEEP_MID = 2                   # mid-epoch saves kept (plus last_good.pt, the last end-of-epoch one)
REQUEST_NAME = "save-request.json"
TRACE_ENV = "TRAINCTL_TRACE_BATCHES"   # diagnostics/tests: a JSON line per batch to this file


def supported(version: str) -> bool:
    return version.startswith(SUPPORTED)


# ------------------------------------------------------------------ save on request

PLANNED_HOLD_S = 90.0   # after a planned save: wait this long for the agent's kill


class SaveRequests:
    """SIGUSR1 → save.  The handler is installed in the main process only and is a no-op
    in any other pid (forked DataLoader workers inherit it).

    On a healthy run it only sets a flag; the trainer saves at the next batch end that made
    an optimizer step (so nothing is redone).  When the main thread is blocked waiting for
    a batch (a DataLoader worker deadlock: ``_try_get_data`` waits in 5 s slices and Python
    runs the handler between them), a *rescue* request is saved from the handler itself:
    the trainer's state is then the one of its last optimizer step, which is what is
    written.  A *planned* request while waiting for data waits for the next batch end.
    """

    def __init__(self, run_dir: Path | None) -> None:
        self.path = run_dir / REQUEST_NAME if run_dir is not None else None
        self.main_pid = os.getpid()
        self.pending = False
        self.on_blocked: Callable[[dict[str, Any]], None] | None = None   # set while fetching

    def install(self) -> None:
        signal.signal(signal.SIGUSR1, self._handler)

    def _handler(self, signum: int, frame: Any) -> None:
        if os.getpid() != self.main_pid:
            return
        self.pending = True
        blocked = self.on_blocked
        if blocked is not None:
            request = self.read()
            if request["kind"] == "rescue":
                blocked(request)

    def read(self) -> dict[str, Any]:
        """The request file: {"id", "kind", "ts"}; a missing or bad one reads as rescue."""
        out: dict[str, Any] = {"id": None, "kind": "rescue", "ts": None, "hold": False}
        try:
            data = json.loads(read_text(self.path, 1 << 16)) if self.path is not None else {}
        except (OSError, ValueError):
            data = {}
        if isinstance(data, dict):
            if type(data.get("id")) is int:
                out["id"] = data["id"]
            if data.get("kind") in ("rescue", "planned"):
                out["kind"] = data["kind"]
            out["ts"] = data.get("ts")
            out["hold"] = data.get("hold") is True
        return out

    def take(self) -> dict[str, Any] | None:
        if not self.pending:
            return None
        self.pending = False
        return self.read()


# ------------------------------------------------------------------ sampler

class ResumableSampler(RandomSampler):
    """Ultralytics' RandomSampler (same generator, same draws), which remembers the
    generator's state at the start of each pass (one pass = one epoch) and can start its
    next pass from a saved state with the first ``skip`` samples left out."""

    def __init__(self, data_source: Any, generator: torch.Generator) -> None:
        super().__init__(data_source, generator=generator)
        self.passes: collections.deque[torch.Tensor] = collections.deque()
        self.resume: tuple[torch.Tensor, int] | None = None

    def __iter__(self) -> Iterator[int]:
        skip = 0
        if self.resume is not None:
            state, skip = self.resume
            self.resume = None
            self.generator.set_state(state)
        self.passes.append(self.generator.get_state())
        for n, index in enumerate(super().__iter__()):
            if n >= skip:
                yield index


def _batches_of(samples: int, batch_size: int, drop_last: bool) -> int:
    return samples // batch_size if drop_last else math.ceil(samples / batch_size)


# ------------------------------------------------------------------ settings

@dataclass
class MidEpochConfig:
    """What the runner hands the trainer class."""

    sink: Any                         # EventSink
    checkpoint_dir: Path | None
    every_s: float                    # 0: no periodic saves
    requests: SaveRequests | None = None
    clock: Callable[[], float] = time.time
    saves: list[float] = field(default_factory=list)   # seconds each save paused training
    follow: Callable[[], float] | None = None   # checkpoint_every = "auto": the agent's interval

    def every(self) -> float:
        return self.follow() if self.follow is not None else self.every_s


def _rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"python": random.getstate(), "numpy": [kind, torch.from_numpy(keys.copy()), pos, has_gauss, gauss],
            "torch": torch.get_rng_state()}


def _set_rng_state(state: dict[str, Any]) -> None:
    try:
        random.setstate(state["python"])
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy(), pos, has_gauss, gauss))
        torch.set_rng_state(state["torch"])
    except (KeyError, TypeError, ValueError):
        pass


# ------------------------------------------------------------------ trainers

class EpochStartTrainer:
    """Mixin for any Ultralytics version: a mid-epoch checkpoint resumes at the start of
    its epoch (Ultralytics' own resume would go on at the next one, or refuse the last)."""

    trainctl: MidEpochConfig
    _tc_mid: dict[str, Any] | None = None

    def resume_training(self, ckpt: dict[str, Any] | None) -> None:
        mid = ckpt.get(TRAINCTL_KEY) if isinstance(ckpt, dict) and self.resume else None
        if not isinstance(mid, dict):
            return super().resume_training(ckpt)
        from ultralytics.utils import LOGGER
        from ultralytics.utils.torch_utils import unwrap_model
        epoch = int(mid["epoch"])
        assert 0 <= epoch < self.epochs, f"{self.args.model}: epoch {epoch + 1} is past {self.epochs} epochs"
        LOGGER.info(f"Resuming training {self.args.model} inside epoch {epoch + 1} (trainctl)")
        self._load_checkpoint_state(ckpt)
        model = unwrap_model(self.model)
        if getattr(getattr(model, "student_model", model).model[-1], "one2one_cv2", None) is not None:
            model.criterion = model.init_criterion()
            model.criterion.updates = epoch - 1
            model.criterion.update()
        self.start_epoch = epoch
        self._tc_mid = mid


class MidEpochTrainer(EpochStartTrainer):
    """Mixin for Ultralytics 8.4: periodic and requested saves, resume inside the epoch."""

    _tc_fetching = False
    _tc_saving = False

    # -- loader
    def get_dataloader(self, dataset_path, batch_size=16, rank=0, mode="train"):
        loader = super().get_dataloader(dataset_path, batch_size=batch_size, rank=rank, mode=mode)
        batch_sampler = getattr(getattr(loader, "batch_sampler", None), "sampler", None)   # _RepeatSampler's
        inner = getattr(batch_sampler, "sampler", None)
        if mode == "train" and type(inner) is RandomSampler and inner.generator is not None \
                and inner.replacement is False and inner._num_samples is None:
            batch_sampler.sampler = ResumableSampler(inner.data_source, inner.generator)
        return loader

    def _tc_sampler(self) -> ResumableSampler | None:
        inner = getattr(getattr(getattr(self.train_loader, "batch_sampler", None), "sampler", None), "sampler", None)
        return inner if isinstance(inner, ResumableSampler) else None

    # -- position
    def _mid_state(self, kind: str) -> dict[str, Any]:
        """trainctl's entry: the epoch in progress (0-based), batches and samples consumed
        at the last optimizer step, the sampler generator's state at the epoch's start, the
        loop counters to go on with, and the RNG states (for workers = 0)."""
        pos = self._tc_pos
        return {"format": 1, "kind": kind, "epoch": self.epoch, "batch": pos["batch"], "samples": pos["samples"],
                "batch_size": self.train_loader.batch_size, "batches": len(self.train_loader),
                "optimizer_steps": pos["steps"],
                "tloss": {k: float(v) for k, v in (pos["tloss"] or {}).items()},
                "sampler_state": self._tc_epoch_state, "rng": pos["rng"],
                "ultralytics": self._tc_version, "saved": time.time()}

    # -- saving
    def _tc_checkpoint_bytes(self, kind: str) -> bytes:
        """Ultralytics' own checkpoint dict (as ``save_model`` writes it) + trainctl's entry."""
        from copy import deepcopy

        from ultralytics.utils.torch_utils import convert_optimizer_state_dict_to_fp16, qat_state, strip_qat
        ema = self.ema.ema
        modelopt = qat_state(ema)
        ema = deepcopy(ema).half().to(memory_format=torch.contiguous_format)
        if hasattr(ema, "criterion"):
            ema.criterion = None
        for v in ema.state_dict().values():
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                torch.nan_to_num_(v)
        strip_qat(ema)
        buffer = io.BytesIO()
        torch.save({
            "epoch": self.epoch,    # the epoch in progress: >= 0, so Ultralytics reads it
            "best_fitness": self.best_fitness,
            "stopper": {"best_fitness": self.stopper.best_fitness, "best_epoch": self.stopper.best_epoch},
            "model": None,
            "ema": ema,
            "updates": self.ema.updates,
            "modelopt": modelopt,
            "optimizer": convert_optimizer_state_dict_to_fp16(deepcopy(self.optimizer.state_dict())),
            "scaler": self.scaler.state_dict(),
            "train_args": vars(self.args),
            "train_metrics": {**self.metrics, "fitness": self.fitness},
            "train_results": self.read_results_csv(),
            "date": datetime.now().astimezone().isoformat(),
            "version": self._tc_version,
            TRAINCTL_KEY: self._mid_state(kind),
        }, buffer)
        return buffer.getvalue()

    def _tc_save(self, kind: str, request: dict[str, Any] | None = None) -> None:
        """Write, verify and keep a mid-epoch checkpoint; report it; prune old ones."""
        cfg = self.trainctl
        if cfg.checkpoint_dir is None or self._tc_saving:
            return
        self._tc_saving = True
        t0 = time.perf_counter()
        sink = cfg.sink
        sink.emit(E.Phase(cfg.clock(), "save"))
        pos = self._tc_pos
        dest = cfg.checkpoint_dir / f"{MID_PREFIX}{self.epoch + 1:04d}-{pos['samples']:08d}.pt"
        ok, detail = False, ""
        tmp: Path | None = None
        try:
            data = self._tc_checkpoint_bytes(kind)
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = temp_beside(dest)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            check = inspect_checkpoint(tmp)
            ok = check.ok and check.mid_epoch
            if ok:
                os.replace(tmp, dest)
                tmp = None
                fsync_dir(dest.parent)
                self._tc_prune()
            detail = check.detail if ok else f"failed verification: {check.detail}"
        except Exception as exc:  # noqa: BLE001 - a failed save is reported, training goes on
            detail = f"save failed: {type(exc).__name__}: {exc}"
        finally:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
            self._tc_saving = False
        took = time.perf_counter() - t0
        cfg.saves.append(took)
        self._tc_last_save = time.monotonic()
        where = f"batch {pos['batch']} ({pos['samples']} samples)"
        text = f"{kind} save at {where}: {detail}; {took * 1000:.0f} ms"
        if request is not None:
            text = f"request {request.get('id')}: {text}"
        sink.emit(E.Checkpoint(cfg.clock(), str(dest), self.epoch + 1, ok, text, batch=pos["batch"], kind=kind))
        sink.emit(E.Phase(cfg.clock(), "train"))

    def _tc_prune(self) -> None:
        for old in mid_epoch_checkpoints(self.trainctl.checkpoint_dir)[KEEP_MID:]:
            old.unlink(missing_ok=True)

    def _tc_epoch_saved(self) -> None:
        """The end-of-epoch save (reported by the runner's callback) answers a request that
        came during the epoch's last batch; a planned one then holds as after its own save."""
        requests = self.trainctl.requests
        request = requests.take() if requests is not None else None
        if request is not None and request["kind"] == "planned" and request["hold"]:
            self._tc_hold()

    def _tc_hold(self) -> None:
        """After a planned save the agent kills and restarts from it: take no batch that
        would be redone.  Bounded (PLANNED_HOLD_S): without a kill, training goes on."""
        end = time.monotonic() + PLANNED_HOLD_S
        while time.monotonic() < end:
            time.sleep(0.1)

    def _tc_rescue_while_blocked(self, request: dict[str, Any]) -> None:
        """From the SIGUSR1 handler, while the main thread waits for a batch."""
        if self.trainctl.requests is not None:
            self.trainctl.requests.pending = False
        self._tc_save(request["kind"], request)

    def _tc_batch_end(self, stepped: bool) -> None:
        """After a batch's bookkeeping: a requested save, else a periodic one when due;
        both only right after an optimizer step."""
        if not stepped:
            return
        if self._tc_pos.get("batch", 0) >= len(self.train_loader):
            return   # the epoch's last batch: the end-of-epoch save follows and answers a request
        requests = self.trainctl.requests
        request = requests.take() if requests is not None else None
        if request is not None:
            self._tc_save(request["kind"], request)
            if request["kind"] == "planned" and request["hold"]:
                self._tc_hold()   # the agent kills us now: take no batch it would redo
        elif (every := self.trainctl.every()) > 0 and time.monotonic() - self._tc_last_save >= every:
            self._tc_save("periodic")

    def _tc_fetch(self, loader: Any, start: int, nb: int) -> Iterator[tuple[int, Any]]:
        """(i, batch) for i in start..nb-1, marking the wait for each batch."""
        it = iter(loader)
        requests = self.trainctl.requests
        sampler = self._tc_sampler()
        for i in range(start, nb):
            if requests is not None:
                requests.on_blocked = self._tc_rescue_while_blocked
            try:
                batch = next(it)
            except StopIteration:
                return
            finally:
                if requests is not None:
                    requests.on_blocked = None
            if i == start and sampler is not None:
                # this epoch's pass has begun by now: the generator state its order came from
                self._tc_epoch_state = sampler.passes.popleft() if sampler.passes else None
            yield i, batch

    def _tc_trace(self, epoch: int, i: int, batch: Any, stepped: bool) -> None:
        path = os.environ.get(TRACE_ENV)
        if not path:
            return
        line = {"epoch": epoch + 1, "batch": i + 1, "step": stepped, "files": list(batch.get("im_file", ())),
                "loss": float(self.loss.detach()) if self.loss is not None else None,
                "lr": [g["lr"] for g in self.optimizer.param_groups], "accumulate": self.accumulate}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")

    # -- the loop
    def _do_train(self):
        """Ultralytics 8.4.190's ``BaseTrainer._do_train`` (single process), with its
        batch index, last optimizer step and running loss resumable (``trainctl:``)."""
        if self.world_size > 1:   # trainctl: DDP keeps Ultralytics' own loop
            return super()._do_train()
        from ultralytics import __version__
        from ultralytics.engine.trainer import LOGGER, RANK, TQDM, autocast, colorstr, unwrap_model
        self._tc_version = __version__
        self._setup_train()

        nb = len(self.train_loader)  # number of batches
        nw = self._get_warmup_iterations(nb)
        last_opt_step = -1
        acc0 = self.accumulate
        self.epoch_time = None
        self.epoch_time_start = time.time()
        self.train_time_start = time.time()
        self._tc_last_save = time.monotonic()   # trainctl
        self._tc_steps = 0
        self._tc_epoch_state = None
        mid = self._tc_mid                      # trainctl: resuming inside this epoch
        resumed_from = None
        if mid is not None:
            resumed_from = self._tc_resume_point(mid, nb)
            if resumed_from is not None:
                last_opt_step = resumed_from[0] + nb * self.start_epoch - 1
        self.run_callbacks("on_train_start")
        LOGGER.info(
            f"Using {len(self.train_loader.dataset)} train, {len(self.test_loader.dataset)} val images for "
            f"fraction={self.args.fraction} at imgsz={self.args.imgsz}\n"
            f"Using {self.train_loader.num_workers * (self.world_size or 1)} dataloader workers\n"
            f"Logging results to {colorstr('bold', self.save_dir)}\n"
            f"Starting training for " + (f"{self.args.time} hours..." if self.args.time else f"{self.epochs} epochs...")
        )
        if self.args.close_mosaic:
            base_idx = (self.epochs - self.args.close_mosaic) * nb
            self.plot_idx.extend([base_idx, base_idx + 1, base_idx + 2])
        epoch = self.start_epoch
        mosaic_closed = not self.args.close_mosaic
        self.optimizer.zero_grad()
        self._oom_retries = 0
        while True:
            self.epoch = epoch
            self.run_callbacks("on_train_epoch_start")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.scheduler.step()

            self._model_train()
            if not mosaic_closed and epoch >= self.epochs - self.args.close_mosaic:
                mosaic_closed = True
                self._close_dataloader_mosaic()
                self.train_loader.reset()

            # trainctl: where this epoch starts, and the sampler state its order comes from
            i0, samples = (resumed_from[0], resumed_from[1]) if resumed_from is not None else (0, 0)
            self._tc_epoch_begin(epoch, i0, samples, resumed_from)
            if RANK in {-1, 0} and self.loss_names:
                LOGGER.info(self.progress_string())
            pbar = TQDM(self._tc_fetch(self.train_loader, i0, nb), total=nb - i0)
            if resumed_from is None:
                self.tloss = None
            resumed_from = None
            consumed = samples
            for i, batch in pbar:
                consumed += len(batch["im_file"]) if "im_file" in batch else int(batch["img"].shape[0])
                self.run_callbacks("on_train_batch_start")
                ni = i + nb * epoch
                if nw and ni <= nw:
                    xi = [0, nw]
                    self.accumulate = max(1, int(np.interp(ni, xi, [1, acc0]).round()))
                    for x in self.optimizer.param_groups:
                        x["lr"] = float(
                            np.interp(
                                ni,
                                xi,
                                [
                                    self.args.warmup_bias_lr if x.get("param_group") == "bias" else 0.0,
                                    x["initial_lr"] * self.lf(epoch),
                                ],
                            )
                        )
                        if "momentum" in x:
                            x["momentum"] = float(np.interp(ni, xi, [self.args.warmup_momentum, self.args.momentum]))

                try:
                    with autocast(torch.bfloat16 if self.args.amp == "bf16" else self.amp, device=self.device.type):
                        batch = self.preprocess_batch(batch)
                        if self.args.compile:
                            preds = self.model(batch["img"])
                            loss, self.loss_items = unwrap_model(self.model).loss(batch, preds)
                        else:
                            loss, self.loss_items = self.model(batch)
                        self.loss = loss.sum()
                        if not self.loss_names:
                            self.loss_names = tuple(self.loss_items)
                            if RANK in {-1, 0}:
                                LOGGER.info(self.progress_string())
                                self.metrics.update(dict.fromkeys(self.label_loss_items(prefix="val"), 0.0))
                        self.tloss = (
                            self.loss_items
                            if self.tloss is None
                            else {k: (self.tloss[k] * i + v) / (i + 1) for k, v in self.loss_items.items()}
                        )

                    self.scaler.scale(self.loss).backward()
                except RuntimeError as e:
                    is_oom = "out of memory" in str(e).lower()
                    if not is_oom and not any(
                        s in str(e)
                        for s in ("CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_INTERNAL_ERROR", "unable to find an engine")
                    ):
                        raise
                    # trainctl: no auto-reduce in an epoch resumed mid-way (it would redo the epoch)
                    if epoch > self.start_epoch or self._oom_retries >= 3 or mid is not None:
                        raise
                    self._oom_retries += 1
                    old_batch = self.batch_size
                    self.args.batch = self.batch_size = max(self.batch_size // 2, 1)
                    error = f"{self.device.type.upper()} out of memory" if is_oom else "CUDA backend memory error"
                    LOGGER.warning(
                        f"{error} with batch={old_batch}. "
                        f"Reducing to batch={self.batch_size} and retrying ({self._oom_retries}/3)."
                    )
                    batch = loss = preds = None
                    self.loss = self.loss_items = self.tloss = None
                    if hasattr(self.train_loader, "close"):
                        self.train_loader.close()
                    self._clear_memory()
                    self._build_train_pipeline()
                    mosaic_closed = not self.args.close_mosaic
                    self.validator.dataloader = self.test_loader
                    self.scheduler.last_epoch = self.start_epoch - 1
                    nb = len(self.train_loader)
                    nw = self._get_warmup_iterations(nb)
                    last_opt_step = -1
                    acc0 = self.accumulate
                    self.optimizer.zero_grad()
                    break
                stepped = False   # trainctl
                if ni - last_opt_step >= self.accumulate:
                    self.optimizer_step()
                    last_opt_step = ni
                    stepped = True   # trainctl: the position a save holds
                    self._tc_steps += 1
                    self._tc_pos = {"batch": i + 1, "samples": consumed, "steps": self._tc_steps,
                                    "tloss": self.tloss, "rng": _rng_state()}

                    if self.args.time:
                        self.stop = (time.time() - self.train_time_start) > (self.args.time * 3600)
                        if self.stop:
                            break

                if RANK in {-1, 0}:
                    loss_length = len(self.tloss)
                    pbar.set_description(
                        ("%11s" * 2 + "%11.4g" * (2 + loss_length))
                        % (
                            f"{epoch + 1}/{self.epochs}",
                            f"{self._get_memory():.3g}G",
                            *self.tloss.values(),
                            batch.get("cls", batch["img"]).shape[0],
                            batch["img"].shape[-1],
                        )
                    )
                    if self.args.plots and ni in self.plot_idx:
                        self.plot_training_samples(batch, ni)

                self.trainctl_batch = i + 1   # trainctl: the true batch, for progress events
                self._tc_trace(epoch, i, batch, stepped)
                self.run_callbacks("on_train_batch_end")
                self._tc_batch_end(stepped)   # trainctl
                if self.stop:
                    break
            else:
                self._oom_retries = 0

            if self._oom_retries and not self.stop:
                continue

            if hasattr(unwrap_model(self.model).criterion, "update"):
                unwrap_model(self.model).criterion.update()

            self.lr = {f"lr/pg{ir}": x["lr"] for ir, x in enumerate(self.optimizer.param_groups)}

            self.run_callbacks("on_train_epoch_end")
            if RANK in {-1, 0}:
                self.ema.update_attr(self.model, include=["yaml", "nc", "args", "names", "stride", "class_weights"])

            final_epoch = epoch + 1 >= self.epochs
            if self.args.val or final_epoch or self.stopper.possible_stop or self.stop:
                self._clear_memory(None if self.device.type == "mps" else 0.5)
                self.metrics, self.fitness = self.validate()

            if self._handle_nan_recovery(epoch):
                last_opt_step = -1
                self.optimizer.zero_grad()
                continue

            self.nan_recovery_attempts = 0
            if RANK in {-1, 0}:
                self.save_metrics(metrics={**self.label_loss_items(self.tloss), **self.metrics, **self.lr})
                self.stop |= self.stopper(epoch + 1, self.fitness) or final_epoch
                if self.args.time:
                    self.stop |= (time.time() - self.train_time_start) > (self.args.time * 3600)

                if (self.args.save or final_epoch) and self.save_model():
                    self.run_callbacks("on_model_save")
                    self._tc_last_save = time.monotonic()   # trainctl: the next mid-epoch save counts from here
                    self._tc_epoch_saved()   # trainctl

            t = time.time()
            self.epoch_time = t - self.epoch_time_start
            self.epoch_time_start = t
            if self.args.time:
                mean_epoch_time = (t - self.train_time_start) / (epoch - self.start_epoch + 1)
                self.epochs = self.args.epochs = math.ceil(self.args.time * 3600 / mean_epoch_time)
                nw = self._get_warmup_iterations(nb)
                self._setup_scheduler()
                self.scheduler.last_epoch = self.epoch
                self.stop |= epoch >= self.epochs
            self.run_callbacks("on_fit_epoch_end")
            self._clear_memory(None if self.device.type == "mps" else 0.5)

            if self.stop:
                break
            epoch += 1

        seconds = time.time() - self.train_time_start
        LOGGER.info(f"\n{epoch - self.start_epoch + 1} epochs completed in {seconds / 3600:.3f} hours.")
        self.final_eval()
        if RANK in {-1, 0}:
            if self.args.plots:
                self.plot_metrics()
            self.run_callbacks("on_train_end")
        self._clear_memory()
        for loader in (self.train_loader, self.test_loader):
            if hasattr(loader, "close"):
                loader.close()

    def _tc_resume_point(self, mid: dict[str, Any], nb: int) -> tuple[int, int] | None:
        """(first batch index, samples consumed) to resume epoch ``start_epoch`` at, with the
        sampler set to give the rest of that epoch's order; None: start it over."""
        from ultralytics.utils import LOGGER
        sampler = self._tc_sampler()
        state = mid.get("sampler_state")
        samples = int(mid.get("samples") or 0)
        n = len(sampler) if sampler is not None else 0
        if sampler is None or not isinstance(state, torch.Tensor) or not 0 <= samples < n:
            if samples:
                LOGGER.warning("trainctl: cannot restore the sample order; the epoch starts over")
            self._tc_mid = None
            return None
        sampler.resume = (state, samples)
        left = _batches_of(n - samples, self.train_loader.batch_size, self.train_loader.drop_last)
        i0 = nb - left
        tloss = mid.get("tloss") or {}
        self.tloss = {k: torch.tensor(v, device=self.device) for k, v in tloss.items()} or None
        self._tc_steps = int(mid.get("optimizer_steps") or 0)
        if isinstance(mid.get("rng"), dict):
            _set_rng_state(mid["rng"])
        return i0, samples

    def _tc_epoch_begin(self, epoch: int, i0: int, samples: int, resumed: tuple[int, int] | None) -> None:
        """A new loader iterator starts its own sampler passes: forget those of the old one."""
        sampler = self._tc_sampler()
        if sampler is not None and getattr(self.train_loader, "iterator", None) is None:
            sampler.passes.clear()
        self._tc_epoch_state = None
        self._tc_pos = {"batch": i0, "samples": samples, "steps": self._tc_steps, "tloss": self.tloss,
                        "rng": _rng_state()}


def trainer_class(base: type, cfg: MidEpochConfig, version: str) -> type:
    """The task's trainer with trainctl's mixin: :class:`MidEpochTrainer` on a supported
    Ultralytics, else :class:`EpochStartTrainer`."""
    mixin = MidEpochTrainer if supported(version) else EpochStartTrainer
    return type(f"Trainctl{base.__name__}", (mixin, base), {"trainctl": cfg})
