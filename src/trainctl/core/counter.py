"""The generic counter: the last reader of :class:`trainctl.core.parse.ConsoleParser`, for a
line no known format claimed: one clear ``N/M`` with a sign of training next to it.  Pure.

Like every pattern of the parser these run on every line the trainer prints: each takes
time linear in the line's length (possessive repetitions; see :mod:`trainctl.core.parse`).
"""

from __future__ import annotations

import re
from typing import cast

# The generic counter: one "N/M" in a line that says nothing else a reader knows, with a
# sign of training next to it (a loss pair, a rate, an elapsed/ETA clock).  Not a date (3
# parts), a path or a version (a letter, dot or slash against it), a quantity (a unit after
# it), a count of things that are not batches (a noun after it: "1/2 nodes", "3/10 kernels"),
# or a ratio or an identifier (a word before it: accuracy, rank, GPU, ...).
_GENERIC = re.compile(
    r"(?<![\w./:-])(\d++) ?/ ?(\d++)(?![\w./:-]|\s*+(?:[kKMGT]i?B|bytes|%|(?i:"
    r"files?|images?|imgs|samples?|tokens?|items?|nodes?|workers?|ranks?|"
    r"shards?|kernels?|configs?|configurations?|trials?|folds?|attempts?|"
    r"requests?|retries|tries|gpus?|devices?|processes|jobs?|tasks?|tests?|"
    r"chunks?|parts?))\b)"
)
# A rate anywhere in the line.  A clock is no sign by itself (nearly every log line starts
# with a time of day): only an elapsed/ETA clock right after the counter is (_NEAR_CLOCK).
_GENERIC_SIGN = re.compile(r"\b(?:\d++(?:\.\d++)?\s*+(?:it|s|steps?|batch(?:es)?)/s|s/it)\b", re.I)
# Matched where the counter ends: separators, then tqdm's "[00:10<00:12" / "[00:00, ", a
# labelled "ETA 00:41" / "elapsed: 0:12", or "00:12 elapsed" / "00:12 remaining".
_NEAR_CLOCK = re.compile(
    r"[\s|,;]*+(?:\[\s*+\d++:\d\d(?::\d\d)?\s*+[<,\]]|(?:eta|elapsed|remaining|left)\b\W{0,3}\d++:\d\d"
    r"|\d++:\d\d(?::\d\d)?\s*+(?:elapsed|remaining|left|eta)\b)",
    re.I,
)
# A word just before the counter that makes it something else than a batch counter:
# "epoch 1/10" is the epoch (the key=value reader had its say on it), the rest a ratio, an
# identifier or a count of things.
_RATIO_WORDS = frozenset(
    {
        "epoch",
        "epochs",
        "acc",
        "accuracy",
        "correct",
        "top1",
        "top5",
        "top-1",
        "top-5",
        "hits",
        "score",
        "ratio",
        "matched",
        "match",
        "rank",
        "node",
        "nodes",
        "gpu",
        "gpus",
        "device",
        "cuda",
        "worker",
        "workers",
        "process",
        "proc",
        "shard",
        "shards",
        "split",
        "layer",
        "layers",
        "head",
        "heads",
        "file",
        "files",
        "on",
        "at",
        "since",
        "until",
        "date",
        "day",
        "of",
        "passed",
        "failed",
        "tests",
        "checkpoint",
        "loading",
        "loaded",
        "downloading",
        "downloaded",
        "scanning",
        "caching",
        "cached",
        "saving",
        "fold",
        "folds",
        "trial",
        "trials",
        "attempt",
        "attempts",
        "request",
        "requests",
        "retry",
        "retries",
        "try",
        "kernel",
        "kernels",
        "config",
        "configs",
        "util",
        "utilization",
        "usage",
        "mem",
        "memory",
        "job",
        "jobs",
        "task",
        "tasks",
    }
)


def generic_counter(line: str, low: str) -> tuple[int, int, int] | None:
    """The one ``N/M`` counter (N <= M, M >= 2) of ``line`` that no word before it makes a
    ratio, an identifier or a count of things: (N, M, the index where it ends).  None when
    ``line`` holds none, or more than one.  ``low`` is ``line.lower()``."""
    found = _GENERIC.findall(line)
    if len(found) != 1:
        return None
    n, m = int(found[0][0]), int(found[0][1])
    if m < 2 or n > m:
        return None
    at = cast(re.Match[str], _GENERIC.search(line))  # findall found it
    before = low[: at.start()].replace(":", " ").replace("=", " ").split()
    word = before[-1].strip("[(#|,-") if before else ""
    if not word and len(before) > 1:  # "epoch # 1/10", "request | 2/5"
        word = before[-2].strip("[(#|,-")
    if word in _RATIO_WORDS:
        return None
    return n, m, at.end()


def training_sign(line: str, end: int) -> bool:
    """A rate anywhere in ``line``, or an elapsed/ETA clock right after the counter that
    ends at ``end``."""
    return _GENERIC_SIGN.search(line) is not None or _NEAR_CLOCK.match(line, end) is not None
