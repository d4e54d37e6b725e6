"""Re-record the console logs in this folder (not a test; run by hand).

    .venv/bin/python tests/data/logs/record.py ultralytics84 [--long]   # real Ultralytics run on CPU
    PY_WITH_TQDM tests/data/logs/record.py tqdm|keyvalue|ultralytics83   # needs the tqdm package

Each writes raw bytes (\\r, ANSI and all) of the child's piped stdout+stderr, as trainctl reads
them.  ``ultralytics83`` is a reconstruction: the real tqdm library drawing bars in the 8.3 format
(``bar_format="{l_bar}{bar:10}{r_bar}"``, on stderr) with the 8.3 description format strings.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def make_dataset(root: Path, n_train: int, n_val: int = 4) -> Path:
    """8 train + 4 val 64x64 JPEGs with red/blue rectangles, YOLO labels, data.yaml."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("val", n_val)):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            img = np.full((64, 64, 3), 255, np.uint8)
            rows = []
            for _ in range(2):
                cls = int(rng.integers(0, 2))
                w, h = int(rng.integers(12, 28)), int(rng.integers(12, 28))
                x, y = int(rng.integers(0, 64 - w)), int(rng.integers(0, 64 - h))
                cv2.rectangle(img, (x, y), (x + w, y + h), (0, 0, 255) if cls == 0 else (255, 0, 0), -1)
                rows.append(f"{cls} {(x + w / 2) / 64:.5f} {(y + h / 2) / 64:.5f} {w / 64:.5f} {h / 64:.5f}")
            cv2.imwrite(str(root / "images" / split / f"{i}.jpg"), img)
            (root / "labels" / split / f"{i}.txt").write_text("\n".join(rows) + "\n")
    data = root / "data.yaml"
    data.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n  0: red\n  1: blue\n")
    return data


def _train(tmp: str, n_train: int, batch: int, epochs: int) -> None:
    from ultralytics import YOLO

    data = make_dataset(Path(tmp) / "ds", n_train)
    YOLO("yolov8n.yaml").train(
        data=str(data),
        epochs=epochs,
        imgsz=64,
        batch=batch,
        device="cpu",
        plots=False,
        workers=0,
        project=tmp,
        name="r",
        exist_ok=True,
    )


def _tqdm_generic() -> None:
    from tqdm import tqdm

    print("Epoch 1/2", flush=True)
    for i in tqdm(range(30), mininterval=0):  # no desc: epoch comes from the line above
        time.sleep(0.01)
    for epoch in (1, 2):
        bar = tqdm(range(40), desc=f"Epoch {epoch}", mininterval=0.05)
        for i in bar:
            time.sleep(1.2 if epoch == 1 and i < 2 else 0.005)  # slow start: s/it frames
            bar.set_postfix(loss=f"{1.0 / (i + 1 + epoch):.3g}", lr=1e-3)
        for _ in tqdm(range(10), desc="Validation DataLoader 0", mininterval=0):
            time.sleep(0.005)
    for i in tqdm((x for x in range(12)), desc="Epoch 3", mininterval=0):  # unknown total
        time.sleep(0.01)
    print("Training done", flush=True)


def _keyvalue() -> None:
    print("args: epochs=3, batch=30, lr=0.001", flush=True)
    for epoch in (1, 2):
        for b in range(1, 31, 3):
            print(f"epoch={epoch} batch={b}/30 loss={1.0 / b:.4f} lr=0.001", flush=True)
    for b in range(1, 31, 5):
        print(f"epoch 3/3 step {b}/30 loss: {0.5 / b:.4f}", flush=True)
    print("[epoch 3][batch 30/30] loss=nan", flush=True)
    print("Epoch [3/3], Step [30/30], Loss: nan", flush=True)
    print("done", flush=True)


def _ultralytics83() -> None:
    """The 8.3 console with the real tqdm library (bars on stderr, text on stdout)."""
    from tqdm import tqdm

    fmt = "{l_bar}{bar:10}{r_bar}"
    print("Ultralytics 8.3.40 🚀 Python-3.11.7 torch-2.5.1+rocm6.2 CUDA:0 (AMD Radeon RX 5700 XT, 8176MiB)")
    print("Image sizes 640 train, 640 val\nUsing 2 dataloader workers")
    print("Logging results to \x1b[1mruns/detect/train\x1b[0m\nStarting training for 3 epochs...", flush=True)
    for epoch in range(3):
        print(
            "\n" + "%11s" * 7 % ("Epoch", "GPU_mem", "box_loss", "cls_loss", "dfl_loss", "Instances", "Size"),
            flush=True,
        )
        bar = tqdm(total=20, bar_format=fmt, file=sys.stderr, mininterval=0)
        tl = [1.2 - epoch * 0.2, 0.9, 1.1]
        for i in range(20):
            time.sleep(0.02)
            loss = float("nan") if (epoch, i) >= (2, 15) else tl[0] - i * 0.01
            bar.set_description(
                ("%11s" * 2 + "%11.4g" * 5) % (f"{epoch + 1}/3", "4.21G", loss, tl[1], tl[2], 31, 640)
            )
            bar.update(1)
        bar.close()
        vbar = tqdm(
            total=4,
            bar_format=fmt,
            file=sys.stderr,
            mininterval=0,
            desc=("%22s" + "%11s" * 6) % ("Class", "Images", "Instances", "Box(P", "R", "mAP50", "mAP50-95)"),
        )
        for _ in range(4):
            time.sleep(0.01)
            vbar.update(1)
        vbar.close()
        print(("%22s" + "%11i" * 2 + "%11.3g" * 4) % ("all", 4, 8, 0.5, 0.4, 0.45, 0.3), flush=True)
    print("\n3 epochs completed in 0.002 hours.", flush=True)


def record(name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
    out = HERE / name
    with open(out, "wb") as f:
        if name == "ultralytics83_tqdm.log":
            f.write(
                b"# reconstructed: Ultralytics 8.3 console format drawn by the real tqdm 4.x library "
                b"(tests/data/logs/record.py ultralytics83); not a captured 8.3 run\n"
            )
        f.flush()
        subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, check=True, timeout=600)
    print(f"{out}: {out.stat().st_size} bytes")


def main() -> None:
    what = sys.argv[1]
    if what == "ultralytics84":
        long = "--long" in sys.argv
        with tempfile.TemporaryDirectory() as tmp:
            env = {k: v for k, v in os.environ.items() if k != "GITHUB_ACTIONS"}
            env.update(YOLO_OFFLINE="1", YOLO_CONFIG_DIR=str(Path(tmp) / "cfg"))
            args = ("48", "2", "3") if long else ("8", "4", "2")
            record(
                "ultralytics84_cpu_long.log" if long else "ultralytics84_cpu.log",
                [sys.executable, __file__, "_train", tmp, *args],
                env,
            )
    elif what == "_train":
        _train(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif what in ("tqdm", "keyvalue", "ultralytics83"):
        name = {
            "tqdm": "tqdm_generic.log",
            "keyvalue": "keyvalue.log",
            "ultralytics83": "ultralytics83_tqdm.log",
        }
        record(name[what], [sys.executable, __file__, "_" + what])
    elif what == "_tqdm":
        _tqdm_generic()
    elif what == "_keyvalue":
        _keyvalue()
    elif what == "_ultralytics83":
        _ultralytics83()
    else:
        sys.exit(f"record.py: unknown log {what!r}; allowed: ultralytics84, tqdm, keyvalue, ultralytics83")


if __name__ == "__main__":
    main()
