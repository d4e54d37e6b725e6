"""Record a real Ultralytics CPU training as an events journal (for bench/bench_projection.py).

    .venv/bin/python tests/data/runs/record_yolo.py [OUT.jsonl]

A parent writes start/exit; the child trains yolov8n (from YAML, offline) on a synthetic
data set of 32 tiny JPEGs (24 train, 8 val) for 6 epochs and appends phase, progress and
checkpoint events from Ultralytics callbacks (epoch and batch 1-based, every batch).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
EPOCHS = 6


def make_dataset(root: Path, n_train: int = 24, n_val: int = 8, size: int = 64) -> Path:
    """Tiny JPEGs with 1-3 coloured rectangles each; labels `cls cx cy w h` (normalised)."""
    from PIL import Image, ImageDraw

    rng = random.Random(0)
    colours = [(220, 40, 40), (40, 200, 40), (40, 40, 220)]
    for split, n in (("train", n_train), ("val", n_val)):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for i in range(n):
            img = Image.new("RGB", (size, size), (rng.randrange(256),) * 3)
            draw = ImageDraw.Draw(img)
            lines = []
            for _ in range(rng.randint(1, 3)):
                w, h = rng.randint(12, 32), rng.randint(12, 32)
                x, y = rng.randint(0, size - w), rng.randint(0, size - h)
                cls = rng.randrange(3)
                draw.rectangle([x, y, x + w, y + h], fill=colours[cls])
                lines.append(
                    f"{cls} {(x + w / 2) / size:.5f} {(y + h / 2) / size:.5f} {w / size:.5f} {h / size:.5f}"
                )
            img.save(root / "images" / split / f"{i:03d}.jpg", quality=90)
            (root / "labels" / split / f"{i:03d}.txt").write_text("\n".join(lines) + "\n")
    yaml = root / "data.yaml"
    yaml.write_text(
        f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n  0: red\n  1: green\n  2: blue\n"
    )
    return yaml


def child(out: Path, data: Path, project: Path) -> None:
    from ultralytics import YOLO

    from trainctl.core import events as E

    fd = os.open(out, os.O_WRONLY | os.O_APPEND)

    def emit(ev: E.Event) -> None:
        os.write(fd, (E.encode(ev) + "\n").encode())

    state = {"batch": 0}

    def epoch_start(trainer):
        state["batch"] = 0
        emit(E.Phase(time.time(), "train"))

    def batch_end(trainer):
        state["batch"] += 1
        tloss = getattr(trainer, "tloss", None)
        losses = {str(k): round(float(v), 4) for k, v in tloss.items()} if isinstance(tloss, dict) else {}
        emit(
            E.Progress(
                time.time(),
                trainer.epoch + 1,
                trainer.epochs,
                state["batch"],
                len(trainer.train_loader),
                losses,
            )
        )

    def fit_epoch_end(trainer):
        if trainer.epoch + 1 <= trainer.epochs:  # final_eval calls this with epoch + 1
            emit(E.Checkpoint(time.time(), str(trainer.last), trainer.epoch + 1))

    model = YOLO("yolov8n.yaml")
    model.add_callback("on_train_epoch_start", epoch_start)
    model.add_callback("on_train_batch_end", batch_end)
    model.add_callback("on_val_start", lambda v: emit(E.Phase(time.time(), "val")))
    model.add_callback("on_val_end", lambda v: emit(E.Phase(time.time(), "save")))
    model.add_callback("on_fit_epoch_end", fit_epoch_end)
    model.add_callback("on_train_end", lambda t: emit(E.Phase(time.time(), "finished")))
    model.train(
        data=str(data),
        epochs=EPOCHS,
        imgsz=64,
        batch=4,
        device="cpu",
        plots=False,
        workers=0,
        project=str(project),
        name="run",
        exist_ok=True,
        verbose=False,
        amp=False,
    )


def main() -> int:
    from trainctl.core import events as E

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "yolo_cpu.jsonl"
    with tempfile.TemporaryDirectory(prefix="rec-yolo-") as tmp:
        tmp_p = Path(tmp)
        data = make_dataset(tmp_p / "data")
        out.write_text("")
        env = {
            **os.environ,
            "YOLO_OFFLINE": "1",
            "YOLO_CONFIG_DIR": str(tmp_p / "cfg"),
            "OMP_NUM_THREADS": "1",
        }
        cmd = [sys.executable, __file__, "--child", str(out), str(data), str(tmp_p / "runs")]
        proc = subprocess.Popen(
            cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        with open(out, "a") as f:
            f.write(
                E.encode(E.Start(time.time(), 1, proc.pid, "default", ("yolo", "train", "yolov8n.yaml")))
                + "\n"
            )
        _, err = proc.communicate()
        with open(out, "a") as f:
            f.write(E.encode(E.Exit(time.time(), proc.returncode)) + "\n")
        if proc.returncode != 0:
            sys.stderr.write(err.decode(errors="replace")[-4000:])
            return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
    else:
        sys.exit(main())
