"""The Ultralytics runner: runs *inside* the training process.

    python -m trainctl.inside.ultralytics_runner --job JOB.toml [--preset PRESET.toml]
        [--resume CHECKPOINT] [--run-dir DIR]

It applies the preset natively (DataLoader keywords Ultralytics does not expose, the
preset's worker count even on CPU, torch threads, the sharing strategy, ``[train]``
arguments: :mod:`trainctl.inside.ultralytics_setup`), reports phases, progress and checkpoints through Ultralytics callbacks as
JSON lines on the file descriptor in ``TRAINCTL_EVENTS_FD`` (nothing when it is unset),
and keeps a verified copy of the last good checkpoint in ``<run_dir>/checkpoints``.

Exit status: 0 finished (or nothing left to resume), 1 training failed, 2 bad config.
"""

from __future__ import annotations

import argparse
import collections
import errno
import os
import select
import stat
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trainctl.config import ConfigError, Job, Preset, load_job, load_preset
from trainctl.core import events as E
from trainctl.inside.ultralytics_setup import install_loader, offline_env, torch_threads, train_kwargs
from trainctl.store.checkpoint import copy_and_verify, inspect_checkpoint

EVENTS_FD_ENV = "TRAINCTL_EVENTS_FD"
EVENTS_PATH_ENV = "TRAINCTL_EVENTS_PATH"
PROGRESS_INTERVAL_S = 0.1  # at most ~10 progress events a second (plus each epoch's last batch)
PROGRESS_FILE_INTERVAL_S = 0.5  # to a side-channel file, which a week-long run keeps
RATE_WINDOW = 10  # batches/s over the last this-many batches
BLOCK_LIMIT_S = 2.0  # longest a must-deliver event may wait on a full pipe
# Arguments a resumed Ultralytics run takes from the checkpoint, not from us.
_NOT_ON_RESUME = ("project", "name", "exist_ok", "model")


# ------------------------------------------------------------------ side channel


class EventSink:
    """Writes events as JSON lines to an fd; never blocks training for long.

    The fd is made non-blocking: when the reader falls behind, progress events are
    dropped and other events wait at most ``BLOCK_LIMIT_S``.  A closed pipe turns the
    sink off (training goes on).
    """

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self.dropped = 0
        self.is_file = False
        if fd is not None:
            os.set_blocking(fd, False)
            try:
                self.is_file = stat.S_ISREG(os.fstat(fd).st_mode)
            except OSError:
                pass

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> EventSink:
        """The side channel trainctl gave us: a file path (TRAINCTL_EVENTS_PATH, appended:
        it outlives the agent) or an inherited fd (TRAINCTL_EVENTS_FD, a pipe)."""
        path = environ.get(EVENTS_PATH_ENV, "").strip()
        if path:
            try:
                return cls(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW))
            except OSError as e:
                print(
                    f"trainctl runner: cannot open {EVENTS_PATH_ENV}={path!r} ({e.strerror}); "
                    "no events will be sent",
                    file=sys.stderr,
                )
                return cls(None)
        value = environ.get(EVENTS_FD_ENV, "").strip()
        if not value:
            return cls(None)
        try:
            fd = int(value)
            os.fstat(fd)
        except (ValueError, OSError):
            print(
                f"trainctl runner: {EVENTS_FD_ENV}={value!r} is not an open file descriptor; "
                "no events will be sent",
                file=sys.stderr,
            )
            return cls(None)
        return cls(fd)

    def emit(self, event: E.Event, *, droppable: bool = False) -> None:
        if self.fd is None:
            return
        data = (E.encode(event) + "\n").encode()
        deadline = time.monotonic() + BLOCK_LIMIT_S
        while data:
            try:
                n = os.write(self.fd, data)
            except BlockingIOError:
                if droppable:
                    self.dropped += 1
                    return
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([], [self.fd], [], left)[1]:
                    self.dropped += 1
                    return
                continue
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO) and self.is_file:
                    self.dropped += 1  # a full disk costs this event, not the channel
                    return
                if exc.errno not in (errno.EPIPE, errno.EBADF):
                    print(f"trainctl runner: event channel failed: {exc}", file=sys.stderr)
                self.fd = None
                return
            data, droppable = data[n:], False  # a started line must be finished


# ------------------------------------------------------------------ callbacks


def loss_dict(trainer: Any) -> dict[str, float]:
    """The running mean losses by name ("box_loss", ...): 8.4 dicts and 8.3 tensors."""
    tloss = getattr(trainer, "tloss", None)
    if tloss is None:
        return {}
    try:
        items = trainer.label_loss_items(tloss, prefix="train")
    except Exception:  # noqa: BLE001 - a missing metric is None/empty, never a crash
        return {}
    if not isinstance(items, dict):
        return {}
    out: dict[str, float] = {}
    for key, value in items.items():
        try:
            out[str(key).split("/", 1)[-1]] = float(value)
        except (TypeError, ValueError):
            continue
    return out


class Reporter:
    """The runner's Ultralytics callbacks: preset enforcement, phases, progress, checkpoints."""

    def __init__(
        self,
        sink: EventSink,
        preset: Preset | None,
        checkpoint_dir: Path | None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sink = sink
        self.preset = preset
        self.checkpoint_dir = checkpoint_dir
        self.clock = clock
        self.monotonic = monotonic
        self.threads = torch_threads(preset)
        self.workers = preset.dataloader.workers if preset is not None else None
        self.recycle_workers = preset is not None and preset.dataloader.persistent_workers is False
        self.phase: str | None = None
        self.finishing = False
        self.batch = 0
        self.times: collections.deque[float] = collections.deque(maxlen=RATE_WINDOW)
        self.last_sent = float("-inf")

    # -- helpers
    def emit_phase(self, phase: str) -> None:
        if phase != self.phase:
            self.phase = phase
            self.sink.emit(E.Phase(self.clock(), phase))

    def info(self, text: str, key: str) -> None:
        self.sink.emit(E.Info(self.clock(), text, key))

    def apply_threads(self) -> None:
        if self.threads:
            import torch

            if torch.get_num_threads() != self.threads:
                torch.set_num_threads(self.threads)

    def attach(self, model: Any) -> None:
        for event in (
            "on_pretrain_routine_start",
            "on_pretrain_routine_end",
            "on_train_start",
            "on_train_epoch_start",
            "on_train_batch_end",
            "on_train_epoch_end",
            "on_val_start",
            "on_val_end",
            "on_model_save",
            "on_fit_epoch_end",
            "on_train_end",
        ):
            model.add_callback(event, self._guarded(getattr(self, event)))

    def _guarded(self, fn: Callable[[Any], None]) -> Callable[[Any], None]:
        """Reporting must never break training: a failing callback is reported once."""
        failed: list[bool] = []

        def callback(obj: Any) -> None:
            try:
                fn(obj)
            except Exception as exc:  # noqa: BLE001
                if not failed:
                    failed.append(True)
                    msg = f"trainctl runner: {fn.__name__} failed: {type(exc).__name__}: {exc}"
                    print(msg, file=sys.stderr)
                    self.info(msg, "runner.callback_error")

        callback.__name__ = fn.__name__
        return callback

    # -- preset enforcement
    def on_pretrain_routine_start(self, trainer: Any) -> None:
        """Runs after Ultralytics forced workers=0 on CPU and after select_device."""
        if self.workers is not None:
            trainer.args.workers = self.workers
        self.apply_threads()
        if getattr(trainer, "save_dir", None):  # where the results go: the dashboard, `status`
            self.sink.emit(E.results_info(self.clock(), str(trainer.save_dir)))

    def on_pretrain_routine_end(self, trainer: Any) -> None:
        self.apply_threads()

    def on_train_start(self, trainer: Any) -> None:
        self.apply_threads()
        loader = trainer.train_loader
        nw = getattr(loader, "num_workers", 0)
        parts = [f"{nw} DataLoader worker{'s' if nw != 1 else ''}"]
        if nw:
            start_method = getattr(getattr(loader, "multiprocessing_context", None), "get_start_method", None)
            ctx_name = start_method() if start_method is not None else "default"
            per_epoch = "new each epoch" if self.recycle_workers else "kept across epochs"
            parts += [f"{ctx_name} start", f"prefetch {loader.prefetch_factor}", per_epoch]
        import torch

        parts.append(f"{torch.get_num_threads()} torch threads")
        name = self.preset.name if self.preset is not None else "none"
        self.info(f"preset {name}: " + ", ".join(parts), "runner.preset")

    # -- phases and progress
    def on_train_epoch_start(self, trainer: Any) -> None:
        if self.recycle_workers and trainer.epoch > trainer.start_epoch:
            trainer.train_loader.reset()  # persistent_workers = false: new workers each epoch
        self.apply_threads()
        self.batch = 0
        self.times.clear()
        self.emit_phase("train")

    def on_train_batch_end(self, trainer: Any) -> None:
        # The true batch within the epoch (a resumed epoch starts past 0), else a count.
        self.batch = getattr(trainer, "trainctl_batch", None) or self.batch + 1
        now = self.monotonic()
        self.times.append(now)
        batches = len(trainer.train_loader)
        last = self.batch >= batches
        if not last and now - self.last_sent < (
            PROGRESS_FILE_INTERVAL_S if getattr(self.sink, "is_file", False) else PROGRESS_INTERVAL_S
        ):
            return
        self.last_sent = now
        rate = None
        if len(self.times) >= 2 and self.times[-1] > self.times[0]:
            rate = (len(self.times) - 1) / (self.times[-1] - self.times[0])
        self.sink.emit(
            E.Progress(
                self.clock(), trainer.epoch + 1, trainer.epochs, self.batch, batches, loss_dict(trainer), rate
            ),
            droppable=not last,
        )

    def on_train_epoch_end(self, trainer: Any) -> None:
        final = trainer.epoch + 1 >= trainer.epochs
        stopper = getattr(trainer, "stopper", None)
        validates = (
            trainer.args.val
            or final
            or getattr(stopper, "possible_stop", False)
            or getattr(trainer, "stop", False)
        )
        if not validates:
            self.emit_phase("save")

    def on_val_start(self, validator: Any) -> None:
        self.apply_threads()  # a standalone validator calls select_device again
        self.emit_phase("val")

    def on_val_end(self, validator: Any) -> None:
        if not self.finishing:
            self.emit_phase("save")

    def on_model_save(self, trainer: Any) -> None:
        """Copy last.pt, check the copy and keep it as last_good.pt."""
        self.emit_phase("save")
        last = Path(trainer.last)
        dest = self.checkpoint_dir or last.parent
        check = copy_and_verify(last, dest, load=True)
        detail = f"{check.detail}; copy + check {check.seconds * 1000:.0f} ms"
        self.sink.emit(E.Checkpoint(self.clock(), str(check.path), trainer.epoch + 1, check.ok, detail))
        if not check.ok:
            print(f"trainctl runner: {last} failed verification: {check.detail}", file=sys.stderr)

    def on_fit_epoch_end(self, trainer: Any) -> None:
        if getattr(trainer, "stop", False) or trainer.epoch + 1 >= trainer.epochs:
            self.finishing = True  # the final validation of best.pt comes next
        else:
            self.emit_phase("train")

    def on_train_end(self, trainer: Any) -> None:
        cfg = getattr(trainer, "trainctl", None)
        saves = getattr(cfg, "saves", None)
        if saves:
            took = time.time() - trainer.train_time_start
            self.info(
                f"{len(saves)} mid-epoch saves paused training {sum(saves):.2f} s in all "
                f"(mean {sum(saves) / len(saves) * 1000:.0f} ms, max {max(saves) * 1000:.0f} ms), "
                f"{sum(saves) / max(took, 1e-9) * 100:.2f} % of {took:.0f} s of training",
                "runner.save_pauses",
            )
        self.emit_phase("finished")


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m trainctl.inside.ultralytics_runner",
        description="Run an Ultralytics training under trainctl.",
    )
    ap.add_argument("--job", required=True, help='the job file (trainctl.toml, kind = "ultralytics")')
    ap.add_argument("--preset", help="preset name or path")
    ap.add_argument("--resume", metavar="CHECKPOINT", help="resume from this checkpoint")
    ap.add_argument(
        "--trust-checkpoint",
        action="append",
        default=[],
        metavar="PATH",
        help="unpickle this checkpoint even if the checkpoint gate refuses it (repeatable)",
    )
    ap.add_argument("--run-dir", help="run directory (checkpoints/, yolo_config/, Ultralytics results)")
    ap.add_argument(
        "--checkpoint-every",
        type=float,
        metavar="SECONDS",
        help="seconds between mid-epoch saves (0: none); default: the job's checkpoint_every",
    )
    return ap.parse_args(argv)


def _load_config(args: argparse.Namespace) -> tuple[Job, Preset | None]:
    job = load_job(args.job)
    if job.kind != "ultralytics":
        raise ConfigError(str(job.path), "kind", f'must be "ultralytics" for this runner (got {job.kind!r})')
    preset = load_preset(args.preset, job.preset_dirs) if args.preset else job.load_preset()
    return job, preset


def resume_plan(
    sink: EventSink, ckpt: Path, mid_epoch_ok: bool = True, trusted: Sequence[str] = ()
) -> int | None:
    """None to go on resuming; an exit status when there is nothing to resume (or the
    checkpoint gate refuses it: Ultralytics would unpickle it in full)."""
    check = inspect_checkpoint(ckpt, load=True, trusted=trusted)
    if check.complete:
        done = (
            f"epoch {check.epoch + 1} of {check.epochs}"
            if check.epoch is not None and check.epoch >= 0
            else "a finished run (epoch -1)"
        )
        sink.emit(
            E.Info(
                time.time(),
                f"nothing to resume: {ckpt} is from {done}; the run is complete",
                "runner.resume_complete",
            )
        )
        sink.emit(E.Phase(time.time(), "finished"))
        print(f"trainctl runner: nothing to resume, {ckpt} is from {done}", flush=True)
        return 0
    if not check.ok:
        msg = f"cannot resume from {ckpt}: {check.detail}"
        sink.emit(E.Info(time.time(), msg, "runner.resume_failed"))
        print(f"trainctl runner: {msg}", file=sys.stderr)
        return 1
    epoch = check.epoch
    assert epoch is not None  # an ok check read the checkpoint's epoch (>= 0)
    of = f" of {check.epochs}" if check.epochs else ""
    if check.mid_epoch and mid_epoch_ok:
        where = f"at epoch {epoch + 1}{of}, batch {check.batch} ({check.samples} samples done)"
    elif check.mid_epoch:
        from trainctl.inside.ultralytics_trainer import SUPPORTED

        where = f"at the start of epoch {epoch + 1}{of}"
        sink.emit(
            E.Info(
                time.time(),
                f"{ckpt} was saved inside epoch {epoch + 1} (batch {check.batch}), "
                f"but resuming inside an epoch needs Ultralytics {' or '.join(SUPPORTED)}x: "
                f"epoch {epoch + 1} starts over",
                "runner.resume_epoch_start",
            )
        )
    else:
        where = f"at epoch {epoch + 2}{of}"
    sink.emit(E.Info(time.time(), f"resuming from {ckpt} {where}", "runner.resume"))
    return None


def mid_epoch_supported(sink: EventSink, version: str) -> bool:
    """Whether this Ultralytics gets mid-epoch saves and resume (said when it does not)."""
    from trainctl.inside import ultralytics_trainer as ut

    if ut.supported(version):
        return True
    sink.emit(
        E.Info(
            time.time(),
            f"Ultralytics {version}: no mid-epoch saves or resume (trainctl "
            f"supports them on {' or '.join(ut.SUPPORTED)}x)",
            "runner.mid_epoch_unsupported",
        )
    )
    return False


def supervise_model(
    model: Any,
    kwargs: dict[str, Any],
    sink: EventSink,
    preset: Preset | None,
    run_dir: Path | None,
    every: float,
    version: str,
    trainer: type | None = None,
) -> None:
    """What trainctl adds to one ``model.train(**kwargs)``: its callbacks on ``model`` (once
    a model), save on request (from the main thread), and, on one device, the trainer class
    with mid-epoch saves (``kwargs["trainer"]``, over ``trainer`` when the caller gave one)."""
    from trainctl.inside import ultralytics_trainer as ut

    checkpoints = run_dir / "checkpoints" if run_dir else None
    if not getattr(model, "_trainctl_reporter", None):
        model._trainctl_reporter = Reporter(sink, preset, checkpoints)
        model._trainctl_reporter.attach(model)
    requests = None
    if threading.current_thread() is threading.main_thread():
        requests = ut.SaveRequests(run_dir)
        requests.install()
        sink.emit(E.Info(time.time(), "save on request", key="runner.save_on_request"))
    if "," not in str(kwargs.get("device", "")):  # multi-GPU (DDP) keeps Ultralytics' own trainer
        cfg = ut.MidEpochConfig(sink, checkpoints, every, requests, follow=ut.follower(run_dir, every))
        kwargs["trainer"] = ut.trainer_class(trainer or model._smart_load("trainer"), cfg, version)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sink = EventSink.from_env()
    sink.emit(E.Phase(time.time(), "startup"))
    try:
        job, preset = _load_config(args)
    except ConfigError as exc:
        print(f"trainctl runner: {exc}", file=sys.stderr)
        sink.emit(E.Info(time.time(), str(exc), "runner.config_error"))
        return 2
    where = args.run_dir or os.environ.get("TRAINCTL_RUN_DIR")
    run_dir = Path(where).expanduser().absolute() if where else None
    offline_env(run_dir)

    from ultralytics import YOLO, __version__  # after offline_env: it reads the environment at import

    install_loader(preset)
    kwargs = train_kwargs(job, preset, run_dir)
    every = job.checkpoint_every if args.checkpoint_every is None else max(args.checkpoint_every, 0.0)
    mid_ok = mid_epoch_supported(sink, __version__)
    if args.resume:
        ckpt = Path(args.resume).expanduser().absolute()
        status = resume_plan(sink, ckpt, mid_ok, args.trust_checkpoint)
        if status is not None:
            return status
        model = YOLO(str(ckpt))
        for key in _NOT_ON_RESUME:
            kwargs.pop(key, None)
        kwargs["resume"] = True
    else:
        model = YOLO(kwargs.pop("model"))
    supervise_model(model, kwargs, sink, preset, run_dir, every, __version__)
    try:
        model.train(**kwargs)
    except Exception as exc:
        sink.emit(E.Info(time.time(), f"training failed: {type(exc).__name__}: {exc}", "runner.failed"))
        raise
    return 0


if __name__ == "__main__":
    # Run main() from the importable module (not from __main__), so that what spawn
    # workers unpickle (WorkerInit) is found under its real name.
    from trainctl.inside.ultralytics_runner import main as _main

    sys.exit(_main())
