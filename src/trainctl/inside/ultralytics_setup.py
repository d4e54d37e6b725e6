"""The Ultralytics runner's setup of the training process: runs *inside* it, before the
training.  The preset applied natively: DataLoader keywords Ultralytics does not expose,
the preset's worker count even on CPU, torch threads, the sharing strategy, ``[train]``
arguments; and an offline environment (no downloads, the font provided).  Used by
:mod:`trainctl.inside.ultralytics_runner` and :mod:`trainctl.inside.ultralytics`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainctl.config import Job, Preset
from trainctl.core.statefile import atomic_path

# ------------------------------------------------------------------ environment


def offline_env(run_dir: Path | None, environ: dict[str, str] | os._Environ = os.environ) -> None:
    """Defaults that keep Ultralytics off the network; call before importing it."""
    environ.setdefault("YOLO_OFFLINE", "1")
    environ.setdefault("YOLO_AUTOINSTALL", "False")
    environ.setdefault("ULTRALYTICS_SKIP_REQUIREMENTS_CHECKS", "1")
    if run_dir is not None:
        environ.setdefault("YOLO_CONFIG_DIR", str(run_dir / "yolo_config"))
    if environ.get("YOLO_CONFIG_DIR"):
        _provide_font(Path(environ["YOLO_CONFIG_DIR"]).expanduser() / "Ultralytics" / "Arial.ttf")


def _find_font() -> Path | None:
    candidates = []
    spec = importlib.util.find_spec("matplotlib")
    if spec is not None and spec.submodule_search_locations:
        base = Path(list(spec.submodule_search_locations)[0])
        candidates.append(base / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf")
    candidates += [
        Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"),
        Path("/usr/share/fonts/TTF/DejaVuSans.ttf"),
    ]
    return next((p for p in candidates if p.is_file()), None)


def _provide_font(dest: Path) -> None:
    """Put a font where Ultralytics looks for Arial.ttf, so it does not try to download one."""
    if dest.exists():
        return
    font = _find_font()
    if font is None:
        return
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(dest, 0o644, durable=False) as tmp:
            shutil.copyfile(font, tmp)
    except OSError:
        pass


def torch_threads(preset: Preset | None) -> int | None:
    """The torch intra-op thread count the preset asks for.

    ``torch_num_threads``, else ``omp_num_threads``: Ultralytics' ``select_device``
    overrides what OMP_NUM_THREADS gave torch, so the runner restores it.
    """
    if preset is None:
        return None
    return preset.threads.torch_num_threads or preset.threads.omp_num_threads


def preset_train_args(preset: Preset | None) -> dict[str, Any]:
    """The ``model.train()`` keywords a preset sets: its ``[train]`` and its workers."""
    kw: dict[str, Any] = {}
    if preset is not None:
        kw.update(preset.train)
        if preset.dataloader.workers is not None:
            kw["workers"] = preset.dataloader.workers
    return kw


def train_kwargs(job: Job, preset: Preset | None, run_dir: Path | None) -> dict[str, Any]:
    """``model.train()`` keywords: the job's table, the preset's ``[train]`` over it,
    the preset's workers, ``plots=False`` unless asked, and where results go."""
    kw: dict[str, Any] = dict(job.ultralytics)
    kw.update(preset_train_args(preset))
    kw.setdefault("plots", False)
    if run_dir is not None:
        if "project" in kw:
            kw["name"] = run_dir.name  # <project>/<run dir name>
        else:
            kw["project"], kw["name"] = str(run_dir), "ultralytics"
        kw["exist_ok"] = True  # attempts of one run share it
    else:
        kw["name"] = job.name
    return kw


def loader_overrides(preset: Preset | None) -> dict[str, Any]:
    """DataLoader keywords the preset sets that Ultralytics does not expose."""
    if preset is None:
        return {}
    kw = preset.dataloader_kwargs()
    kw.pop("num_workers", None)  # Ultralytics computes it from workers (set through args)
    return kw


class WorkerInit:
    """A DataLoader ``worker_init_fn`` that applies the sharing strategy in the worker
    (a spawned worker does not inherit it), then runs Ultralytics' own init.

    With ``file_system`` the worker starts a ``torch_shm_manager`` (fork + exec) that
    would inherit the worker's end of multiprocessing's exit sentinel pipe and outlive
    the worker: every worker shutdown (each epoch with non-persistent workers, and at
    the end) then waits out torch's 5 s join timeout.  Marking the worker's inherited
    descriptors close-on-exec first avoids that.
    """

    def __init__(self, sharing_strategy: str | None, inner: Callable[[int], None] | None) -> None:
        self.sharing_strategy = sharing_strategy
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        if self.sharing_strategy:
            if self.sharing_strategy == "file_system":
                _close_on_exec_inherited()
            import torch.multiprocessing as mp

            mp.set_sharing_strategy(self.sharing_strategy)
        if self.inner is not None:
            self.inner(worker_id)


def _close_on_exec_inherited() -> None:
    """Make every open descriptor above stderr close-on-exec (this process keeps them)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        fd = int(name)
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass  # the listing's own descriptor, already closed


def install_loader(preset: Preset | None) -> None:
    """Make Ultralytics build its loaders with the preset's DataLoader keywords.

    ``build_dataloader`` looks ``InfiniteDataLoader`` up in its module's globals at call
    time, so replacing it there reaches every trainer and validator.
    """
    import ultralytics.data.build as build

    extra = loader_overrides(preset)
    strategy = preset.dataloader.sharing_strategy if preset is not None else None
    if strategy:
        import torch.multiprocessing as mp

        mp.set_sharing_strategy(strategy)
    if not extra and not strategy:
        return
    base = getattr(build.InfiniteDataLoader, "_trainctl_base", build.InfiniteDataLoader)

    class PresetLoader(base):  # type: ignore[misc, valid-type]
        _trainctl_base = base

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if kwargs.get("num_workers", 0) > 0:
                kwargs.update(extra)
                if strategy:
                    kwargs["worker_init_fn"] = WorkerInit(strategy, kwargs.get("worker_init_fn"))
            super().__init__(*args, **kwargs)

    build.InfiniteDataLoader = PresetLoader  # type: ignore[misc]  # the patch: build_dataloader reads this name
