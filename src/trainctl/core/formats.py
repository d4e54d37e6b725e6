"""Console formats of known trainers, and the user's own pattern.  Pure: no I/O, no clock.

Each reader takes one console line (ANSI stripped, at most
:data:`~trainctl.core.sanitize.MAX_LINE` characters) and returns a :class:`Reading` or
``None``.  :class:`~trainctl.core.parse.ConsoleParser` calls them from its slow path,
each behind a substring test that most lines fail, so a line that is none of them costs a
few ``in`` tests.  The format strings each reader follows are those of the project's own
source (the file is named by each reader); ``tests/unit/test_formats.py`` renders lines
from them.

Every regex runs in time linear in the line's length: no nested quantifiers, possessive
repetitions where a run could meet what follows, and every search anchored on a literal.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from trainctl.core.reading import Reading
from trainctl.core.values import is_loss_key, split_eval_losses

NUM = r"[-+]?(?:nan|inf(?:inity)?|\d++(?:\.\d*+)?(?:[eE][-+]?\d++)?|\.\d++(?:[eE][-+]?\d++)?)"

# "name: 1.23" / "name=1.23" pairs, searched from a literal start; the value is atomic.
_PAIR_COLON = re.compile(r"([A-Za-z_][\w./-]*+): (" + NUM + r")(?![\w.])", re.I)


def _f(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


def _int(s: str | None) -> int | None:
    return int(s) if s else None


def _colon_losses(text: str, skip_prefix: str = "") -> dict[str, float]:
    """Every ``name: value`` pair whose name holds "loss" (names starting with
    ``skip_prefix`` left out: Keras's ``val_loss``)."""
    out = {}
    for k, v in _PAIR_COLON.findall(text):
        if is_loss_key(k) and not (skip_prefix and k.startswith(skip_prefix)):
            out[k] = float(v)
    return out


# ------------------------------------------------------------------ HF Transformers Trainer
# transformers/src/transformers/trainer_callback.py ProgressCallback.on_log:
#   self.training_bar.write(str(logs))  ->  {'loss': 2.3021, 'grad_norm': 1.5, 'learning_rate': 5e-05, 'epoch': 0.4}
# (PrinterCallback prints the same dict.)  Evaluation: {'eval_loss': ..., 'epoch': 1.0};
# the end of training: {'train_runtime': ..., 'train_loss': ..., 'epoch': 3.0} (a summary).
_HF_PAIR = re.compile(r"'([A-Za-z_][\w/.-]*+)': (?:np\.float\d*+\()?(" + NUM + r")")


def read_hf_dict(line: str) -> Reading | None:
    start = line.find("{'")
    if start < 0 or "'epoch': " not in line:
        return None
    pairs = dict(_HF_PAIR.findall(line, start))
    ep = _f(pairs.get("epoch", ""))
    if ep is None or not math.isfinite(ep):
        return None
    if any(k.startswith(("eval_", "test_")) for k in pairs):
        return Reading("hf_dict", phase="val")
    if "train_runtime" in pairs:
        return None  # the summary at the end of training: not a step
    losses = {k: float(v) for k, v in pairs.items() if "loss" in k}
    if not losses:
        return None
    # HF's epoch is fractional and 0-based (0.4 = 40% into the first): epoch 1.
    return Reading("hf_dict", epoch=max(1, math.ceil(ep)), losses=losses)


# ------------------------------------------------------------------ timm
# pytorch-image-models/train.py train_one_epoch:
#   f'Train: {epoch} [{update_idx:>4d}/{updates_per_epoch} ({100. * (update_idx + 1) / updates_per_epoch:>3.0f}%)]  '
#   f'Loss: {loss_now:#.3g} ({loss_avg:#.3g})  Time: ...  LR: {lr:.3e}  Data: ...'
# validate(): f'{log_name}: [{batch_idx:>4d}/{last_idx}]  Time: ... Loss: ... Acc@1: ...' (log_name "Test")
_TIMM = re.compile(r"\bTrain: (\d++) \[ *+(\d++)/(\d++) ")
_TIMM_LOSS = re.compile(r"  Loss: (" + NUM + r") ")
_TIMM_TEST = re.compile(r"\bTest[\w-]*+: \[ *+\d++/\d++\]  ")


def read_timm_test(line: str) -> Reading | None:
    return Reading("timm", phase="val") if _TIMM_TEST.search(line) else None


def read_timm(line: str) -> Reading | None:
    m = _TIMM.search(line)
    if m is None:
        return None
    lm = _TIMM_LOSS.search(line, m.end())
    losses = {"loss": float(lm.group(1))} if lm else {}
    return Reading(
        "timm", epoch=int(m.group(1)), batch=int(m.group(2)), batches=int(m.group(3)), losses=losses
    )


# ------------------------------------------------------------------ MMEngine / MMCV 1.x (MMDetection 2.x)
# mmengine/runner/log_processor.py get_log_after_iter:
#   f'Epoch({mode}){cur_epoch_str}[{cur_iter_str}/{dataloader_len}]  ' (cur_epoch_str '[1]' right-aligned)
#   f'Iter({mode}) [{cur_iter_str}/{runner.max_iters}]  '; then '{name}: {val}' items joined by two spaces
# mmcv 1.x mmcv/runner/hooks/logger/text.py (MMDetection 2.x):
#   f'Epoch [{epoch}][{iter}/{len(runner.data_loader)}]\t'   f'Iter [{iter}/{runner.max_iters}]\t'
#   val: f'Epoch({mode}) [{epoch}][{iter}]\t'; items '{name}: {val}' joined by ', '
_MM = re.compile(r"\b(Epoch|Iter)(?:\((\w++)\))? *+(?:\[ *+(\d++)\])?\[ *+(\d++)(?:/(\d++))?\]")


def read_mm(line: str) -> Reading | None:
    m = _MM.search(line)
    if m is None:
        return None
    unit, mode, ep, n, total = m.groups()
    if mode is not None and mode != "train":
        return Reading("mmengine", phase="val")
    if total is None:
        return None
    fmt = "mmengine" if mode is not None else "mmcv"
    losses = _colon_losses(line[m.end() :])
    if unit == "Epoch":
        if ep is None:
            return None
        return Reading(fmt, epoch=int(ep), batch=int(n), batches=int(total), losses=losses)
    return Reading(fmt, batch=int(n), batches=int(total), losses=losses)


# ------------------------------------------------------------------ Megatron-LM
# megatron/training/training.py training_log:
#   ' iteration {:8d}/{:8d} |'.format(iteration, args.train_iters)
#   ' consumed samples: {:12d} |' ... ' {}: {:.6E} |'.format(key, avg) for each loss ('lm loss')
#   f' loss scale: {loss_scale:.1f} |' f' grad norm: {grad_norm:.3f} |' ...
_MEGATRON = re.compile(r" iteration +(\d++)/ *+(\d++) \|")


def read_megatron(line: str) -> Reading | None:
    m = _MEGATRON.search(line)
    if m is None:
        return None
    losses = {}
    for part in line[m.end() :].split("|"):
        key, sep, value = part.partition(": ")
        key = key.strip()
        if sep and "loss" in key and key != "loss scale":
            v = _f(value.strip())
            if v is not None:
                losses[key] = v
    return Reading("megatron", batch=int(m.group(1)), batches=int(m.group(2)), losses=losses)


# ------------------------------------------------------------------ nanoGPT
# nanoGPT/train.py:
#   print(f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%")
#   print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")  (evaluation)
_NANOGPT = re.compile(r"\biter (\d++): loss (" + NUM + r")")
_NANOGPT_EVAL = re.compile(r"\bstep \d++: train loss " + NUM + r", val loss ")


def read_nanogpt(line: str) -> Reading | None:
    m = _NANOGPT.search(line)
    if m is not None:
        return Reading("nanogpt", batch=int(m.group(1)), losses={"loss": float(m.group(2))})
    if _NANOGPT_EVAL.search(line):
        return Reading("nanogpt", phase="val")
    return None


# ------------------------------------------------------------------ LitGPT
# litgpt/pretrain.py fit() and litgpt/finetune/lora.py fit():
#   f"Epoch {metrics['epoch'] + 1} | iter {metrics['iter']} step {metrics['step']} |"
#   f" loss train: {metrics['loss']:.3f}," f" val: {val_loss} |" f" iter time: ... ms" ...
_LITGPT = re.compile(r"\bEpoch (\d++) \| iter (\d++) step (\d++) \| loss train: (" + NUM + r")")


def read_litgpt(line: str) -> Reading | None:
    m = _LITGPT.search(line)
    if m is None:
        return None
    return Reading("litgpt", epoch=int(m.group(1)), batch=int(m.group(2)), losses={"loss": float(m.group(4))})


# ------------------------------------------------------------------ DeepSpeed
# deepspeed/runtime/engine.py _report_progress:
#   log_dist(f"step={step}, skipped={self.skipped_steps}, lr={lr}, mom={mom}", ranks=[0])
# deepspeed/utils/timer.py ThroughputTimer.stop:
#   "epoch={}/micro_step={}/global_step={}, RunningAvgSamplesPerSec={}, ..."
# (log_dist prefixes "[Rank N] ", deepspeed/utils/logging.py).  Neither prints a loss.
_DS_STEP = re.compile(r"\bstep=(\d++), skipped=\d++,")
_DS_TPUT = re.compile(r"\bepoch=(\d++)/micro_step=\d++/global_step=(\d++),")


def read_deepspeed(line: str) -> Reading | None:
    m = _DS_STEP.search(line)
    if m is not None:
        return Reading("deepspeed", batch=int(m.group(1)))
    m = _DS_TPUT.search(line)
    if m is not None:
        return Reading("deepspeed", epoch=int(m.group(1)), batch=int(m.group(2)))
    return None


# ------------------------------------------------------------------ Keras 2 and 3 Progbar
# keras/src/utils/progbar.py (Keras 3) update(), verbose=1:
#   f"%{numdigits}d/%d" % (current, target), then the bar of '━', then " {eta}" and
#   self._format_time(...) (" 5ms/step"), then f" - {k}:" f" {avg:.4f}" per metric;
#   verbose=2: f"{count} - {elapsed:.0f}s" f" -{time/step}" then the metrics.
# tf_keras/utils/generic_utils.py (Keras 2) Progbar.update:
#   ("%" + str(numdigits) + "d/%d [") % (current, target) + '='*..'>' + '.'*.. + "]",
#   then f" - ETA: {eta_format}" or " - 5s 3ms/step", then f" - {k}:" f" {avg:.4f}".
# The epoch is on its own line before: f"Epoch {epoch + 1}/{self.epochs}"
# (keras/src/callbacks/progbar_logger.py, tf_keras/callbacks.py ProgbarLogger).
_KERAS = re.compile(r" *+(\d++)/(\d++) (?:\[[=>.]*+\]|━++|- \d)")
_KERAS_METRIC = re.compile(r" - ([A-Za-z_]\w*+): (" + NUM + r")(?![\w.])")


def read_keras(line: str) -> Reading | None:
    m = _KERAS.match(line)
    if m is None:
        return None
    losses = {
        k: float(v)
        for k, v in _KERAS_METRIC.findall(line, m.end())
        if "loss" in k and not k.startswith("val_")
    }
    return Reading("keras", batch=int(m.group(1)), batches=int(m.group(2)), losses=losses)


# ------------------------------------------------------------------ PyTorch Lightning, RichProgressBar
# lightning/pytorch/callbacks/progress/rich_progress.py: the description
#   f"Epoch {current_epoch}" + f"/{self.trainer.max_epochs - 1}" (0-based, as printed), the bar,
#   BatchesProcessedColumn f"{int(task.completed)}/{total}", CustomTimeColumn
#   f"{elapsed_delta} • {remaining_delta}", ProcessingSpeedColumn f"{task_speed}it/s",
#   MetricsTextColumn f"{name}: {value}" joined by " ".
# (The TQDMProgressBar's "Epoch 0:  45%|...| 45/100 [..., train_loss=0.1]" is a tqdm bar.)
_RICH = re.compile(r"\s*+Epoch (\d++)(?:/(\d++))? *+[━╸╺─]++ ++(\d++)/(\d++) ")


def read_lightning_rich(line: str) -> Reading | None:
    m = _RICH.match(line)
    if m is None:
        return None
    tail = line[m.end() :]
    at = tail.find("it/s")
    losses = _colon_losses(tail[at:]) if at >= 0 else {}
    return Reading(
        "lightning_rich",
        epoch=int(m.group(1)),
        epochs=_int(m.group(2)),
        batch=int(m.group(3)),
        batches=int(m.group(4)),
        losses=losses,
    )


# ------------------------------------------------------------------ Composer
# composer/loggers/console_logger.py _get_progress_string / log_to_console:
#   f'[epoch={cur_epoch + 1}]' + f'[batch={cur_batch}/{total}]' (or f'[batch={cur_batch}]'),
#   or f'[{unit.name.lower()}={curr_duration}/{total}]' (e.g. '[batch=16/100]');
#   then ':' and one line per value: f'\n\t {prefix}{data_name}: {data_str}' with prefix
#   'Train ', e.g. "\t Train loss/train/total: 2.3456".  Eval: f'[Eval batch={b}/{n}] Eval on ...'
_COMPOSER = re.compile(r"\[(?:epoch=(\d++)\])?\[?batch=(\d++)(?:/(\d++))?\]:?$")
_COMPOSER_LOSS = re.compile(r"\s*+Train (loss/train/[\w/]++): (" + NUM + r")$")


def read_composer(line: str) -> Reading | None:
    if line.startswith("[Eval batch="):
        return Reading("composer", phase="val")
    m = _COMPOSER.match(line)
    if m is None:
        return None
    return Reading("composer", epoch=_int(m.group(1)), batch=int(m.group(2)), batches=_int(m.group(3)))


def read_composer_loss(line: str) -> tuple[str, float] | None:
    m = _COMPOSER_LOSS.match(line)
    return (m.group(1), float(m.group(2))) if m is not None else None


# ------------------------------------------------------------------ torchtune (a tqdm description)
# recipes/full_finetune_single_device.py (and the lora_* recipes) train():
#   pbar.set_description(f"{curr_epoch + 1}|{self.global_step}|Loss: {loss_value:.4f}")
_TORCHTUNE = re.compile(r"\s*+(\d++)\|(\d++)\|Loss: (" + NUM + r")$")


def read_torchtune_desc(desc: str) -> tuple[int, dict[str, float]] | None:
    m = _TORCHTUNE.match(desc)
    return (int(m.group(1)), {"loss": float(m.group(3))}) if m is not None else None


# ------------------------------------------------------------------ "[epoch/epochs][batch/batches]"
# pytorch/examples dcgan/main.py:
#   '[%d/%d][%d/%d] Loss_D: %.4f Loss_G: %.4f D(x): %.4f D(G(z)): %.4f / %.4f'
#   % (epoch, opt.niter, i, len(dataloader), ...)
# microsoft/Swin-Transformer main.py train_one_epoch:
#   f'Train: [{epoch}/{config.TRAIN.EPOCHS}][{idx}/{num_steps}]\t' f'eta {...} lr {lr:.6f}\t' ...
#   f'loss {loss_meter.val:.4f} ({loss_meter.avg:.4f})\t' ...  (both epochs 0-based, as printed)
_EPOCH_BATCH = re.compile(r"\[ *+(\d++) *+/ *+(\d++) *+\]\[ *+(\d++) *+/ *+(\d++) *+\]")


def read_epoch_batch(line: str) -> Reading | None:
    m = _EPOCH_BATCH.search(line)
    if m is None:
        return None
    epoch, epochs, batch, batches = (int(g) for g in m.groups())
    losses = running_losses(line[m.end() :])
    if epoch > epochs or batch > batches or not losses:
        return None  # a loss beside it, or it is two counters of something else
    return Reading("epoch_batch", epoch=epoch, epochs=epochs, batch=batch, batches=batches, losses=losses)


# ------------------------------------------------------------------ JSON lines
# detectron2/utils/events.py JSONWriter.write: json.dumps({"iteration": iter, "data_time": ...,
#   "loss_cls": ..., "lr": ..., "total_loss": ...}, sort_keys=True) per line of metrics.json;
# mmengine/visualization/vis_backend.py LocalVisBackend.add_scalars: json.dumps of
#   {"lr": ..., "loss": ..., "epoch": 1, "iter": 50, "memory": ..., "step": 50} per line;
# mmcv 1.x mmcv/runner/hooks/logger/text.py _dump_log: {"mode": "train", "epoch": 1, "iter": 50, ...};
# fairseq/logging/progress_bar.py JsonProgressBar.log: json.dumps of
#   {"epoch": 1, "update": 1.1, "loss": "7.123", ..., "num_updates": "100"} (values as strings).
# A line is progress when it says where (an epoch or a step) and a training loss.
_JSON_STEP_KEYS = ("iteration", "iter", "step", "num_updates", "global_step")


def _json_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and len(value) < 40:
        return _f(value.strip())
    return None


def read_json_line(line: str) -> Reading | None:
    start = line.find('{"')
    text = line[start:].rstrip()
    if start < 0 or not text.endswith("}"):
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return None
    if not isinstance(data, dict):
        return None
    mode = data.get("mode")
    if mode is not None and mode != "train":
        return Reading("json", phase="val")
    step = None
    for key in _JSON_STEP_KEYS:
        v = _json_number(data.get(key))
        if v is not None and math.isfinite(v) and v >= 0:
            step = int(v)
            break
    ep = _json_number(data.get("epoch"))
    epoch = None
    if ep is not None and math.isfinite(ep) and ep >= 0:
        # a whole epoch as written; a fractional one is 0-based, as HF's (0.4: the first)
        epoch = int(ep) if ep == int(ep) else max(1, math.ceil(ep))
    found = {}
    for k, v in data.items():
        f = _json_number(v) if isinstance(k, str) and is_loss_key(k) else None
        if f is not None:
            found[k] = f
    losses, evaluated = split_eval_losses(found)
    if not losses:
        return Reading("json", phase="val") if evaluated and (step is not None or epoch is not None) else None
    if step is None and epoch is None:
        return None
    return Reading("json", epoch=epoch, batch=step, losses=losses)


# ------------------------------------------------------------------ running averages
# pytorch/examples imagenet/main.py AverageMeter.__str__: '{name} {val:.4e} ({avg:.4e})'
# joined by '\t' ("Loss 6.9078e+00 (6.9101e+00)"); timm, Swin, torchvision's MetricLogger
# print the same "value (average)": the value is the current one, the average is left.
_RUNNING = re.compile(r"(?<![\w./-])([A-Za-z_][\w./-]*+)(?::? ++|=)(" + NUM + r") ++\((" + NUM + r")\)")


def running_losses(text: str) -> dict[str, float]:
    """``Name value (average)`` / ``name: value (average)`` pairs whose name holds "loss",
    the current value of each, and the plain ``name: value`` ones."""
    out = _colon_losses(text)
    for k, v, _avg in _RUNNING.findall(text):
        if is_loss_key(k):
            out[k] = float(v)
    return out


# ------------------------------------------------------------------ a hand-written "[37/500] ..."
_BRACKET = re.compile(r"\[ *+(\d++) *+/ *+(\d++) *+\]")


def read_bracket(line: str) -> tuple[int, int, int] | None:
    """``[37/500]`` at the start of a line: (batch, batches, end)."""
    m = _BRACKET.match(line)
    return (int(m.group(1)), int(m.group(2)), m.end()) if m is not None else None
