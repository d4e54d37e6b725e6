"""Trainers' console formats (src/trainctl/core/formats.py and the readers in src/trainctl/core/parse.py).

Each case is a line rendered from the format string in the trainer's own source, named by
its repository and file, with what the parser must read from it.  Context lines (a header
printed before) are fed first.
"""

from __future__ import annotations

import datetime
import math
import time
import urllib.parse
from pathlib import Path

import pytest

from trainctl.core.events import Phase, Progress
from trainctl.core.parse import ConsoleParser
from trainctl.core.user_pattern import PatternError, compile_user_pattern

MS = 123.456


def _timm() -> str:  # huggingface/pytorch-image-models train.py train_one_epoch
    epoch, update_idx, updates_per_epoch, loss_now, loss_avg, lr = 3, 100, 1251, 6.9123, 6.95, 1e-3
    return (
        f"Train: {epoch} [{update_idx:>4d}/{updates_per_epoch} "
        f"({100.0 * (update_idx + 1) / updates_per_epoch:>3.0f}%)]  "
        f"Loss: {loss_now:#.3g} ({loss_avg:#.3g})  "
        f"Time: {0.312:.3f}s, {820.5:>7.2f}/s  ({0.33:.3f}s, {790.1:>7.2f}/s)  "
        f"LR: {lr:.3e}  Data: {0.011:.3f} ({0.012:.3f})"
    )


def _metric_logger(header: str, i: int, n: int, meters: dict[str, str]) -> str:
    # pytorch/vision references/classification/utils.py MetricLogger.log_every, delimiter "  "
    space_fmt = ":" + str(len(str(n))) + "d"
    log_msg = "  ".join(
        [
            header,
            "[{0" + space_fmt + "}/{1}]",
            "eta: {eta}",
            "{meters}",
            "time: {time}",
            "data: {data}",
            "max mem: {memory:.0f}",
        ]
    )
    return log_msg.format(
        i,
        n,
        eta="0:10:00",
        meters="  ".join(f"{k}: {v}" for k, v in meters.items()),
        time="0.1000",
        data="0.0100",
        memory=1234.0,
    )


def _hf(logs: dict) -> str:  # transformers trainer_callback.py ProgressCallback.on_log
    return str(logs)


def _mmengine(epoch: int, it: int, n: int, max_epochs: int = 12, mode: str = "train") -> str:
    # open-mmlab/mmengine mmengine/runner/log_processor.py get_log_after_iter (by_epoch)
    cur_iter_str = str(it).rjust(len(str(n)))
    cur_epoch_str = f"[{epoch}]".rjust(len(str(max_epochs)) + 3, " ")
    log_str = f"Epoch({mode}){cur_epoch_str}[{cur_iter_str}/{n}]  "
    log_str += (
        "base_lr: 1.0000e-02 lr: 1.0000e-02  eta: 0:17:53  time: 0.0550  data_time: 0.0082  memory: 1233  "
    )
    return (
        "08/21 02:58:41 - mmengine - INFO - "
        + log_str
        + "  ".join(["grad_norm: 3.1416", "loss: 2.2534", "loss_cls: 1.1000", "loss_bbox: 0.4000"])
    )


def _mmengine_iter(it: int, max_iters: int) -> str:
    cur_iter_str = str(it).rjust(len(str(max_iters)))
    return (
        f"Iter(train) [{cur_iter_str}/{max_iters}]  lr: 1.0000e-02  eta: 1:02:03  "
        f"time: 0.4000  data_time: 0.0100  memory: 5000  loss: 0.8765  decode.loss_ce: 0.8765"
    )


def _mmcv1(epoch: int, it: int, n: int) -> str:
    # open-mmlab/mmcv (1.x branch) mmcv/runner/hooks/logger/text.py _log_info (MMDetection 2.x)
    log_str = f"Epoch [{epoch}][{it}/{n}]\t" + f"lr: {0.02:.3e}, "
    log_str += "eta: 1 day, 5:38:44, " + f"time: {0.59:.3f}, data_time: {0.051:.3f}, memory: 6584, "
    items = {
        "loss_rpn_cls": 0.3011,
        "loss_rpn_bbox": 0.1145,
        "loss_cls": 0.8116,
        "acc": 88.5684,
        "loss_bbox": 0.1857,
        "loss": 1.4129,
    }
    return log_str + ", ".join(f"{k}: {v:.4f}" for k, v in items.items())


def _detectron2(iteration: int) -> str:
    # facebookresearch/detectron2 detectron2/utils/events.py CommonMetricPrinter.write
    losses = "  ".join(
        f"{k}: {v:.4g}" for k, v in {"total_loss": 1.234, "loss_cls": 0.5012, "loss_box_reg": 0.3001}.items()
    )
    return str.format(
        " {eta}iter: {iter}  {losses}  {non_losses}  {avg_time}{last_time}"
        + "{avg_data_time}{last_data_time} lr: {lr}  {memory}",
        eta="eta: 1:02:03  ",
        iter=iteration,
        losses=losses,
        non_losses="",
        avg_time="time: 0.4000  ",
        last_time="last_time: 0.3900  ",
        avg_data_time="data_time: 0.0100  ",
        last_data_time="last_data_time: 0.0090  ",
        lr=f"{0.02:.5g}",
        memory="max_mem: 1234M",
    )


def _fairseq_simple(epoch: int, i: int, size: int) -> str:
    # facebookresearch/fairseq fairseq/logging/progress_bar.py BaseProgressBar + SimpleProgressBar.log
    prefix = f"epoch {epoch:03d}"
    stats = {
        "loss": "7.123",
        "nll_loss": "6.5",
        "ppl": "90.51",
        "wps": "12345",
        "ups": "3.1",
        "num_updates": "100",
        "lr": "0.0005",
    }
    postfix = ", ".join(key + "=" + stats[key].strip() for key in stats)
    return "2024-01-01 12:00:00 | INFO | train_inner | " + f"{prefix}:  {i + 1:5d} / {size:d} {postfix}"


def _keras3(current: int, target: int, metrics: dict[str, float]) -> str:
    # keras-team/keras keras/src/utils/progbar.py Progbar.update (verbose=1), colours stripped
    numdigits = int(math.log10(target)) + 1
    bar = (f"%{numdigits}d/%d") % (current, target) + " " + "━" * 20
    info = " 10s" + " 5ms/step"
    for k, v in metrics.items():
        info += f" - {k}:" + f" {v:.4f}"
    return bar + info


def _keras2(current: int, target: int, metrics: dict[str, float], final: bool = False) -> str:
    # keras-team/tf-keras tf_keras/utils/generic_utils.py Progbar.update (verbose=1)
    numdigits = int(math.log10(target)) + 1
    bar = ("%" + str(numdigits) + "d/%d [") % (current, target)
    prog_width = int(30 * current / target)
    bar += "=" * (prog_width - 1) + (">" if current < target else "=") + "." * (30 - prog_width) + "]"
    info = " - 5s 3ms/step" if final else " - ETA: 10s"
    for k, v in metrics.items():
        info += f" - {k}:" + f" {v:.4f}"
    return bar + info


def _megatron(iteration: int, train_iters: int) -> str:
    # NVIDIA/Megatron-LM megatron/training/training.py training_log
    s = f" [{datetime.datetime(2024, 1, 1, 12).strftime('%Y-%m-%d %H:%M:%S.%f')}]"
    s += f" iteration {iteration:8d}/{train_iters:8d} |"
    s += f" consumed samples: {51200:12d} |"
    s += f" elapsed time per iteration (ms): {1234.5:.1f} |"
    s += f" learning rate: {1e-4:.6E} |" + f" global batch size: {512:5d} |"
    s += " {}: {:.6E} |".format("lm loss", 7.123456)
    s += f" loss scale: {1.0:.1f} |" + f" grad norm: {1.234:.3f} |"
    s += f" number of skipped iterations: {0:3d} |"
    s += f" number of nan iterations: {0:3d} |"
    return s


def _litgpt(epoch0: int, it: int, step: int, loss: float) -> str:
    # Lightning-AI/litgpt litgpt/pretrain.py fit() (litgpt/finetune/lora.py is the same less the time left)
    return (
        f"Epoch {epoch0 + 1} | iter {it} step {step} |"
        f" loss train: {loss:.3f},"
        f" val: n/a |"
        f" iter time: {MS:.2f} ms"
        " (step)"
        " remaining time: 0:10:00"
    )


def _rich(epoch: int, max_epochs: int, done: int, total: int) -> str:
    # Lightning-AI/pytorch-lightning src/lightning/pytorch/callbacks/progress/rich_progress.py
    desc = f"Epoch {epoch}" + f"/{max_epochs - 1}"
    return (
        f"{desc} "
        + "━" * 30
        + f" {done}/{total}"
        + " 0:00:10 • 0:00:12"
        + f" {4.4:>.2f}it/s"
        + " "
        + " ".join(["v_num: 0", f"train_loss: {0.1234:.3f}"])
    )


CASES = [
    # (project, source file, context lines, line, expected)
    (
        "timm",
        "huggingface/pytorch-image-models train.py",
        [],
        _timm(),
        dict(fmt="timm", epoch=3, batch=100, batches=1251, losses={"loss": 6.91}),
    ),
    (
        "torchvision references",
        "pytorch/vision references/classification/utils.py (MetricLogger), train.py header",
        [],
        _metric_logger(
            "Epoch: [2]",
            100,
            1563,
            {"lr": "0.100000", "img/s": "812.3", "loss": "6.9081 (6.9100)", "acc1": "0.0000 (0.1000)"},
        ),
        dict(fmt="keyvalue", epoch=2, batch=100, batches=1563, losses={"loss": 6.9081}),
    ),
    (
        "torchvision detection",
        "pytorch/vision references/detection/engine.py train_one_epoch",
        [],
        _metric_logger(
            "Epoch: [0]",
            20,
            500,
            {
                "lr": "0.000400",
                "loss": "1.2000 (1.3000)",
                "loss_classifier": "0.5000 (0.5500)",
                "loss_box_reg": "0.3000 (0.3100)",
            },
        ),
        dict(
            fmt="keyvalue",
            epoch=0,
            batch=20,
            batches=500,
            losses={"loss": 1.2, "loss_classifier": 0.5, "loss_box_reg": 0.3},
        ),
    ),
    (
        "HF Transformers Trainer",
        "huggingface/transformers src/transformers/trainer_callback.py ProgressCallback.on_log",
        [],
        _hf({"loss": 2.3021, "grad_norm": 1.4711, "learning_rate": 5e-05, "epoch": 0.4}),
        dict(fmt="hf_dict", epoch=1, batch=None, losses={"loss": 2.3021}),
    ),
    (
        "HF Transformers Trainer (tqdm)",
        "huggingface/transformers src/transformers/trainer_callback.py ProgressCallback (tqdm(total=state.max_steps))",
        [],
        " 40%|████      | 200/500 [00:10<00:15, 19.50it/s]",
        dict(fmt="tqdm", batch=200, batches=500, losses={}),
    ),
    (
        "diffusers",
        "huggingface/diffusers examples/text_to_image/train_text_to_image.py (tqdm desc='Steps', set_postfix(step_loss, lr))",
        [],
        "Steps:  12%|█▏        | 120/1000 [00:30<03:40,  4.00it/s, lr=0.0001, step_loss=0.123]",
        dict(fmt="tqdm", batch=120, batches=1000, losses={"step_loss": 0.123}),
    ),
    (
        "HF Accelerate examples",
        "huggingface/transformers examples/pytorch/text-classification/run_glue_no_trainer.py (tqdm(range(max_train_steps)))",
        [],
        " 33%|███▎      | 100/300 [00:20<00:40,  4.90it/s]",
        dict(fmt="tqdm", batch=100, batches=300, losses={}),
    ),
    (
        "PyTorch Lightning (tqdm)",
        "Lightning-AI/pytorch-lightning src/lightning/pytorch/callbacks/progress/tqdm_progress.py (desc f'Epoch {current_epoch}')",
        [],
        "Epoch 3:  45%|████▌     | 45/100 [00:10<00:12,  4.40it/s, v_num=0, train_loss=0.123]",
        dict(fmt="tqdm", epoch=3, batch=45, batches=100, losses={"train_loss": 0.123}),
    ),
    (
        "PyTorch Lightning (rich)",
        "Lightning-AI/pytorch-lightning src/lightning/pytorch/callbacks/progress/rich_progress.py",
        [],
        _rich(3, 10, 45, 100),
        dict(fmt="lightning_rich", epoch=3, epochs=9, batch=45, batches=100, losses={"train_loss": 0.123}),
    ),
    (
        "fairseq (simple)",
        "facebookresearch/fairseq fairseq/logging/progress_bar.py SimpleProgressBar.log",
        [],
        _fairseq_simple(1, 99, 1000),
        dict(fmt="keyvalue", epoch=1, batch=100, batches=1000, losses={"loss": 7.123, "nll_loss": 6.5}),
    ),
    (
        "fairseq (tqdm)",
        "facebookresearch/fairseq fairseq/logging/progress_bar.py TqdmProgressBar (desc=prefix 'epoch 001')",
        [],
        "epoch 001:  10%|█         | 100/1000 [00:30<04:30,  3.33it/s, loss=7.123, nll_loss=6.5, ppl=90.51]",
        dict(fmt="tqdm", epoch=1, batch=100, batches=1000, losses={"loss": 7.123, "nll_loss": 6.5}),
    ),
    (
        "MMEngine (by epoch)",
        "open-mmlab/mmengine mmengine/runner/log_processor.py get_log_after_iter",
        [],
        _mmengine(1, 50, 391),
        dict(
            fmt="mmengine",
            epoch=1,
            batch=50,
            batches=391,
            losses={"loss": 2.2534, "loss_cls": 1.1, "loss_bbox": 0.4},
        ),
    ),
    (
        "MMEngine (by iter)",
        "open-mmlab/mmengine mmengine/runner/log_processor.py get_log_after_iter",
        [],
        _mmengine_iter(50, 80000),
        dict(
            fmt="mmengine",
            epoch=None,
            batch=50,
            batches=80000,
            losses={"loss": 0.8765, "decode.loss_ce": 0.8765},
        ),
    ),
    (
        "MMDetection 2.x",
        "open-mmlab/mmcv (1.x) mmcv/runner/hooks/logger/text.py TextLoggerHook._log_info",
        [],
        _mmcv1(1, 50, 7330),
        dict(
            fmt="mmcv",
            epoch=1,
            batch=50,
            batches=7330,
            losses={
                "loss_rpn_cls": 0.3011,
                "loss_rpn_bbox": 0.1145,
                "loss_cls": 0.8116,
                "loss_bbox": 0.1857,
                "loss": 1.4129,
            },
        ),
    ),
    (
        "detectron2",
        "facebookresearch/detectron2 detectron2/utils/events.py CommonMetricPrinter.write",
        [],
        "[07/10 12:34:56 d2.utils.events]: " + _detectron2(19),
        dict(
            fmt="keyvalue",
            batch=19,
            batches=None,
            losses={"total_loss": 1.234, "loss_cls": 0.5012, "loss_box_reg": 0.3001},
        ),
    ),
    (
        "Keras 3",
        "keras-team/keras keras/src/utils/progbar.py; keras/src/callbacks/progbar_logger.py",
        ["Epoch 2/10"],
        _keras3(32, 1875, {"accuracy": 0.8123, "loss": 0.5012}),
        dict(fmt="keras", epoch=2, epochs=10, batch=32, batches=1875, losses={"loss": 0.5012}),
    ),
    (
        "Keras 3 (epoch end)",
        "keras-team/keras keras/src/utils/progbar.py",
        ["Epoch 2/10"],
        _keras3(1875, 1875, {"accuracy": 0.91, "loss": 0.29, "val_accuracy": 0.9, "val_loss": 0.31}),
        dict(fmt="keras", epoch=2, epochs=10, batch=1875, batches=1875, losses={"loss": 0.29}),
    ),
    (
        "Keras 2",
        "keras-team/tf-keras tf_keras/utils/generic_utils.py Progbar; tf_keras/callbacks.py ProgbarLogger",
        ["Epoch 1/5"],
        _keras2(32, 1875, {"loss": 0.5012, "accuracy": 0.8123}),
        dict(fmt="keras", epoch=1, epochs=5, batch=32, batches=1875, losses={"loss": 0.5012}),
    ),
    (
        "Keras 2 (epoch end)",
        "keras-team/tf-keras tf_keras/utils/generic_utils.py Progbar",
        ["Epoch 1/5"],
        _keras2(1875, 1875, {"loss": 0.29, "accuracy": 0.91, "val_loss": 0.31}, final=True),
        dict(fmt="keras", epoch=1, epochs=5, batch=1875, batches=1875, losses={"loss": 0.29}),
    ),
    (
        "YOLOv5",
        "ultralytics/yolov5 train.py (header '%11s' * 7, pbar '%11s' * 2 + '%11.4g' * 5)",
        [("\n" + "%11s" * 7) % ("Epoch", "GPU_mem", "box_loss", "obj_loss", "cls_loss", "Instances", "Size")],
        ("%11s" * 2 + "%11.4g" * 5) % ("0/299", "3.68G", 0.1131, 0.0688, 0.03765, 83, 640)
        + ":  12%|█▏        | 3/25 [00:02<00:11,  1.86it/s]",
        dict(
            fmt="ultralytics",
            epoch=0,
            epochs=299,
            batch=3,
            batches=25,
            losses={"box_loss": 0.1131, "obj_loss": 0.0688, "cls_loss": 0.03765},
        ),
    ),
    (
        "nanoGPT",
        "karpathy/nanoGPT train.py",
        [],
        f"iter {2000}: loss {2.34567:.4f}, time {98.76:.2f}ms, mfu {35.1:.2f}%",
        dict(fmt="nanogpt", batch=2000, batches=None, losses={"loss": 2.3457}),
    ),
    (
        "Megatron-LM",
        "NVIDIA/Megatron-LM megatron/training/training.py training_log",
        [],
        _megatron(100, 500000),
        dict(fmt="megatron", batch=100, batches=500000, losses={"lm loss": 7.123456}),
    ),
    (
        "LitGPT",
        "Lightning-AI/litgpt litgpt/pretrain.py fit()",
        [],
        _litgpt(0, 100, 25, 2.3456),
        dict(fmt="litgpt", epoch=1, batch=100, losses={"loss": 2.346}),
    ),
    (
        "torchtune",
        "pytorch/torchtune recipes/full_finetune_single_device.py (pbar.set_description)",
        [],
        f"{0 + 1}|{12}|Loss: {2.34567:.4f}:   2%|▏         | 12/500 [00:30<20:00,  2.40s/it]",
        dict(fmt="torchtune", epoch=1, batch=12, batches=500, losses={"loss": 2.3457}),
    ),
    (
        "Composer",
        "mosaicml/composer composer/loggers/console_logger.py _get_progress_string",
        [],
        "[epoch=1][batch=16/100]:",
        dict(fmt="composer", epoch=1, batch=16, batches=100, losses={}),
    ),
    (
        "Composer (loss)",
        "mosaicml/composer composer/loggers/console_logger.py log_to_console",
        ["[epoch=1][batch=16/100]:"],
        "\t Train loss/train/total: 2.3456",
        dict(fmt="composer", epoch=1, batch=16, batches=100, losses={"loss/train/total": 2.3456}),
    ),
    (
        "DeepSpeed",
        "microsoft/DeepSpeed deepspeed/runtime/engine.py _report_progress (log_dist: deepspeed/utils/logging.py)",
        [],
        "[2024-01-01 12:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]",
        dict(fmt="deepspeed", batch=10, batches=None, losses={}),
    ),
    (
        "DeepSpeed (throughput)",
        "microsoft/DeepSpeed deepspeed/utils/timer.py ThroughputTimer.stop",
        [],
        "[2024-01-01 12:00:00,000] [INFO] [timer.py:260:stop] epoch=0/micro_step=40/global_step=10, "
        "RunningAvgSamplesPerSec=123.4, CurrSamplesPerSec=120.1, MemAllocated=1.2GB, MaxMemAllocated=3.4GB",
        dict(fmt="deepspeed", epoch=0, batch=10, losses={}),
    ),
    (
        "plain loop",
        "a hand-written loop",
        [],
        "Epoch 2/10: 37/500 loss=0.41",
        dict(fmt="keyvalue", epoch=2, epochs=10, batch=37, batches=500, losses={"loss": 0.41}),
    ),
    (
        "plain loop",
        "a hand-written loop",
        [],
        "step 37/500",
        dict(fmt="keyvalue", batch=37, batches=500, losses={}),
    ),
    (
        "plain loop",
        "a hand-written loop",
        [],
        "[37/500] loss=0.41",
        dict(fmt="bracket", batch=37, batches=500, losses={"loss": 0.41}),
    ),
    (
        "plain loop",
        "a hand-written loop",
        [],
        "[37/500]",
        dict(fmt="bracket", batch=37, batches=500, losses={}),
    ),
]


@pytest.mark.parametrize(
    "project,source,context,line,want", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_trainer_format(project, source, context, line, want):
    p = ConsoleParser()
    for c in context:
        for part in c.splitlines():
            p.feed(part, 0.0)
    p.last_format = None
    events = p.feed(line, 1.0)
    progress = [e for e in events if isinstance(e, Progress)]
    assert len(progress) == 1, (project, source, line, events)
    got = progress[0]
    assert p.last_format == want["fmt"], (project, source)
    for key in ("epoch", "epochs", "batch", "batches"):
        if key in want:
            assert getattr(got, key) == want[key], (project, key, got)
    assert set(got.losses) == set(want["losses"]), (project, got.losses)
    for k, v in want["losses"].items():
        assert got.losses[k] == pytest.approx(v, rel=1e-3), (project, k)


EVAL_LINES = [
    (
        "HF Trainer eval",
        "huggingface/transformers trainer_callback.py",
        _hf({"eval_loss": 2.1, "eval_runtime": 3.2, "eval_samples_per_second": 100.0, "epoch": 1.0}),
    ),
    (
        "MMEngine val",
        "open-mmlab/mmengine mmengine/runner/log_processor.py",
        _mmengine(1, 50, 313, mode="val"),
    ),
    (
        "nanoGPT eval",
        "karpathy/nanoGPT train.py",
        f"step {2000}: train loss {1.2345:.4f}, val loss {1.3456:.4f}",
    ),
    (
        "Composer eval",
        "mosaicml/composer composer/loggers/console_logger.py",
        "[Eval batch=3/10] Eval on eval data",
    ),
    (
        "timm validate",
        "huggingface/pytorch-image-models train.py validate",
        f"Test: [{10:>4d}/{390}]  Time: 0.100 (0.110)  Loss: {1.2:>7.3f} ({1.3:>6.3f})  Acc@1: {70.0:>7.3f} ({71.0:>7.3f})",
    ),
]


@pytest.mark.parametrize("project,source,line", EVAL_LINES, ids=[c[0] for c in EVAL_LINES])
def test_evaluation_lines_are_not_training_progress(project, source, line):
    p = ConsoleParser()
    p.feed("Epoch 2/10: 37/500 loss=0.41", 0.0)
    events = p.feed(line, 1.0)
    assert not any(isinstance(e, Progress) for e in events), (project, events)
    assert p.phase == "val", (project, source)


def test_hf_summary_and_argument_dumps_are_not_progress():
    p = ConsoleParser()
    summary = _hf({"train_runtime": 100.0, "train_samples_per_second": 10.0, "train_loss": 1.9, "epoch": 3.0})
    assert p.feed(summary, 0.0) == []
    assert p.feed("[1/3] c++ -MMD -MF flash.o.d -c flash.cu", 0.0) == []  # ninja building an extension
    assert p.feed("Namespace(epochs=10, batch_size=32, lr=0.001)", 0.0) == []


def test_composer_loss_without_a_header_is_ignored():
    assert ConsoleParser().feed("\t Train loss/train/total: 2.3456", 0.0) == []


# ---------------------------------------------------------------------------- public scripts (issue 41)

PUBLIC_LINES = Path(__file__).resolve().parents[1] / "data" / "public_script_lines.txt"


def _public_corpus() -> list:
    """The cases of tests/data/public_script_lines.txt: (head, context lines, line)."""
    cases, context = [], []
    for raw in PUBLIC_LINES.read_text(encoding="utf-8").splitlines():
        if not raw.strip() or raw.startswith("#"):
            continue
        if raw.startswith("> "):
            context.append(raw[2:])
            continue
        head, _, line = raw.partition(" | ")
        cases.append(pytest.param(head.split(), context, line.replace("\\t", "\t"), id=line[:60]))
        context = []
    return cases


PUBLIC = _public_corpus()


def test_public_corpus_holds_forty_shapes_and_forty_negatives():
    signs = [c.values[0][0] for c in PUBLIC]
    assert signs.count("+") >= 40 and signs.count("-") >= 40, (signs.count("+"), signs.count("-"))


@pytest.mark.parametrize("head,context,line", PUBLIC)
def test_public_script_line(head, context, line):
    """A shape a public script prints is read as its source says; its neighbour is no progress."""
    p = ConsoleParser()
    for c in context:
        p.feed(c, 0.0)
    p.last_format = None
    progress = [e for e in p.feed(line, 1.0) if isinstance(e, Progress)]
    if head[0] == "-":
        assert progress == [], (line, progress)
        return
    assert len(progress) == 1, (line, progress)
    got = progress[0]
    fmt, epoch, position, *values = head[1:]
    assert p.last_format == fmt, (line, p.last_format)
    assert got.epoch == (None if epoch == "-" else int(epoch)), (line, got)
    if position != "-":
        batch, batches = position.split("/")
        assert (got.batch, got.batches) == (int(batch), None if batches == "-" else int(batches)), (line, got)
    rates = [float(v.partition("=")[2]) for v in values if v.startswith("rate=")]
    losses = {
        urllib.parse.unquote(k): float(v)
        for k, _, v in (v.partition("=") for v in values if v != "{}" and not v.startswith("rate="))
    }
    assert got.rate == (pytest.approx(rates[0], rel=1e-3) if rates else None), (line, got.rate)
    assert got.losses == pytest.approx(losses, rel=1e-6), (line, got.losses)


# ---------------------------------------------------------------------------- the user's pattern


def test_user_pattern_is_tried_first_and_reads_named_groups():
    up = compile_user_pattern(
        r"E(?P<epoch>\d+)/(?P<epochs>\d+) B(?P<batch>\d+)/(?P<batches>\d+) "
        r"L=(?P<loss_total>[\d.]+) A=(?P<acc>[\d.]+)",
        ["acc"],
    )
    p = ConsoleParser(up)
    events = p.feed("E3/9 B17/200 L=0.52 A=0.9", 1.0)
    assert isinstance(events[0], Phase) and isinstance(events[1], Progress)
    got = events[1]
    assert (got.epoch, got.epochs, got.batch, got.batches) == (3, 9, 17, 200)
    assert got.losses == {"acc": 0.9, "loss_total": 0.52}
    assert p.last_format == "user"
    # a line the pattern does not match still goes to the built-in readers
    p.feed("Epoch 2/10: 37/500 loss=0.41", 2.0)
    assert p.last_format == "keyvalue"


@pytest.mark.parametrize(
    "pattern,losses,message",
    [
        (r"step (?P<batch>\d+", [], "not a valid regular expression"),
        (r"step (?P<batch>\d+) (?P<speed>\d+)", [], "unknown group name(s) speed"),
        (r"loss (?P<loss>[\d.]+)", [], "needs a named group (?P<batch>"),
        (r"step (?P<batch>\d+)", ["acc"], "acc: not a named group of the pattern"),
    ],
)
def test_user_pattern_errors(pattern, losses, message):
    with pytest.raises(PatternError) as exc:
        compile_user_pattern(pattern, losses)
    assert message in str(exc.value)


# ---------------------------------------------------------------------------- linear time

HOSTILE = {
    "Train: + spaces": lambda n: "Train: 1 [" + " " * n + "x",
    "Epoch( + brackets": lambda n: "Epoch(train) " + "[1]" * (n // 3),
    "Iter [ + spaces": lambda n: "Iter [" + " " * n,
    "{' + pairs": lambda n: "{'epoch': 1, " + "'loss': 1, " * (n // 11),
    "keras digits": lambda n: " " * n + "1/2 [" + "=" * n + " - ETA: ",
    "megatron pipes": lambda n: " iteration 1/2 |" + " loss: |" * (n // 8),
    "rich bar": lambda n: "Epoch 1/2 " + "━" * n + " x it/s",
    "deepspeed": lambda n: "step=1, skipped=" * (n // 16) + " global_step=",
    "composer": lambda n: "[epoch=1][batch=" + "1" * n,
    "bracket": lambda n: "[" + " " * n + "1/2]",
    "epoch_batch": lambda n: "[1/2][" + " " * n + "1/2",
    "epoch_batch pairs": lambda n: "[1/2][1/2]" + " Loss 1 (" * (n // 9),
    "json line": lambda n: '{"loss": 1, "iter": 2, ' + '"x": [' * (n // 6) + "}",
    "running average": lambda n: "Epoch: [0][1/2] " + "a" * n + " 1 (1",
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_readers_take_linear_time(name):
    """A 4 KiB hostile line (the sanitiser's cut) costs about 4x a 1 KiB one, not 16x."""

    def cost(n: int) -> float:
        line = HOSTILE[name](n)
        best = float("inf")
        for _ in range(5):
            p = ConsoleParser()
            t0 = time.perf_counter()
            p.feed(line, 0.0)
            best = min(best, time.perf_counter() - t0)
        return best

    small, big = cost(1024), cost(4096)
    assert big < max(small * 10, 2e-3), (name, small, big)


def test_the_jobs_pattern_reaches_the_output_feed_through_the_spec(tmp_path):
    from trainctl.core.feed import OutputFeed
    from trainctl.store.spec import RunSpec

    spec = RunSpec(
        job_name="j",
        kind="command",
        progress={"pattern": r"it (?P<batch>\d+)/(?P<batches>\d+) L=(?P<loss>[\d.]+)", "losses": []},
    )
    spec.save(tmp_path / "spec.json")
    loaded = RunSpec.load(tmp_path / "spec.json")
    feed = OutputFeed(None, progress=loaded.progress)
    [fed] = feed.feed(b"\x1b[32mit 7/90 L=0.25\x1b[0m\n", 3.0)
    [progress] = [e for e in fed.events if isinstance(e, Progress)]
    assert (progress.batch, progress.batches, progress.losses) == (7, 90, {"loss": 0.25})
    assert feed.parser.last_format == "user"
    assert OutputFeed(None).feed(b"it 7/90 L=0.25\n", 3.0)[0].events == ()
