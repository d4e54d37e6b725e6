"""A plain Ultralytics training script, as a user writes one: nothing of trainctl in it.

    python plain_yolo.py DATA.yaml EPOCHS PROJECT

``workers=2`` is written in it (the preset decides under trainctl).  PROJECT ``-``: no
``project`` given (Ultralytics chooses where the results go)."""
import sys

from ultralytics import YOLO

data, epochs, project = sys.argv[1], int(sys.argv[2]), sys.argv[3]
model = YOLO("yolov8n.yaml")
where = {} if project == "-" else {"project": project}
model.train(data=data, epochs=epochs, imgsz=64, batch=4, nbs=4, device="cpu", workers=2, plots=False,
            name="plain", exist_ok=True, **where)   # nbs = batch: an optimizer step each batch
print("script: training returned", flush=True)
