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
in the line): :mod:`trainctl.core.signature_prefilter`.

Pure: no clock, no I/O except reading the catalog file.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainctl.core.events import SEVERITIES, Progress, Warning
from trainctl.core.sanitize import MAX_LINE, cut_line, sanitize, strip_ansi
from trainctl.core.signature_prefilter import build_prefilter

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
    before_progress: bool = False  # its action holds only before the attempt's first batch

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
        line = line[m.end() :]
    return line


class Catalog:
    """An ordered, validated set of signatures with a fast line matcher."""

    def __init__(
        self,
        signatures: Iterable[Signature],
        codes: dict[str, dict[str, CodeRule]] | None = None,
        path: str = "<catalog>",
    ):
        self.signatures: tuple[Signature, ...] = tuple(signatures)
        self.codes = codes or {}
        self.path = path
        self._by_id = {s.id: s for s in self.signatures}
        self._derived: dict[tuple[str, str], Signature] = {}
        self._for_source = {  # indices of the signatures that apply to each source
            src: frozenset(i for i, s in enumerate(self.signatures) if s.applies_to(src)) for src in SOURCES
        }
        # every (signature index, pattern) in catalog order: the prefilter names the patterns
        # a line could match, so a signature with many wordings costs only the ones it could
        self._patterns = tuple((i, p) for i, s in enumerate(self.signatures) for p in s.patterns)
        self._prefilter = build_prefilter(self._patterns)

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
            raise CatalogError(
                f"{path}: unknown top-level key(s) {sorted(unknown)}; "
                "allowed: [[signature]] entries and [codes.<name>.<code>] tables"
            )
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
        if len(line) > MAX_LINE:  # before any pattern sees it
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
            for i, pattern in candidates:  # catalog order, then pattern order: first match wins
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
                sig,
                id=f"{sig.id}.{code}",
                title=f"{sig.title} {code}: {rule.title}",
                severity=rule.severity,
                action=rule.action,
                advice=rule.advice,
                per_code=None,
            )
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
            raise CatalogError(
                f"{where}: per_code {per_code!r} has no [codes.{per_code}] tables; "
                f"defined: {', '.join(codes) or 'none'}"
            )
        for i, p in enumerate(patterns, 1):
            if per_code not in p.groupindex:
                raise CatalogError(f"{where}: pattern {i} needs a named group (?P<{per_code}>...)")
    return Signature(
        id=sid,
        title=entry["title"],
        severity=entry["severity"],
        source=entry["source"],
        action=entry["action"],
        patterns=tuple(patterns),
        advice=entry["advice"].strip(),
        examples=tuple(entry["examples"]),
        startup_evidence=startup,
        per_code=per_code,
        before_progress=before,
    )


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
    bad = {k: v for k, v in progress.losses.items() if isinstance(v, (int, float)) and not math.isfinite(v)}
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
    return Warning(
        ts=now,
        id=LOSS_NAN,
        severity=sig.severity if sig else "error",
        text=_truncate(f"{text}: {losses}"),
        advice=sig.advice if sig else "",
        source="trainer",
    )


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
        """``catalog`` None: the packaged one, loaded at the first use (an agent's start
        does not wait for it: its trainer starts first)."""
        self._catalog = catalog
        self._counts: dict[str, int] = {}
        self._rearmed: set[str] = set()
        self._nan_active = False
        self.last: Signature | None = None

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = _default_catalog()
        return self._catalog

    def feed(self, line: str, now: float, source: str = "trainer") -> Warning | None:
        sig = self.catalog.match(line, source)
        self.last = sig
        if sig is None:
            return None
        origin = source if source != "any" else (sig.source if sig.source != "any" else "trainer")
        return self._count(
            sig.id,
            lambda n: Warning(
                ts=now,
                id=sig.id,
                severity=sig.severity,
                text=_truncate(sanitize(cut_line(line)).strip()),
                advice=sig.advice,
                source=origin,
                count=n,
            ),
        )

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
