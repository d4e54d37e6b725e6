"""The synthetic data sets the public scripts of bench/bench_real_scripts.py train on (no
network here): each maker writes, under a work directory, the files a script reads in the
layout it expects, under the script's working directory (the one maker's argument).
``MAKERS``: each by its name, the manifest's ``data``."""

from __future__ import annotations

import pickle
import random
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np


def image_folder(root: Path, splits: tuple[str, ...], per_class: int = 24, size: int = 32) -> None:
    """``root/<split>/<class>/<n>.png``: two classes of small random RGB images (the layout
    torchvision's ImageFolder and timm's ImageDataset read)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in splits:
        for c in ("a", "b"):
            d = root / split / c
            d.mkdir(parents=True, exist_ok=True)
            for i in range(per_class if split == splits[0] else per_class // 3):
                pixels = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(d / f"{i}.png")


def imagenet_folder(work: Path) -> None:
    image_folder(work / "data", ("train", "val"))


def timm_folder(work: Path) -> None:
    image_folder(work / "data", ("train", "validation"))


def nanogpt_bins(work: Path) -> None:
    """``data/synthetic/{train,val}.bin`` (uint16 tokens) and ``meta.pkl`` with the vocabulary
    size, what nanoGPT's ``data/*/prepare.py`` writes."""
    d = work / "data" / "synthetic"
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, n in (("train", 200_000), ("val", 20_000)):
        rng.integers(0, 65, n, dtype=np.uint16).tofile(d / f"{name}.bin")
    with open(d / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 65}, f)


def _idx(path: Path, array: np.ndarray) -> None:
    """One MNIST idx file (big-endian header: magic with the dimensions, then the sizes)."""
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def mnist_raw(root: Path, n_train: int = 60_000, n_test: int = 10_000) -> None:
    """``root/MNIST/raw/*-ubyte``: random digits in MNIST's own files (torchvision's MNIST
    reads them and downloads nothing when they are there)."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        _idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 255, (n, 28, 28)))
        _idx(raw / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, (n,)))


def pytorch_mnist(work: Path) -> None:
    mnist_raw(work.parent / "data")  # mnist/main.py reads ../data


def lightning_mnist(work: Path) -> None:
    mnist_raw(work.parent.parent / "Datasets")  # examples/pytorch/basics/ -> ../../Datasets


def char_text(work: Path) -> None:
    """``input.txt``: 200 kB of random words, what minGPT's chargpt reads."""
    rnd = random.Random(0)
    words = ["".join(rnd.choice("abcdefghij") for _ in range(rnd.randint(2, 7))) for _ in range(300)]
    (work / "input.txt").write_text(" ".join(rnd.choice(words) for _ in range(40_000)) + "\n")


def yolo_boxes(work: Path) -> None:
    from trainctl.config.demo import make_dataset

    make_dataset(work / "data", n_train=32, n_val=8, size=64)


def imagenet_tiny(work: Path) -> None:
    """imagenet/main.py DIR reads DIR/train and DIR/val (ImageFolder); the command passes
    ``data``: 2 classes x 12 train images, 2 x 4 val (one short epoch per checkpoint)."""
    image_folder(work / "data", ("train", "val"), per_class=12)


def mnist_tiny(work: Path) -> None:
    """mnist/main.py opens datasets.MNIST('../data'), relative to its cwd: 6000 train and
    1000 test random digits there."""
    mnist_raw(work.resolve().parent / "data", n_train=6000, n_test=1000)


def wikitext2_tiny(work: Path) -> None:
    """word_language_model/main.py --data ./data/wikitext-2 reads train.txt, valid.txt and
    test.txt (a sentence a line, words split on spaces): 500 random words, 40,000 train
    tokens, 4,000 valid and test tokens."""
    d = work / "data" / "wikitext-2"
    d.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(0)
    words = ["".join(rnd.choice("abcdefghijklmnop") for _ in range(rnd.randint(2, 8))) for _ in range(500)]
    for name, n in (("train", 40_000), ("valid", 4_000), ("test", 4_000)):
        lines, left = [], n
        while left > 0:
            k = min(left, rnd.randint(5, 20))
            lines.append(" " + " ".join(rnd.choice(words) for _ in range(k)) + " ")
            left -= k
        (d / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf8")


MAKERS: dict[str, Callable[[Path], None]] = {
    f.__name__: f
    for f in (
        imagenet_folder,
        imagenet_tiny,
        timm_folder,
        nanogpt_bins,
        pytorch_mnist,
        mnist_tiny,
        wikitext2_tiny,
        lightning_mnist,
        char_text,
        yolo_boxes,
    )
}
