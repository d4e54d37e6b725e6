"""The numbers in a trainer's line: a tqdm/Ultralytics rate (:func:`parse_rate`) and the
``key=value`` / ``key: value`` losses (:func:`kv_losses`).  Pure: no I/O, no clock.

Used by :class:`trainctl.core.parse.ConsoleParser` on every line the trainer prints: as
there, each regex takes time linear in the line's length whatever the line.
"""

from __future__ import annotations

import math
import re

RATE_SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}

_NUM = r"[-+]?(?:nan|inf(?:inity)?|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"

# key=value / key: value.  A key is the run of [\w./-] from its first letter (or _) on.
# Each run is read once: from where the search stands (a run's start, or the end of the
# previous pair) to the run's end, then the value; when that fails the second branch skips
# the rest of the run (a later start in the same run would reach the same end and fail the
# same way: trying each one is quadratic) and gives an empty run.  The key is then the run
# from its first letter on (:func:`_kv_key`).
_KV_LOSS = re.compile(r"([\w./-]++)\s*+[:=]\s*+(?>(" + _NUM + r"))(?![\w.])|[\w./-]++", re.I)
# name value: "loss 2.31", "train_loss 2.31 (2.40)": a name that is "loss" or ends in
# "_loss" (or -, ., /), then spaces and a number.  A start only where no key character is
# before it; the lazy run is tried once per start, so the whole search stays linear.
_SPACED_LOSS = re.compile(r"(?<![\w./-])([\w./-]*?loss) ++(?>(" + _NUM + r"))(?![\w.])", re.I)
_KEY_START = re.compile(r"[A-Za-z_]", re.I)
_ASCII_KEY_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_LOSS_EXTRA = frozenset({"nll", "mse", "bce", "kl", "kld", "ce"})
# A loss measured on held-out data ("val_loss", "eval/loss"): no training progress.
EVAL_PREFIXES = ("val_", "val/", "valid_", "valid/", "validation_", "eval_", "eval/", "test_", "test/")
_EVAL_INITIALS = frozenset("vVeEtT")
_COEFFICIENTS = ("scale", "weight")  # loss_scale, loss_weight: coefficients, no losses


def parse_rate(text: str) -> float | None:
    """Batches per second from a tqdm/Ultralytics rate: ``2.8it/s``, ``5.75s/it``, ``1.6Kit/s``.

    ``None`` when ``text`` holds no rate (a first frame) or an unknown one (``?it/s``).
    """
    end = text.find("it/s")
    inverse = False
    if end < 0:
        end = text.find("s/it")
        if end < 0:
            return None
        inverse = True
    num = text[text.rfind(" ", 0, end) + 1 : end].lstrip("[(,")
    scale = RATE_SCALE.get(num[-1:]) if num[-1:].isalpha() else 1.0
    if scale is None:
        return None
    if scale != 1.0:
        num = num[:-1]
    try:
        value = float(num) * scale
    except ValueError:
        return None
    if not math.isfinite(value) or value <= 0:
        return None
    return 1.0 / value if inverse else value


def to_float(tok: str) -> float | None:
    try:
        return float(tok)
    except ValueError:
        return None


def _kv_key(run: str) -> str:
    """The key in a run of key characters: from its first letter or ``_`` on ("" if none)."""
    m = _KEY_START.search(run)
    return run[m.start() :] if m is not None else ""


def is_loss_key(key: str) -> bool:
    """A name of a loss: holds "loss" (not a coefficient: the AMP scaler's ``loss_scale``, a
    config's ``loss_weight``), or nll, mse, ..."""
    k = key.lower()
    if "loss" in k:
        return not k.endswith(_COEFFICIENTS)
    return k in _LOSS_EXTRA


def kv_losses(line: str) -> dict[str, float]:
    """The ``key=value`` / ``key: value`` pairs of ``line`` whose key names a loss, and the
    ``loss 2.31`` ones (a name that is ``loss`` or ends in ``_loss``, a space, a number)."""
    losses = {}
    for run, v in _KV_LOSS.findall(line):
        if run:
            k = run if run[0] in _ASCII_KEY_START else _kv_key(run)
            if is_loss_key(k):
                losses[k] = float(v)
    if "loss " in line.lower():
        for k, v in _SPACED_LOSS.findall(line):
            k = _kv_key(k)
            if k.lower() == "loss" or (len(k) > 4 and k[-5] in "_-./"):
                losses.setdefault(k, float(v))
    return losses


def split_eval_losses(losses: dict[str, float]) -> tuple[dict[str, float], bool]:
    """The training losses of ``losses``, and whether any was an evaluation's
    (a name starting with one of :data:`EVAL_PREFIXES`, any case)."""
    if not any(k[:1] in _EVAL_INITIALS for k in losses):  # every line: the common case first
        return losses, False
    train = {k: v for k, v in losses.items() if not k.lower().startswith(EVAL_PREFIXES)}
    return train, len(train) < len(losses)
