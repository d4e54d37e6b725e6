"""A plain Ultralytics training script, as a user writes one: nothing of trainctl in it.

    python plain_yolo.py DATA.yaml EPOCHS PROJECT

``workers=2`` is written in it (the preset decides under trainctl).  PROJECT ``-``: no
``project`` given (Ultralytics chooses where the results go).  Tests only: with
``PLAIN_YOLO_HANG_EPOCH=E`` in the environment, the main thread blocks forever as epoch E
(1-based) starts, before its first batch (after the validation and save of epoch E-1),
having written when to $TRAINCTL_RUN_DIR/hang_at."""

import os
import sys
import threading
import time

from ultralytics import YOLO

data, epochs, project = sys.argv[1], int(sys.argv[2]), sys.argv[3]
model = YOLO("yolov8n.yaml")
where = {} if project == "-" else {"project": project}
HANG_EPOCH = int(os.environ.get("PLAIN_YOLO_HANG_EPOCH") or 0)


def _hang_at_epoch_start(trainer) -> None:
    if trainer.epoch + 1 == HANG_EPOCH:
        with open(os.path.join(os.environ["TRAINCTL_RUN_DIR"], "hang_at"), "w") as f:
            f.write(repr(time.time()))
        threading.Event().wait()


if HANG_EPOCH:
    model.add_callback("on_train_epoch_start", _hang_at_epoch_start)
model.train(
    data=data,
    epochs=epochs,
    imgsz=64,
    batch=4,
    nbs=4,
    device="cpu",
    workers=2,
    plots=False,
    name="plain",
    exist_ok=True,
    **where,
)  # nbs = batch: an optimizer step each batch
print("script: training returned", flush=True)
