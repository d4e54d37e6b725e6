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

import math
import re
from dataclasses import dataclass, field
from typing import Any

NUM = r"[-+]?(?:nan|inf(?:inity)?|\d++(?:\.\d*+)?(?:[eE][-+]?\d++)?|\.\d++(?:[eE][-+]?\d++)?)"

# "name: 1.23" / "name=1.23" pairs, searched from a literal start; the value is atomic.
_PAIR_COLON = re.compile(r"([A-Za-z_][\w./-]*+): (" + NUM + r")(?![\w.])", re.I)


@dataclass(frozen=True)
class Reading:
    """What one line says.  ``phase`` is set (``val``) when the line is an evaluation
    line rather than training progress; then the positions are ignored."""

    fmt: str
    epoch: int | None = None
    epochs: int | None = None
    batch: int | None = None
    batches: int | None = None
    losses: dict[str, float] = field(default_factory=dict)
    phase: str | None = None


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
        if "loss" in k.lower() and not (skip_prefix and k.startswith(skip_prefix)):
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


# ------------------------------------------------------------------ a hand-written "[37/500] ..."
_BRACKET = re.compile(r"\[ *+(\d++) *+/ *+(\d++) *+\]")


def read_bracket(line: str) -> tuple[int, int, int] | None:
    """``[37/500]`` at the start of a line: (batch, batches, end)."""
    m = _BRACKET.match(line)
    return (int(m.group(1)), int(m.group(2)), m.end()) if m is not None else None


# ------------------------------------------------------------------ the user's own pattern

POSITION_GROUPS = ("epoch", "epochs", "batch", "batches")


class PatternError(ValueError):
    """A user pattern that cannot be used; the message says why and what is allowed.
    ``key``: what is wrong, ``pattern`` or ``losses``."""

    def __init__(self, message: str, key: str = "pattern") -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class UserPattern:
    """A job's ``[progress]`` pattern, compiled: named groups epoch/epochs/batch/batches and
    the loss groups (``losses`` named in the job, or any group named ``loss`` or ``loss_*``).
    Compiled by RE2 (:func:`linear_regex`): a match takes time linear in the line, whatever
    the pattern, so no pattern can freeze the agent's supervision."""

    regex: Any  # an re2 pattern: search() and groupdict() as re's
    losses: tuple[str, ...]

    def read(self, line: str) -> Reading | None:
        m = self.regex.search(line)
        if m is None:
            return None
        g = m.groupdict()
        try:
            pos: dict[str, Any] = {k: int(g[k]) if g.get(k) else None for k in POSITION_GROUPS}
        except ValueError:
            return None
        if pos["epoch"] is None and pos["batch"] is None:
            return None
        losses = {}
        for name in self.losses:
            v = _f(g.get(name) or "")
            if v is not None:
                losses[name] = v
        return Reading("user", losses=losses, **pos)


def linear_regex(pattern: str) -> Any:
    """Compile a user's pattern with RE2 (google-re2): matching in linear time (no
    backtracking: a pattern such as ``(a+)+$`` costs what any other does).  RE2 has no
    backreferences nor lookaround; such a pattern is a :class:`PatternError` that says so."""
    try:
        import re2
    except ImportError:  # a dependency of trainctl: only a broken installation lacks it
        raise PatternError(
            "[progress] patterns need the google-re2 package (pip install "
            "google-re2): it matches in linear time"
        ) from None
    options = re2.Options()
    options.log_errors = False  # the error is ours to say, in one line
    try:
        return re2.compile(pattern, options=options)
    except re2.error as exc:
        why = (
            exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        )
        raise PatternError(
            f"not a regular expression RE2 takes: {why} (trainctl matches "
            "[progress] patterns in linear time: no backreferences, no lookaround)"
        ) from None


def compile_user_pattern(pattern: str, losses: tuple[str, ...] | list[str] = ()) -> UserPattern:
    """Compile a ``[progress]`` pattern; :class:`PatternError` says what is wrong."""
    try:
        re.compile(pattern)  # Python's own message for a pattern that is wrong in any engine
    except re.error as exc:
        raise PatternError(f"not a valid regular expression: {exc}") from None
    except RecursionError:
        raise PatternError("not a valid regular expression: nested too deeply") from None
    rx = linear_regex(pattern)
    groups = tuple(rx.groupindex)
    named_losses = tuple(losses)
    unknown_losses = [n for n in named_losses if n not in groups]
    if unknown_losses:
        raise PatternError(
            f"{', '.join(unknown_losses)}: not a named group of the pattern "
            f"(its groups: {', '.join(groups) or 'none'})",
            key="losses",
        )
    loss_groups = tuple(
        dict.fromkeys([*named_losses, *(g for g in groups if g == "loss" or g.startswith("loss_"))])
    )
    unknown = [g for g in groups if g not in POSITION_GROUPS and g not in loss_groups]
    if unknown:
        raise PatternError(
            f"unknown group name(s) {', '.join(unknown)}: a group is one of "
            f"{', '.join(POSITION_GROUPS)}, 'loss', 'loss_<name>', or a name listed in losses"
        )
    if "epoch" not in groups and "batch" not in groups:
        raise PatternError(
            "needs a named group (?P<batch>...) or (?P<epoch>...): what the line says about progress"
        )
    return UserPattern(rx, loss_groups)
