"""The signature catalog's prefilter: which patterns could match a line, from its tokens.
Pure.  :class:`trainctl.core.signatures.Catalog` builds one (:func:`build_prefilter`) over
its patterns and tries only the patterns it names on each line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# The prefilter must never reject a line that some pattern matches.  From each pattern's
# parse tree we take something every match must contain: preferably a trigger WORD, an
# alphabetic run that sits between two non-letters inside a required literal, so it is a
# whole token of any matching line (checked with one findall + one set lookup), else a
# required literal substring (checked with `in`).
_WORD_RE = re.compile(r"[A-Za-z]+")
_INNER_WORD_RE = re.compile(r"(?<=[^A-Za-z])[A-Za-z]+(?=[^A-Za-z])")  # bounded inside a run
# Words frequent in healthy output (logs, dmesg): poor triggers, a rarer word is chosen.
_COMMON_WORDS = frozenset(
    "the and for not with from this that was are has have all can its will you your one "
    "loss epoch train val images instances size error warning info file files line at in on "
    "is to of by it be or an as no use using gpu access available checkpoint "
    "starting off out find status create object process checks could "
    "runtimeerror processgroupnccl".split()
)  # the last two: every traceback / every c10d log line

# Words in almost every line of a training log: a literal inside one is a poor needle.
_TRAINING_WORDS = ("loss", "epoch", "train", "batch", "step", "images", "instances", "size")


class _Prefilter:
    """Which patterns could match a line, from its tokens: a cheap superset test.

    Indices are positions in the catalog's flat (signature index, pattern) list.  ``words``
    maps a trigger word to the patterns that require it, ``substrings`` lists (literal,
    patterns) for patterns without a provable word, each literal once, and ``always`` holds
    patterns that have neither (tried on every line).
    """

    def __init__(
        self,
        words: dict[str, frozenset[int]],
        substrings: tuple[tuple[str, frozenset[int]], ...],
        always: frozenset[int],
    ):
        self.words = words
        self.substrings = substrings
        self.always = always

    def candidates(self, line: str) -> set[int] | frozenset[int]:
        found: set[int] | frozenset[int] = self.always
        words = self.words
        for token in _WORD_RE.findall(line):
            hit = words.get(token)
            if hit is not None:
                found = found | hit
        for text, hit in self.substrings:
            if text in line:
                found = found | hit
        return found


def build_prefilter(patterns: Iterable[tuple[int, re.Pattern[str]]]) -> _Prefilter:
    words: dict[str, set[int]] = {}
    substrings: dict[str, set[int]] = {}
    always: set[int] = set()
    for index, (_sig, p) in enumerate(patterns):
        found = required_words(p)
        if found:
            for word in found:
                words.setdefault(word, set()).add(index)
            continue
        literal = required_literals(p)
        if literal:
            for text in literal:
                substrings.setdefault(text, set()).add(index)
        else:
            always.add(index)
    return _Prefilter(
        {w: frozenset(i) for w, i in words.items()},
        tuple((text, frozenset(substrings[text])) for text in sorted(substrings, key=lambda s: (-len(s), s))),
        frozenset(always),
    )


def required_words(pattern: re.Pattern[str]) -> frozenset[str] | None:
    """Whole alphabetic tokens, one of which occurs in every match, or None."""
    best = _best(pattern, "word")
    return best if best is not None and min(map(len, best)) >= 3 and _word_score(best) > 0 else None


def required_literals(pattern: re.Pattern[str]) -> frozenset[str] | None:
    """Literal strings, one of which occurs in every match, or None."""
    best = _best(pattern, "literal")
    return best if best is not None and min(map(len, best)) >= 2 else None


def _best(pattern: re.Pattern[str], kind: str) -> frozenset[str] | None:
    if pattern.flags & re.IGNORECASE:
        return None
    try:
        from re import _constants as C  # type: ignore[attr-defined]  # private, stable since 3.11
        from re import _parser  # type: ignore[attr-defined]

        parsed = _parser.parse(pattern.pattern, pattern.flags)
    except Exception:  # noqa: BLE001 - a Python without these: no prefilter, still correct
        return None
    score = _word_score if kind == "word" else _literal_score
    return max(_options(list(parsed), C, kind), key=score, default=None)


def _word_score(option: frozenset[str]) -> float:
    worst = min(option, key=len)
    if any(w.lower() in _COMMON_WORDS for w in option):
        return 0
    return len(worst) + (2 if any(c.isupper() for c in worst) else 0)


def _literal_score(option: frozenset[str]) -> float:
    shortest = min(len(s) for s in option)
    in_training_word = any(s.lower() in w for s in option for w in _TRAINING_WORDS)
    return shortest - 0.5 if in_training_word else shortest


def _options(items: list[tuple[Any, Any]], C: Any, kind: str) -> list[frozenset[str]]:
    """Candidate needle sets for a sequence of parsed regex items: every match of the
    sequence contains at least one string of each returned set.

    In "word" mode an item that always matches a non-letter (``\\s``, ``\\d``, ``[:=]``,
    ``\\b``, ``^``, ``$``) does not end the literal run but marks a token boundary in it.
    """
    out: list[frozenset[str]] = []
    run: list[str] = []

    def flush() -> None:
        if run:
            text = "".join(run)
            if kind == "literal":
                out.append(frozenset([text]))
            else:
                out.extend(frozenset([m.group()]) for m in _INNER_WORD_RE.finditer(text))
            run.clear()

    score = _word_score if kind == "word" else _literal_score
    for op, av in items:
        if op is C.LITERAL:
            run.append(chr(av))
            continue
        if kind == "word" and _is_boundary(op, av, C):
            run.append("\0")  # a non-letter stands for the boundary
            continue
        flush()
        if op is C.SUBPATTERN:
            _group, add_flags, _del, sub = av
            if not add_flags & re.IGNORECASE:
                out.extend(_options(list(sub), C, kind))
        elif op is C.ATOMIC_GROUP:
            out.extend(_options(list(av), C, kind))
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT) and av[0] >= 1:
            out.extend(_options(list(av[2]), C, kind))
        elif op is C.BRANCH:
            union: set[str] = set()
            for alt in av[1]:
                choice = max(_options(list(alt), C, kind), key=score, default=None)
                if choice is None:
                    break
                union |= choice
            else:
                out.append(frozenset(union))
    flush()
    return out


def _is_boundary(op: Any, av: Any, C: Any) -> bool:
    """True when the item can only match where a letter run starts or ends."""
    if op is C.AT:
        return av in (C.AT_BOUNDARY, C.AT_BEGINNING, C.AT_BEGINNING_STRING, C.AT_END, C.AT_END_STRING)
    if op is C.IN:
        return _non_letter_set(av, C)
    if op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT) and av[0] >= 1 and len(av[2]) == 1:
        inner_op, inner_av = av[2][0]
        return (inner_op is C.LITERAL and not chr(inner_av).isalpha()) or (
            inner_op is C.IN and _non_letter_set(inner_av, C)
        )
    return False


def _non_letter_set(members: list[tuple[Any, Any]], C: Any) -> bool:
    """True for a character class that matches no ASCII letter (e.g. \\s, \\d, [:=])."""
    for op, av in members:
        if op is C.LITERAL and not chr(av).isalpha():
            continue
        if op is C.CATEGORY and av in (C.CATEGORY_SPACE, C.CATEGORY_DIGIT, C.CATEGORY_NOT_WORD):
            continue
        if op is C.RANGE and not any(chr(c).isalpha() for c in range(av[0], av[1] + 1)):
            continue
        return False
    return True
