"""Trainer console output → lines → progress and phase events.  Pure: no I/O, no clock.

Two pieces:

* :class:`~trainctl.core.lines.LineSplitter` (:mod:`trainctl.core.lines`) turns the raw
  byte stream of a trainer's stdout/stderr into text lines.
* :class:`ConsoleParser` reads those lines and returns :class:`Progress` / :class:`Phase`
  events.  Formats: Ultralytics 8.4 (own TQDM), Ultralytics 8.3 (tqdm), generic tqdm bars,
  plain ``key=value`` logs, and the trainers in :mod:`trainctl.core.formats` (HF Trainer,
  timm, MMEngine, Keras, Megatron, nanoGPT, ``[epoch/E][i/N]``, JSON lines, ...), plus a job's
  own pattern (:mod:`trainctl.core.user_pattern`, tried first),
  and last the generic counter (:mod:`trainctl.core.counter`).  Rates and ``key=value``
  losses are read by :mod:`trainctl.core.values`.
  ``ConsoleParser.last_format`` names the reader that claimed the last line it read.
  A line it cannot read gives no event, never an exception.

Every regex here runs on every line the trainer prints, on the agent's only event loop, so
each one must take time linear in the line's length whatever the line: repetitions that
meet something they could also match are possessive (``*+``), and no pattern can start
many overlapping attempts that each read to the end of the line.  ``bench/bench_parse.py``
prints the time per line against its length; the tests feed long hostile lines.
"""

from __future__ import annotations

import math
import re

from trainctl.core import formats as F
from trainctl.core.counter import generic_counter, training_sign
from trainctl.core.events import Event, Phase, Progress
from trainctl.core.reading import Reading
from trainctl.core.sanitize import MAX_LINE, cut_line
from trainctl.core.user_pattern import UserPattern
from trainctl.core.values import RATE_SCALE, is_loss_key, kv_losses, parse_rate, split_eval_losses, to_float

# ---------------------------------------------------------------------------- patterns

DEFAULT_LOSS_NAMES = ("box_loss", "cls_loss", "dfl_loss")

# Ultralytics batch line, 8.4 (own TQDM) and 8.3 (tqdm):
#   "        1/3    0G   1.79   1.213   1.093   4   64: 8% ━─── 2/24 4.8it/s 0.3s<4.5s"
#   "     80/400  29.9G  0.6966  0.3341  1.085  31  640: 100%|██████████| 351/351 [04:18<00:00,  1.36it/s]"
# Something always follows the count (8.4: rate and elapsed, 8.3: tqdm's [...]): a frame cut
# short by a kill ("... 4/2") is not read as batch 4 of 2.  The 8.4 rate is captured here
# (groups 6-8); 8.3's is read from the tail.  No lazy groups: this runs on every frame.
# The 8.4 bar (━━━──) holds no digit and no space; the counts follow it.
_UL_BATCH = re.compile(
    r" *+(\d++)/(\d++) ++[^ :]*G ++([^:]*+): *+\d++%(?:\|[^|]*+\|| [^ \d]*+) *+(\d++)/(\d++) ++"
    r"(?:(\d++(?:\.\d*+)?)([kKMG]?)(it/s|s/it)\b)?(.*)$"
)
# Ultralytics validation bars (detect/seg/pose/obb and classify).
_UL_VAL = re.compile(r"\s++(?:Class\s++Images\s++Instances\s++\w++\(P|classes\s++top1_acc)")
_UL_DONE = re.compile(r"\d++ epochs? completed in ")
# Any tqdm bar:  "desc:  45%|████▌     | 45/100 [00:10<00:12,  4.40it/s, loss=0.123]"
# The description ends at a colon before the first "%|" (so only one colon can be tried:
# a lazy (.*?): would try the rest of the line after every colon, quadratic).
# The bar is optional ("Epoch 2/3:  25%| 5/20 [00:00, 17.14it/s, loss=1.3]": a tqdm-like
# line with no bar characters), and so is the bracket, "<remaining" in it or not.
_TQDM = re.compile(
    r"(?:((?:(?!%\|).)*?):)?\s*+(\d++)%\|(?:[^|]*+\|)?\s*+(\d++)/(\d++)\s*+"
    r"(?:\[([^\]]*+)\]?)?([^\[\]]*+)$"
)
# tqdm without a total: "Epoch 2: 45it [00:10,  4.40it/s, loss=0.1]"
_TQDM_NOTOTAL = re.compile(r"(?:((?:(?!it \[).)*?):)?\s*+(\d++)it \[([^\]]*+)\]?\s*+$")

_EPOCH_IN = re.compile(r"\bepoch(?:s)?\b\W{0,3}?(\d++)(?:\s*+/\s*+(\d++))?", re.I)
# "epoch 2", "Step: 40", "batch=3/30", "iter #[ 5 / 9": spaces, one of :=#, one [, digits.
# A word after a slash is a unit ("ms/batch 45.67", pytorch/examples word_language_model).
# Searched in the lower-cased line (faster than re.I).
_COUNTER = re.compile(
    r"(?<!/)\b(epoch|step|batch|iter|iteration)s?\b\s*+(?:[:=#]\s*+)?(?:\[\s*+)?(\d++)"
    r"(?:\s*+/\s*+(\d++))?"
)
# torchvision references: "Epoch: [0]  [  0/1563]  eta: ...  loss: 6.9"
_BRACKET_BATCH = re.compile(
    r"\bepoch\b\W*+\d++\s*+(?:/\s*+\d++\s*+)?(?:\]\s*+)?\[\s*+(\d++)\s*+/\s*+(\d++)\s*+\]", re.I
)
_VAL_WORD = re.compile(
    r"\b(?:val|valid|validation|validating|eval|evaluation|evaluating|test|"
    r"testing|sanity checking)\b",
    re.I,
)
# Bars of data preparation, not training (HF's "Loading checkpoint shards", datasets' "Map").
_SKIP_DESC = re.compile(
    r"Scanning|Download|Caching|Class\s+Images|Optimizer stripped|Loading|"
    r"\bMap\b|\bFilter\b|Generating|Resolving|Fetching|Extracting|Upload|"
    r"Tokeniz|Saving",
    re.I,
)
_RANK_PREFIX = re.compile(r"\[(?:rank|default)(\d++)\]:?\s?")
# After "epoch N[/M]": separators, then "37/500" (a hand-written loop, fairseq's simple bar).
_AFTER_EPOCH = re.compile(r"\s*+[:,|\]-]?\s*+(?:[\[(]\s*+)?(\d++)\s*+/\s*+(\d++)")
# A tqdm bar of bytes (a download, an upload): "570/570 [00:00<00:00, 2.1MB/s]", "?B/s".
_BYTE_RATE = re.compile(r"[\d?]\s*+[kKMGTPE]?i?B/s\b")
_EPOCH_LINE = re.compile(
    r"\s*+epoch\s*+(?:\[\s*+)?(\d++)\s*+(?:/|of)\s*+(\d++)\s*+(?:\]\s*+)?(?::\s*+)?$", re.I
)


# The trainers' readers (src/trainctl/core/formats.py), each tried only when one of its needles is in
# the line: most lines hold none, and an `in` test costs far less than a regex.
_READERS = (
    (("{'",), F.read_hf_dict),
    (('{"',), F.read_json_line),
    (("][",), F.read_epoch_batch),
    (("Train: ",), F.read_timm),
    (("Test",), F.read_timm_test),
    (("/step", "ETA: "), F.read_keras),
    (("━",), F.read_lightning_rich),  # the rich bar's heavy line
    (("Epoch", "Iter"), F.read_mm),
    (("loss train: ",), F.read_litgpt),
    ((" iteration ",), F.read_megatron),
    ((" loss ",), F.read_nanogpt),
    (("skipped=", "global_step="), F.read_deepspeed),
)


def _has_val_word(text: str, low: str | None = None) -> bool:
    """``_VAL_WORD.search(text)``, with a substring test first: every one of its words holds
    "val", "test" or "sanity", and most lines hold none (the regex costs ~3 us a line).
    ``low`` is ``text.lower()`` when the caller has it."""
    if low is None:
        low = text.lower()
    if "val" not in low and "test" not in low and "sanity" not in low:
        return False
    return _VAL_WORD.search(text) is not None


def _training_losses(line: str, low: str) -> tuple[dict[str, float], bool]:
    """The line's ``key=value`` losses less an evaluation's, and whether it had one; the
    split only where "val" or "test" is in the line (most lines: neither)."""
    losses = kv_losses(line)
    if losses and ("val" in low or "test" in low):
        return split_eval_losses(losses)
    return losses, False


def _line_rate(line: str) -> float | None:
    """:func:`parse_rate` where the line can hold ``it/s`` or ``s/it`` at all."""
    return parse_rate(line) if "/s" in line or "s/" in line else None


# ---------------------------------------------------------------------------- parser


class ConsoleParser:
    """Stateful reader of a trainer's console lines.

    ``feed(line, now)`` returns the events the line implies: a :class:`Phase` when the phase
    changes (the first progress line means ``train``; an Ultralytics validation bar ``val``;
    ``N epochs completed in`` ``finished``), then a :class:`Progress` for a batch line.
    Loss names come from the last Ultralytics header seen (``box_loss cls_loss dfl_loss``
    when none was).  Once an Ultralytics header or batch line has been seen, the generic
    tqdm and key=value readers are switched off so that scan bars and argument dumps are
    never mistaken for progress.
    """

    def __init__(self, user: UserPattern | None = None) -> None:
        self.phase: str | None = None
        self.loss_names: tuple[str, ...] = DEFAULT_LOSS_NAMES
        self.ultralytics = False
        self.user = user
        # The reader that claimed the last line read (a name: "ultralytics84", "tqdm",
        # "keyvalue", "hf_dict", "user", ...); a line no reader claims leaves it as it was,
        # so a caller that wants it per line (scan --explain) sets it to None first.
        self.last_format: str | None = None
        self._context_epoch: tuple[int, int | None] | None = None
        self._composer: tuple[int | None, int | None, int | None] | None = None

    # -- entry point
    def feed(self, line: str, now: float) -> list[Event]:
        if len(line) > MAX_LINE:
            line = cut_line(line)
        if self.user is not None:
            r = self.user.read(line)
            if r is not None:
                return self._reading(r, now, None, _line_rate(line))
        if "%" in line and "/" in line:
            # Fast path: an Ultralytics batch frame (the overwhelming majority of lines).
            m = _UL_BATCH.match(line)
            if m is not None:
                return self._ultralytics(m, now, None)
        rank = None
        if line[:1] == "[":
            rm = _RANK_PREFIX.match(line)
            if rm is not None:
                rank = int(rm.group(1))
                line = line[rm.end() :]
                if "%" in line and "/" in line:
                    m = _UL_BATCH.match(line)
                    if m is not None:
                        return self._ultralytics(m, now, rank)
        return self._slow(line, now, rank)

    def _slow(self, line: str, now: float, rank: int | None) -> list[Event]:
        stripped = line.lstrip()
        if stripped.startswith("Epoch") and ("GPU_mem" in line or "gpu_mem" in line):
            self._header(stripped)
            self.last_format = "ultralytics_header"
            return []
        if _UL_VAL.match(line):
            return self._phase("val", now) if self.phase != "finished" else []
        if _UL_DONE.match(stripped):
            self.last_format = "ultralytics"
            return self._phase("finished", now)
        if self.ultralytics:
            return []
        if "%|" in line or "it [" in line:
            return self._tqdm(line, now, rank)
        if ":" in line or "[" in line or "{" in line:
            r = self._known(line)
            if r is not None:
                return self._reading(r, now, rank, _line_rate(line))
        low = line.lower()
        if "epoch" in low or "step" in low or "batch" in low or "iter" in low:
            events = self._keyvalue(line, now, rank, low)
            if events or self.last_format == "epoch_header":
                return events
        if "/" in line:
            return self._generic(line, now, rank, low)
        return []

    def _known(self, line: str) -> Reading | None:
        """The trainers' own formats (:mod:`.formats`), each behind a substring test."""
        batch: int | None
        batches: int | None
        if line[:1] == "[":
            if line.startswith(("[epoch=", "[batch=", "[Eval batch=")):
                r = F.read_composer(line)
                if r is not None:
                    self._composer = (r.epoch, r.batch, r.batches)
                    return r
            b = F.read_bracket(line) if "][" not in line else None
            if b is not None:
                batch, batches, end = b
                rest = line[end:]
                losses = kv_losses(rest)
                if losses or not rest.strip(" :-|"):
                    epoch, epochs = self._context_epoch or (None, None)
                    return Reading(
                        "bracket", epoch=epoch, epochs=epochs, batch=batch, batches=batches, losses=losses
                    )
        for needles, reader in _READERS:
            for needle in needles:
                if needle in line:
                    r = reader(line)
                    if r is not None:
                        return self._with_context(r) if r.fmt == "keras" else r
                    break
        if self._composer is not None and "Train loss/train/" in line:
            kv = F.read_composer_loss(line)
            if kv is not None:
                epoch, batch, batches = self._composer
                return Reading("composer", epoch=epoch, batch=batch, batches=batches, losses={kv[0]: kv[1]})
        return None

    def _with_context(self, r: Reading) -> Reading:
        """A Keras bar takes its epoch from the "Epoch 2/10" line printed before it."""
        if self._context_epoch is None:
            return r
        epoch, epochs = self._context_epoch
        return Reading(r.fmt, epoch=epoch, epochs=epochs, batch=r.batch, batches=r.batches, losses=r.losses)

    def _reading(self, r: Reading, now: float, rank: int | None, rate: float | None) -> list[Event]:
        self.last_format = r.fmt
        if r.phase is not None:
            return self._phase(r.phase, now) if self.phase != "finished" else []
        return self._emit(
            Progress(
                now,
                epoch=r.epoch,
                epochs=r.epochs,
                batch=r.batch,
                batches=r.batches,
                losses=dict(r.losses),
                rate=rate,
                rank=rank,
            )
        )

    # -- helpers
    def _phase(self, phase: str, now: float) -> list[Event]:
        if phase == self.phase:
            return []
        self.phase = phase
        return [Phase(now, phase)]

    def _emit(self, p: Progress) -> list[Event]:
        """A progress, preceded by ``Phase(train)`` when it ends another phase."""
        if self.phase == "train":
            return [p]
        self.phase = "train"
        return [Phase(p.ts, "train"), p]

    def _header(self, stripped: str) -> None:
        cols = stripped.split()
        names = [c for c in cols[2:] if c not in ("Instances", "Size")]
        if names:
            self.loss_names = tuple(names)
        self.ultralytics = True

    def _ultralytics(self, m: re.Match[str], now: float, rank: int | None) -> list[Event]:
        self.ultralytics = True
        epoch, epochs, desc, batch, batches, num, prefix, unit, tail = m.groups()
        self.last_format = "ultralytics84" if num is not None else "ultralytics"
        toks = desc.split()
        if toks and toks[-1][-1] == "…":  # desc cut to the terminal width: no Instances/Size
            values = toks[:-1]
        else:
            values = toks[:-2]
        names = self.loss_names
        try:
            if len(values) > len(names):
                raise ValueError(values)
            losses = dict(zip(names, map(float, values)))
        except ValueError:
            losses = self._some_losses(values)
        rate: float | None
        if num is not None:
            rate = float(num) * RATE_SCALE[prefix]
            rate = rate if unit == "it/s" else (1.0 / rate if rate else None)
        else:
            rate = parse_rate(tail)
        return self._emit(
            Progress(
                now,
                epoch=int(epoch),
                epochs=int(epochs),
                batch=int(batch),
                batches=int(batches),
                losses=losses,
                rate=rate or None,
                rank=rank,
            )
        )

    def _some_losses(self, values: list[str]) -> dict[str, float]:
        """The losses that parse, named by the header (extra columns become ``lossN``)."""
        names = self.loss_names
        losses = {}
        for i, tok in enumerate(values):
            v = to_float(tok)
            if v is not None:
                losses[names[i] if i < len(names) else f"loss{i}"] = v
        return losses

    def _tqdm(self, line: str, now: float, rank: int | None) -> list[Event]:
        m = _TQDM.match(line)
        if m is not None:
            desc, batch, batches, inside = m.group(1), int(m.group(3)), int(m.group(4)), m.group(5)
            if inside is None:  # no [elapsed<remaining, rate, postfix]: "17.1it/s loss=1.3"
                if parse_rate(m.group(6)) is None:
                    return []  # a frame cut short ("45/10"), or not a bar
                return self._tqdm_event(
                    desc, batch, batches, now, rank, parse_rate(m.group(6)), kv_losses(m.group(6))
                )
        else:
            m = _TQDM_NOTOTAL.match(line)
            if m is None:
                return []
            desc, batch, batches, inside = m.group(1), int(m.group(2)), None, m.group(3)
        parts = inside.split(",")
        if len(parts) > 1 and "B/s" in parts[1] and _BYTE_RATE.search(parts[1]):
            return []  # a download's bar: bytes per second, not batches
        losses = {}
        for part in parts[2:]:
            k, sep, v = part.partition("=")
            k = k.strip()
            if sep and is_loss_key(k):
                f = to_float(v.strip())
                if f is not None:
                    losses[k] = f
        return self._tqdm_event(
            desc, batch, batches, now, rank, parse_rate(parts[1]) if len(parts) > 1 else None, losses
        )

    def _tqdm_event(
        self,
        desc: str | None,
        batch: int,
        batches: int | None,
        now: float,
        rank: int | None,
        rate: float | None,
        losses: dict[str, float],
    ) -> list[Event]:
        desc = desc or ""
        if _SKIP_DESC.search(desc):
            return []
        self.last_format = "tqdm"
        if _has_val_word(desc):
            return self._phase("val", now) if self.phase != "finished" else []
        epoch = epochs = None
        em = _EPOCH_IN.search(desc)
        tt = F.read_torchtune_desc(desc) if "|Loss: " in desc else None
        if tt is not None:
            epoch, losses = tt[0], {**tt[1], **losses}
            self.last_format = "torchtune"
        elif "loss" in desc.lower() and em is None:  # PyTorch-Ignite's desc "ITERATION - loss: 0.30"
            losses = {**kv_losses(desc), **losses}
            if self._context_epoch is not None:
                epoch, epochs = self._context_epoch
        elif em is not None:
            epoch = int(em.group(1))
            epochs = int(em.group(2)) if em.group(2) else None
        elif self._context_epoch is not None:
            epoch, epochs = self._context_epoch
        return self._emit(
            Progress(
                now,
                epoch=epoch,
                epochs=epochs,
                batch=batch,
                batches=batches,
                losses=losses,
                rate=rate,
                rank=rank,
            )
        )

    def _generic(self, line: str, now: float, rank: int | None, low: str) -> list[Event]:
        """One clear ``N/M`` counter (N <= M) next to a loss pair, a rate or an elapsed/ETA clock."""
        found = generic_counter(line, low)
        if found is None:
            return []
        n, m, end = found
        losses, evaluated = _training_losses(line, low)
        if not losses and not evaluated and not training_sign(line, end):
            return []
        if _SKIP_DESC.search(line):
            return []
        self.last_format = "counter"
        if (evaluated and not losses) or _has_val_word(line, low):
            return self._phase("val", now) if self.phase != "finished" else []
        epoch, epochs = self._context_epoch or (None, None)
        return self._emit(
            Progress(
                now,
                epoch=epoch,
                epochs=epochs,
                batch=n,
                batches=m,
                losses=losses,
                rate=parse_rate(line),
                rank=rank,
            )
        )

    def _keyvalue(self, line: str, now: float, rank: int | None, low: str) -> list[Event]:
        em = _EPOCH_LINE.match(line)
        if em is not None:  # "Epoch 2/10" on its own line: context for tqdm and Keras bars below it
            self._context_epoch = (int(em.group(1)), int(em.group(2)))
            self.last_format = "epoch_header"
            return []
        epoch = epochs = batch = batches = None
        epoch_end = -1
        for m in _COUNTER.finditer(low):
            key, n, total = m.groups()
            n = int(n)
            total = int(total) if total else None
            if key == "epoch":
                if epoch is None:
                    epoch, epochs, epoch_end = n, total, m.end()
            elif batch is None:
                batch, batches = n, total
        if batch is None and epoch_end >= 0:
            # "Epoch 2/10: 37/500 loss=0.41", fairseq's "epoch 001:    100 / 1000 loss=..."
            fm = _AFTER_EPOCH.match(low, epoch_end)
            if fm is not None:
                batch, batches = int(fm.group(1)), int(fm.group(2))
        if batch is None:
            bm = _BRACKET_BATCH.search(line)
            if bm is not None:
                batch, batches = int(bm.group(1)), int(bm.group(2))
        if epoch is None and batch is None:
            return []
        losses, evaluated = _training_losses(line, low)
        if not losses and batches is None and not evaluated:
            return []  # "epochs=2, batch=4" in an argument dump is not progress
        self.last_format = "keyvalue"
        if (evaluated and not losses) or _has_val_word(line, low):
            # "step:125/1750 val_loss:4.12", "epoch 0: perplexity: 35.1 eval_loss: 3.55"
            return self._phase("val", now) if self.phase != "finished" else []
        if epoch is None and self._context_epoch is not None:
            epoch, epochs = self._context_epoch
        return self._emit(
            Progress(
                now,
                epoch=epoch,
                epochs=epochs,
                batch=batch,
                batches=batches,
                losses=losses,
                rate=_line_rate(line),
                rank=rank,
            )
        )


def is_nan_loss(progress: Progress) -> bool:
    """True when any loss in ``progress`` is NaN or infinite."""
    return any(not math.isfinite(v) for v in progress.losses.values())


_RANK_TAG = re.compile(r"\[(?:PG [^\]]*?)?Rank (\d+)\]")


def line_rank(line: str) -> int | None:
    """The rank a line speaks of: torchrun's and DDP's ``[rank1]:`` prefix, else the
    ``[Rank 1]`` / ``[PG 0 (default_pg) Rank 1]`` tag of ProcessGroupNCCL/gloo messages."""
    m = _RANK_PREFIX.match(line) or _RANK_TAG.search(line)
    return int(m.group(1)) if m else None
