"""The warning catalog and the matcher: known-bad log lines -> Warning events.

The catalog is data (``signatures.toml`` next to this file): each signature has regex
patterns, a severity, an action and advice, plus the real log lines it was written from.
:class:`Catalog` loads and validates it and matches one line at a time; the FIRST
signature in file order that matches wins (order is precedence).  :class:`WarningMatcher`
turns matches into :class:`~trainctl.core.events.Warning` events, once per id, counting
repeats (re-emitted at 10, 100, 1000, ... so a flood stays visible but bounded).

Speed: healthy progress lines are the vast majority.  From each pattern's parse tree we
derive something every match must contain (a whole word, else a literal substring); a
line's words then select the few patterns that could match it, and only those are tried
(most healthy lines: none; a signature's other wordings cost nothing unless their word is
in the line).

Pure: no clock, no I/O except reading the catalog file.
"""
from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from trainctl.core.events import SEVERITIES, Progress, Warning
from trainctl.core.sanitize import MAX_LINE, cut_line, sanitize, strip_ansi

ACTIONS = ("ignore", "warn", "suggest_preset", "restart", "fallback", "stop")
SOURCES = ("trainer", "kernel", "any")
LOSS_NAN = "loss.nan"
MAX_TEXT = 500
DEFAULT_PATH = Path(__file__).with_name("signatures.toml")

_ID_RE = re.compile(r"^[a-z0-9_]+(?:\.[a-z0-9_]+)+$")
_SEGMENT_RE = re.compile(r"[\r\n]+")
# Prefixes that carry no meaning for matching (parsing notes §11): DDP rank tags, glog
# headers, kernel timestamps (dmesg, dmesg -T, dmesg -H, journalctl).
_PREFIX_RE = re.compile(
    r"(?:\[rank\d+\]:\s?"
    r"|\[default\d+\]:\s?"
    r"|\[\d+\] "
    r"|\[?[EWIFV]\d{3,4} \d\d:\d\d:\d\d\.\d+(?: +\d+)? \S+:\d+\] "
    r"|\[[EWIF] \S+:\d+\] "
    r"|\[\s*\d+\.\d+\] "
    r"|\[\s*\+\d+\.\d+\] "
    r"|\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d [\d:]{8} \d{4}\] "
    r"|\[[A-Z][a-z]{2}\d{1,2} \d\d:\d\d\] "
    r"|[A-Za-z]{3} [ \d]\d [\d:]{8} \S+ kernel: "
    r"|kernel: )"
)
_REQUIRED = ("id", "title", "severity", "source", "action", "patterns", "advice", "examples")
_OPTIONAL = ("startup_evidence", "per_code", "before_progress")
_CODE_KEYS = ("title", "severity", "action", "advice")


class CatalogError(ValueError):
    """A catalog file is invalid; the message names the file, the signature and the key."""


@dataclass(frozen=True)
class Signature:
    """One known log signature (see the header of signatures.toml for the fields)."""

    id: str
    title: str
    severity: str
    source: str
    action: str
    patterns: tuple[re.Pattern[str], ...]
    advice: str
    examples: tuple[str, ...] = ()
    startup_evidence: bool = False
    per_code: str | None = None
    before_progress: bool = False   # its action holds only before the attempt's first batch

    def search(self, line: str) -> re.Match[str] | None:
        """The first pattern's match in ``line`` (already normalised), or None."""
        for pattern in self.patterns:
            m = pattern.search(line)
            if m is not None:
                return m
        return None

    def applies_to(self, source: str) -> bool:
        return source == "any" or self.source == "any" or self.source == source


@dataclass(frozen=True)
class CodeRule:
    """Severity, action and advice for one code of a per-code signature (Xid 79, ...)."""

    title: str
    severity: str
    action: str
    advice: str


def normalise(line: str) -> str:
    """The line as patterns see it: no ANSI codes, no rank/glog/timestamp prefixes."""
    line = strip_ansi(line)
    for _ in range(4):  # prefixes stack, e.g. "[rank0]:[E0321 ...] " or journal + [ts]
        m = _PREFIX_RE.match(line)
        if m is None or not m.end():
            break
        line = line[m.end():]
    return line


class Catalog:
    """An ordered, validated set of signatures with a fast line matcher."""

    def __init__(self, signatures: Iterable[Signature],
                 codes: dict[str, dict[str, CodeRule]] | None = None, path: str = "<catalog>"):
        self.signatures: tuple[Signature, ...] = tuple(signatures)
        self.codes = codes or {}
        self.path = path
        self._by_id = {s.id: s for s in self.signatures}
        self._derived: dict[tuple[str, str], Signature] = {}
        self._for_source = {  # indices of the signatures that apply to each source
            src: frozenset(i for i, s in enumerate(self.signatures) if s.applies_to(src))
            for src in SOURCES
        }
        # every (signature index, pattern) in catalog order: the prefilter names the patterns
        # a line could match, so a signature with many wordings costs only the ones it could
        self._patterns = tuple((i, p) for i, s in enumerate(self.signatures) for p in s.patterns)
        self._prefilter = _build_prefilter(self._patterns)

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | Path | None = None) -> Catalog:
        """Load and validate a catalog file (default: the packaged signatures.toml)."""
        p = Path(path) if path is not None else DEFAULT_PATH
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise CatalogError(f"{p}: cannot read the catalog: {e.strerror or e}") from e
        return cls.from_text(text, str(p))

    @classmethod
    def from_text(cls, text: str, path: str = "<string>") -> Catalog:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise CatalogError(f"{path}: not valid TOML: {e}") from e
        return cls.from_dict(data, path)

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: str = "<dict>") -> Catalog:
        unknown = set(data) - {"signature", "codes"}
        if unknown:
            raise CatalogError(f"{path}: unknown top-level key(s) {sorted(unknown)}; "
                               "allowed: [[signature]] entries and [codes.<name>.<code>] tables")
        entries = data.get("signature")
        if not isinstance(entries, list) or not entries:
            raise CatalogError(f"{path}: no [[signature]] entries")
        codes = _load_codes(data.get("codes", {}), path)
        sigs: list[Signature] = []
        seen: set[str] = set()
        for n, entry in enumerate(entries, 1):
            sig = _load_signature(entry, n, path, codes)
            if sig.id in seen:
                raise CatalogError(f"{path}: signature {sig.id!r} (entry {n}): duplicate id")
            seen.add(sig.id)
            sigs.append(sig)
        return cls(sigs, codes, path)

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self.signatures)

    def __iter__(self) -> Iterator[Signature]:
        return iter(self.signatures)

    def get(self, sig_id: str) -> Signature | None:
        """The signature with this id; per-code ids like ``kernel.nvidia.xid.79`` work too."""
        sig = self._by_id.get(sig_id)
        if sig is not None:
            return sig
        base, _, code = sig_id.rpartition(".")
        parent = self._by_id.get(base)
        if parent is not None and parent.per_code and code.isdigit():
            return self._derive(parent, code)
        return None

    def match(self, line: str, source: str = "trainer") -> Signature | None:
        """The first signature (in catalog order) that matches ``line``, or None.

        ``source`` is where the line came from: "trainer" or "kernel" (signatures of the
        other source are skipped); "any" tries every signature (postmortem of mixed logs).
        """
        allowed = self._allowed(source)
        if len(line) > MAX_LINE:   # before any pattern sees it
            line = cut_line(line)
        line = strip_ansi(line)
        indices = self._prefilter.candidates(line)
        if not indices:
            return None
        patterns = self._patterns
        candidates = [patterns[k] for k in sorted(indices) if patterns[k][0] in allowed]
        segments = _SEGMENT_RE.split(line) if ("\r" in line or "\n" in line) else (line,)
        for segment in segments:
            text = normalise(segment)
            for i, pattern in candidates:   # catalog order, then pattern order: first match wins
                m = pattern.search(text)
                if m is not None:
                    sig = self.signatures[i]
                    return self._derive(sig, m.group(sig.per_code)) if sig.per_code else sig
        return None

    def matches(self, line: str, source: str = "trainer") -> list[Signature]:
        """Every signature that matches ``line``, most specific (first) first."""
        text = normalise(cut_line(line))
        out = []
        allowed = self._allowed(source)
        for i, sig in enumerate(self.signatures):
            if i not in allowed:
                continue
            m = sig.search(text)
            if m is not None:
                out.append(self._derive(sig, m.group(sig.per_code)) if sig.per_code else sig)
        return out

    def startup_evidence(self, line: str, source: str = "trainer") -> bool:
        """True when ``line`` shows legitimate slow start-up work (MIOpen search, compile)."""
        sig = self.match(line, source)
        return sig is not None and sig.startup_evidence

    def _allowed(self, source: str) -> frozenset[int]:
        try:
            return self._for_source[source]
        except KeyError:
            raise ValueError(f"source must be one of {', '.join(SOURCES)}, not {source!r}") from None

    def _derive(self, sig: Signature, code: str) -> Signature:
        key = (sig.id, code)
        derived = self._derived.get(key)
        if derived is None:
            table = self.codes[sig.per_code or ""]
            rule = table.get(code) or table["default"]
            derived = dataclasses.replace(
                sig, id=f"{sig.id}.{code}", title=f"{sig.title} {code}: {rule.title}",
                severity=rule.severity, action=rule.action, advice=rule.advice, per_code=None)
            self._derived[key] = derived
        return derived


# ---------------------------------------------------------------------- validation
def _load_codes(raw: Any, path: str) -> dict[str, dict[str, CodeRule]]:
    if not isinstance(raw, dict):
        raise CatalogError(f"{path}: [codes] must be a table of tables")
    out: dict[str, dict[str, CodeRule]] = {}
    for name, table in raw.items():
        if not isinstance(table, dict) or "default" not in table:
            raise CatalogError(f"{path}: [codes.{name}] needs a [codes.{name}.default] table")
        out[name] = {}
        for code, rule in table.items():
            where = f"{path}: [codes.{name}.{code}]"
            if not (code == "default" or code.isdigit()):
                raise CatalogError(f"{where}: a code must be digits or 'default'")
            if not isinstance(rule, dict):
                raise CatalogError(f"{where}: must be a table with {', '.join(_CODE_KEYS)}")
            missing = [k for k in _CODE_KEYS if not isinstance(rule.get(k), str)]
            if missing:
                raise CatalogError(f"{where}: missing or non-string key(s) {missing}")
            extra = sorted(set(rule) - set(_CODE_KEYS))
            if extra:
                raise CatalogError(f"{where}: unknown key(s) {extra}; allowed: {', '.join(_CODE_KEYS)}")
            _check_choice(rule["severity"], SEVERITIES, f"{where}: severity")
            _check_choice(rule["action"], ACTIONS, f"{where}: action")
            out[name][code] = CodeRule(**{k: rule[k] for k in _CODE_KEYS})
    return out


def _check_choice(value: Any, allowed: tuple[str, ...], where: str) -> None:
    if value not in allowed:
        raise CatalogError(f"{where} is {value!r}; allowed: {', '.join(allowed)}")


def _load_signature(entry: Any, n: int, path: str, codes: dict[str, dict[str, CodeRule]]) -> Signature:
    if not isinstance(entry, dict):
        raise CatalogError(f"{path}: [[signature]] entry {n} is not a table")
    sid = entry.get("id")
    where = f"{path}: signature {sid!r} (entry {n})"
    if not isinstance(sid, str) or not _ID_RE.match(sid):
        raise CatalogError(f"{where}: id must be a dotted lower-case name like 'rocm.miopen.sysdb_missing'")
    missing = [k for k in _REQUIRED if k not in entry]
    if missing:
        raise CatalogError(f"{where}: missing key(s) {missing}")
    extra = sorted(set(entry) - set(_REQUIRED) - set(_OPTIONAL))
    if extra:
        raise CatalogError(f"{where}: unknown key(s) {extra}; allowed: {', '.join(_REQUIRED + _OPTIONAL)}")
    for key in ("title", "advice"):
        if not isinstance(entry[key], str) or not entry[key].strip():
            raise CatalogError(f"{where}: {key} must be a non-empty string")
    _check_choice(entry["severity"], SEVERITIES, f"{where}: severity")
    _check_choice(entry["source"], SOURCES, f"{where}: source")
    _check_choice(entry["action"], ACTIONS, f"{where}: action")
    for key in ("patterns", "examples"):
        value = entry[key]
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise CatalogError(f"{where}: {key} must be a non-empty list of strings")
    startup = entry.get("startup_evidence", False)
    before = entry.get("before_progress", False)
    for key, value in (("startup_evidence", startup), ("before_progress", before)):
        if not isinstance(value, bool):
            raise CatalogError(f"{where}: {key} must be true or false")
    patterns = []
    for i, text in enumerate(entry["patterns"], 1):
        try:
            patterns.append(re.compile(text))
        except re.error as e:
            raise CatalogError(f"{where}: pattern {i} {text!r} is not a valid regex: {e}") from e
    per_code = entry.get("per_code")
    if per_code is not None:
        if per_code not in codes:
            raise CatalogError(f"{where}: per_code {per_code!r} has no [codes.{per_code}] tables; "
                               f"defined: {', '.join(codes) or 'none'}")
        for i, p in enumerate(patterns, 1):
            if per_code not in p.groupindex:
                raise CatalogError(f"{where}: pattern {i} needs a named group (?P<{per_code}>...)")
    return Signature(id=sid, title=entry["title"], severity=entry["severity"],
                     source=entry["source"], action=entry["action"], patterns=tuple(patterns),
                     advice=entry["advice"].strip(), examples=tuple(entry["examples"]),
                     startup_evidence=startup, per_code=per_code, before_progress=before)


# ---------------------------------------------------------------------- prefilter
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
    "runtimeerror processgroupnccl".split())   # the last two: every traceback / every c10d log line

# Words in almost every line of a training log: a literal inside one is a poor needle.
_TRAINING_WORDS = ("loss", "epoch", "train", "batch", "step", "images", "instances", "size")


class _Prefilter:
    """Which patterns could match a line, from its tokens: a cheap superset test.

    Indices are positions in the catalog's flat (signature index, pattern) list.  ``words``
    maps a trigger word to the patterns that require it, ``substrings`` lists (literal,
    patterns) for patterns without a provable word, each literal once, and ``always`` holds
    patterns that have neither (tried on every line).
    """

    def __init__(self, words: dict[str, frozenset[int]],
                 substrings: tuple[tuple[str, frozenset[int]], ...], always: frozenset[int]):
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


def _build_prefilter(patterns: Iterable[tuple[int, re.Pattern[str]]]) -> _Prefilter:
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
    return _Prefilter({w: frozenset(i) for w, i in words.items()},
                      tuple((text, frozenset(substrings[text]))
                            for text in sorted(substrings, key=lambda s: (-len(s), s))),
                      frozenset(always))


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
        from re import _parser
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
            inner_op is C.IN and _non_letter_set(inner_av, C))
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


# ---------------------------------------------------------------------- events
def _is_power_of_ten(n: int) -> bool:
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1


def _truncate(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def nan_warning(progress: Progress, now: float, catalog: Catalog | None = None) -> Warning | None:
    """A ``loss.nan`` Warning when any loss in ``progress`` is NaN or inf, else None.

    Stateless; :meth:`WarningMatcher.feed_progress` adds the once-per-episode logic.
    """
    bad = {k: v for k, v in progress.losses.items()
           if isinstance(v, (int, float)) and not math.isfinite(v)}
    if not bad:
        return None
    sig = (catalog or _default_catalog()).get(LOSS_NAN)
    where = []
    if progress.epoch is not None:
        where.append(f"epoch {progress.epoch}" + (f"/{progress.epochs}" if progress.epochs else ""))
    if progress.batch is not None:
        where.append(f"batch {progress.batch}" + (f"/{progress.batches}" if progress.batches else ""))
    if progress.rank is not None:
        where.append(f"rank {progress.rank}")
    losses = " ".join(f"{k}={v:.4g}" for k, v in progress.losses.items())
    text = f"non-finite loss ({', '.join(bad)})" + (f" at {', '.join(where)}" if where else "")
    return Warning(ts=now, id=LOSS_NAN, severity=sig.severity if sig else "error",
                   text=_truncate(f"{text}: {losses}"), advice=sig.advice if sig else "",
                   source="trainer")


_DEFAULT: Catalog | None = None


def _default_catalog() -> Catalog:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Catalog.load()
    return _DEFAULT


class WarningMatcher:
    """Lines (and progress) in, Warning events out: once per id, repeats counted.

    A Warning is returned for the first occurrence of an id and again when its count
    reaches 10, 100, 1000, ... (``count`` says how many so far).  After a NaN episode ends
    (a progress with finite losses) the next NaN is reported again.  ``last`` is the
    signature of the most recent line fed (None if it matched nothing), so a caller can
    react to ``last.startup_evidence`` even when no event was returned.  Not thread-safe:
    feed it from one thread.
    """

    def __init__(self, catalog: Catalog | None = None):
        self.catalog = catalog if catalog is not None else _default_catalog()
        self._counts: dict[str, int] = {}
        self._rearmed: set[str] = set()
        self._nan_active = False
        self.last: Signature | None = None

    def feed(self, line: str, now: float, source: str = "trainer") -> Warning | None:
        sig = self.catalog.match(line, source)
        self.last = sig
        if sig is None:
            return None
        origin = source if source != "any" else (sig.source if sig.source != "any" else "trainer")
        return self._count(sig.id, lambda n: Warning(
            ts=now, id=sig.id, severity=sig.severity, text=_truncate(sanitize(cut_line(line)).strip()),
            advice=sig.advice, source=origin, count=n))

    def feed_progress(self, progress: Progress, now: float) -> Warning | None:
        """Report NaN/inf losses in parsed progress under ``loss.nan`` (shares the count
        with console lines that match ``loss.nan``)."""
        warning = nan_warning(progress, now, self.catalog)
        if warning is None:
            if self._nan_active:
                self._nan_active = False
                self._rearmed.add(LOSS_NAN)
            return None
        self._nan_active = True
        return self._count(LOSS_NAN, lambda n: dataclasses.replace(warning, count=n))

    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    def reset(self) -> None:
        """Forget everything (e.g. for a new attempt, so its first warnings show again)."""
        self._counts.clear()
        self._rearmed.clear()
        self._nan_active = False
        self.last = None

    def _count(self, sig_id: str, make: Callable[[int], Warning]) -> Warning | None:
        n = self._counts.get(sig_id, 0) + 1
        self._counts[sig_id] = n
        if n == 1 or sig_id in self._rearmed or _is_power_of_ten(n):
            self._rearmed.discard(sig_id)
            return make(n)
        return None
