"""The embedded demo: a tiny synthetic detection data set and a job that trains on it.

``make_dataset`` writes 64x64 JPEGs of red and blue rectangles on a noisy background
with YOLO labels; ``make_demo_job`` writes a ``trainctl.toml`` that trains YOLOv8n on it
on CPU, offline, with copies of the packaged presets A and B next to it.  Both are
idempotent and safe to call from several processes at once (the data set is built in a
temporary directory and renamed into place).  The caller chooses the root (the CLI uses
``paths.cache_dir() / "demo"``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

from trainctl.core.statefile import write_atomic

__all__ = [
    "CLASSES",
    "DEMO_EPOCHS",
    "DEMO_EPOCH_S",
    "demo_length_text",
    "DEMO_TRAIN_IMAGES",
    "DEMO_VAL_IMAGES",
    "make_dataset",
    "make_demo_job",
]

CLASSES = ("red", "blue")
_COLOURS = ((220, 40, 40), (40, 60, 220))
_STAMP = "trainctl-dataset.json"

# Sized so that one epoch takes roughly 10-20 s on 2 CPU cores (120 batches of 4 at
# imgsz 64, about 10 batches/s; preset A adds a few seconds per epoch to spawn its
# workers); DEMO_EPOCHS of them make a demo of a few minutes, long enough to try every key
# of the dashboard (`trainctl demo --epochs N` for another length).
DEMO_TRAIN_IMAGES = 480
DEMO_VAL_IMAGES = 16
DEMO_EPOCHS = 18
DEMO_EPOCH_S = (10, 20)
"""What one demo epoch takes on 2 CPU cores, about (seconds): what `trainctl demo` says."""


def _draw_image(rng, size: int):
    """One image (a PIL Image) and its label lines."""
    import numpy as np
    from PIL import Image

    pixels = rng.integers(90, 166, size=(size, size, 3), dtype=np.uint8)
    lines = []
    for _ in range(int(rng.integers(1, 4))):
        cls = int(rng.integers(0, len(CLASSES)))
        w, h = (int(v) for v in rng.integers(size // 6, size // 2, size=2))
        x0 = int(rng.integers(0, size - w))
        y0 = int(rng.integers(0, size - h))
        pixels[y0 : y0 + h, x0 : x0 + w] = _COLOURS[cls]
        lines.append(
            f"{cls} {(x0 + w / 2) / size:.6f} {(y0 + h / 2) / size:.6f} {w / size:.6f} {h / size:.6f}"
        )
    return Image.fromarray(pixels), lines


def _write_split(root: Path, split: str, count: int, size: int, rng) -> None:
    images, labels = root / "images" / split, root / "labels" / split
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    for i in range(count):
        image, lines = _draw_image(rng, size)
        image.save(images / f"{split}_{i:04d}.jpg", quality=90)
        (labels / f"{split}_{i:04d}.txt").write_text("\n".join(lines) + "\n")


def _data_yaml(root: Path) -> str:
    names = "\n".join(f"  {i}: {name}" for i, name in enumerate(CLASSES))
    return (
        f"# Synthetic demo data set written by trainctl (no download key: it works offline).\n"
        f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n{names}\n"
    )


def make_dataset(root: Path, n_train: int = 24, n_val: int = 8, size: int = 64, seed: int = 0) -> Path:
    """Write the data set under ``root`` (once) and return its ``data.yaml``.

    Deterministic for given arguments; a data set made with other arguments is replaced.
    """
    import numpy as np

    root = Path(root).expanduser().absolute()
    params = {
        "n_train": n_train,
        "n_val": n_val,
        "size": size,
        "seed": seed,
        "classes": list(CLASSES),
        "version": 1,
    }
    data_yaml = root / "data.yaml"
    if _stamp_matches(root, params) and data_yaml.is_file():
        return data_yaml

    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    try:
        rng = np.random.default_rng(seed)
        _write_split(tmp, "train", n_train, size, rng)
        _write_split(tmp, "val", n_val, size, rng)
        (tmp / "data.yaml").write_text(_data_yaml(root))
        (tmp / _STAMP).write_text(json.dumps(params, sort_keys=True))
        _swap_into_place(tmp, root, params)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return data_yaml


def _stamp_matches(root: Path, params: dict) -> bool:
    try:
        return json.loads((root / _STAMP).read_text()) == params
    except (OSError, ValueError):
        return False


def _swap_into_place(tmp: Path, root: Path, params: dict) -> None:
    """Rename ``tmp`` to ``root``; a concurrent builder that got there first wins."""
    for _ in range(3):
        try:
            os.rename(tmp, root)
            return
        except OSError:
            if _stamp_matches(root, params):
                return  # someone else built the same data set meanwhile
            if root.exists() and not (root / _STAMP).exists() and any(root.iterdir()):
                raise FileExistsError(
                    f"{root} exists and is not a trainctl demo data set; choose another directory"
                ) from None
            old = root.with_name(f".{root.name}-old-{os.getpid()}")
            try:
                os.rename(root, old)
            except FileNotFoundError:
                continue
            shutil.rmtree(old, ignore_errors=True)
    raise OSError(f"could not put the demo data set in place at {root}")


def _toml_str(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _job_text(data_yaml: Path, project: Path, epochs: int) -> str:
    return f"""\
# The trainctl demo: a real YOLOv8n training on a synthetic data set, on CPU and offline.
# Written by `trainctl demo`; edit the presets in presets/ to see their effect.
kind = "ultralytics"
name = "demo"
description = "YOLOv8n on {DEMO_TRAIN_IMAGES} synthetic 64x64 images (red and blue boxes), CPU"
preset = "A"                 # fast: 2 spawned DataLoader workers
fallback = "B"               # safe: workers = 0, used after a stall
cost_per_hour = 1.57         # what the box would cost: shows the cost projection
budget = 5.0
max_restarts = 3

[ultralytics]
model = "yolov8n.yaml"       # built from scratch: nothing to download
data = {_toml_str(str(data_yaml))}
epochs = {int(epochs)}
imgsz = 64
batch = 4
device = "cpu"
project = {_toml_str(str(project))}

[stall]
startup_timeout = 120.0
"""


def _write_if_changed(path: Path, text: str) -> None:
    try:
        if path.read_text(encoding="utf-8") == text:
            return
    except OSError:
        pass
    write_atomic(path, text, durable=False)


def demo_length_text(epochs: int) -> str:
    """What the demo will take, and how to change it, in one line."""
    lo, hi = (epochs * s for s in DEMO_EPOCH_S)
    span = f"{lo // 60}-{-(-hi // 60)} minutes" if hi >= 120 else f"{lo}-{hi} s"
    enough = ": long enough to try every key" if epochs >= DEMO_EPOCHS else ""
    return (
        f"the demo trains {epochs} epoch{'s' if epochs != 1 else ''} (about {span} on 2 CPU "
        f"cores){enough}; `trainctl demo --epochs N` (`make demo EPOCHS=N`) for a shorter or "
        "longer one"
    )


def make_demo_job(root: Path, epochs: int = DEMO_EPOCHS) -> Path:
    """Write the demo job under ``root`` and return its ``trainctl.toml``.

    Layout: ``data/`` (the data set), ``presets/A.toml`` and ``B.toml`` (copied from the
    packaged ones when missing, so the user's edits survive), ``runs/`` (the Ultralytics
    project) and ``trainctl.toml``.
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1 (got {epochs})")
    root = Path(root).expanduser().absolute()
    root.mkdir(parents=True, exist_ok=True)
    data_yaml = make_dataset(root / "data", n_train=DEMO_TRAIN_IMAGES, n_val=DEMO_VAL_IMAGES)
    presets = root / "presets"
    presets.mkdir(exist_ok=True)
    packaged = resources.files("trainctl.presets")
    for name in ("A.toml", "B.toml"):
        if not (presets / name).exists():
            _write_if_changed(presets / name, packaged.joinpath(name).read_text(encoding="utf-8"))
    job = root / "trainctl.toml"
    _write_if_changed(job, _job_text(data_yaml, root / "runs", epochs))
    return job
