"""The warning catalog and matcher, tested against the real log lines it was written from.

Matching is FIRST-MATCH: a line gets the first signature in catalog order that matches it
(the order encodes precedence, e.g. dl.shm_bus_error before dl.worker_killed_signal). So
every example of a signature must come out as exactly that signature.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from trainctl.core.events import SEVERITIES, Progress
from trainctl.core.signature_prefilter import required_literals, required_words
from trainctl.core.signatures import (
    ACTIONS,
    LOSS_NAN,
    MAX_TEXT,
    SOURCES,
    Catalog,
    CatalogError,
    WarningMatcher,
    nan_warning,
    normalise,
)

pytestmark = pytest.mark.timeout(60)

DATA = Path(__file__).resolve().parents[1] / "data"
CATALOG = Catalog.load()
EXAMPLES = [(sig.id, ex) for sig in CATALOG for ex in sig.examples]
HEALTHY = [
    line
    for line in (DATA / "healthy_lines.txt").read_text(encoding="utf-8").splitlines()
    if line and not line.startswith("#")
]


def own_id(sig_id: str, matched) -> bool:
    """A per-code signature (Xid) comes back as <id>.<code>."""
    return matched is not None and (matched.id == sig_id or matched.id.startswith(sig_id + "."))


# ---------------------------------------------------------------------- the catalog itself
def test_catalog_is_big_and_well_formed():
    assert len(CATALOG) >= 40
    ids = [s.id for s in CATALOG]
    assert len(ids) == len(set(ids))
    for s in CATALOG:
        assert s.severity in SEVERITIES and s.action in ACTIONS and s.source in SOURCES, s.id
        assert s.examples and s.patterns and s.advice and s.title, s.id
    assert CATALOG.get(LOSS_NAN) is not None
    assert {"rocm.miopen.sysdb_missing", "compile.started"} <= {s.id for s in CATALOG if s.startup_evidence}
    assert len(EXAMPLES) >= 150


def test_default_catalog_is_the_packaged_file():
    assert Path(CATALOG.path).name == "signatures.toml"
    assert Path(CATALOG.path).parent.name == "core"


@pytest.mark.parametrize("sig_id,line", EXAMPLES, ids=[f"{i}-{n}" for n, (i, _) in enumerate(EXAMPLES)])
def test_every_example_matches_its_own_signature_first(sig_id, line):
    sig = CATALOG.get(sig_id)
    assert own_id(sig_id, CATALOG.match(line, "any"))
    own_source = sig.source if sig.source != "any" else "trainer"
    assert own_id(sig_id, CATALOG.match(line, own_source))
    # the prefilter never changes the answer: compare with trying every signature
    assert CATALOG.matches(line, "any")[0].id == CATALOG.match(line, "any").id


def test_healthy_corpus_is_big_enough():
    assert len(HEALTHY) >= 60


@pytest.mark.parametrize("line", HEALTHY)
def test_healthy_lines_match_nothing(line):
    for source in SOURCES:
        assert CATALOG.match(line, source) is None, (source, CATALOG.match(line, source).id)
    assert CATALOG.matches(line, "any") == []


def test_every_pattern_has_a_prefilter_needle():
    """Keeps healthy lines fast: no pattern may force a full match on every line."""
    for sig in CATALOG:
        for p in sig.patterns:
            assert required_words(p) or required_literals(p), (sig.id, p.pattern)


def test_prefilter_needles_are_really_required():
    """Each derived word occurs as a whole token, and each literal as a substring, in
    every example its pattern matches."""
    for sig in CATALOG:
        for p in sig.patterns:
            words, literals = required_words(p), required_literals(p)
            for ex in sig.examples:
                text = normalise(ex)
                if not p.search(text):
                    continue
                if words:
                    assert words & set(re.findall(r"[A-Za-z]+", ex)), (sig.id, p.pattern, ex)
                if literals:
                    assert any(s in ex for s in literals), (sig.id, p.pattern, ex)


# ---------------------------------------------------------------------- matching details
def test_source_filter():
    oom_kill = "[  518.050606] Out of memory: Killed process 15784 (python3) total-vm:11964kB"
    assert CATALOG.match(oom_kill, "kernel").id == "kernel.oom_kill"
    assert CATALOG.match(oom_kill, "trainer") is None
    dl = "RuntimeError: DataLoader worker (pid(s) 15927) exited unexpectedly"
    assert CATALOG.match(dl, "kernel") is None
    assert CATALOG.match(dl, "trainer").id == "dl.worker_exited"
    with pytest.raises(ValueError, match="source"):
        CATALOG.match(dl, "stdout")


def test_ansi_glued_and_carriage_return_lines():
    line = "\x1b[31mRuntimeError: CUDA error: an illegal memory access was encountered\x1b[0m"
    assert CATALOG.match(line).id == "rt.illegal_memory_access"
    coloured = "\x1b[34m\x1b[1mAMP: \x1b[0mchecks failed ❌. Anomalies were detected with AMP"
    assert CATALOG.match(coloured).id == "num.amp_check_failed"
    frames = (
        "\r\x1b[K        1/2         0G     0.2232     0.4435     0.1438          4         64: "
        "50% ━━━━━━────── 1/2 6.6it/s 0.3s\rHW Exception by GPU node-1 (Agent handle: 0x5a) "
        "reason :GPU Hang"
    )
    assert CATALOG.match(frames).id == "rocm.hsa.gpu_hang"


def test_prefixes_are_stripped_for_anchored_patterns():
    assert normalise("[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] x") == "[Rank 0] x"
    assert normalise("Feb 25 19:15:17 minty kernel: amdgpu 0000:03:00.0: x") == "amdgpu 0000:03:00.0: x"
    assert normalise("[Tue Feb 10 19:34:57 2026] workqueue: x") == "workqueue: x"
    assert normalise("[  +0.000316] pcieport x") == "pcieport x"
    nan_frame = (
        "[rank0]:     91/300        17G        nan        nan        nan          2        640: 100%|█| 1/1"
    )
    assert CATALOG.match(nan_frame).id == LOSS_NAN
    assert CATALOG.match("[rank0]: AUTOTUNE mm(256x512, 512x1024)").id == "compile.autotune"


def test_precedence_most_specific_first():
    bus = (
        "RuntimeError: DataLoader worker (pid 3855) is killed by signal: Bus error. It is possible "
        "that dataloader's workers are out of shared memory."
    )
    ids = [s.id for s in CATALOG.matches(bus)]
    assert ids[0] == "dl.shm_bus_error" and "dl.worker_killed_signal" in ids
    assert CATALOG.match(bus).id == "dl.shm_bus_error"


def test_xid_severity_and_action_come_from_the_code_table():
    def xid(code: int):
        return CATALOG.match(
            f"[93297.027938] NVRM: Xid (PCI:0000:43:00): {code}, pid=1, name=python3, Ch 1", "kernel"
        )

    assert (xid(79).id, xid(79).severity, xid(79).action) == ("kernel.nvidia.xid.79", "fatal", "stop")
    assert (xid(45).severity, xid(45).action) == ("info", "ignore")
    assert (xid(13).severity, xid(13).action) == ("error", "restart")
    assert (xid(63).severity, xid(48).severity, xid(94).action) == ("warning", "fatal", "restart")
    other = xid(999)
    assert (other.id, other.severity, other.action) == ("kernel.nvidia.xid.999", "warning", "warn")
    assert CATALOG.get("kernel.nvidia.xid.119").severity == "fatal"
    assert CATALOG.get("no.such.id") is None
    # "caused by previous Xid 149": the code is the event's own (45), not the cause
    line = "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149"
    assert CATALOG.match(line, "kernel").id == "kernel.nvidia.xid.45"


def test_startup_evidence():
    assert CATALOG.startup_evidence(
        "MIOpen(HIP): Warning [SQLiteBase] Missing system database file: gfx1030_18.kdb Performance may degrade."
    )
    assert CATALOG.startup_evidence("compile: starting torch.compile with 'default' mode...")
    assert not CATALOG.startup_evidence("RuntimeError: miopenStatusUnknownError")
    assert not CATALOG.startup_evidence(HEALTHY[0])


# ---------------------------------------------------------------------- WarningMatcher
KDB = (
    "MIOpen(HIP): Warning [SQLiteBase] Missing system database file: gfx1030_40.kdb Performance may degrade."
)
OOM = "[Sun Mar 30 08:24:00 2025] Out of memory: Killed process 7899 (python) total-vm:26,184,840kB"


def test_first_occurrence_emits_then_repeats_are_counted():
    m = WarningMatcher(CATALOG)
    w = m.feed(KDB, 100.0)
    assert (w.id, w.severity, w.count, w.ts, w.source) == (
        "rocm.miopen.sysdb_missing",
        "info",
        1,
        100.0,
        "trainer",
    )
    assert w.text == KDB and "MIOPEN_FIND_MODE" in w.advice
    emitted = [m.feed(KDB, 100.0 + i) for i in range(2, 1001)]
    counts = [w.count for w in emitted if w is not None]
    assert counts == [10, 100, 1000]
    assert m.counts() == {"rocm.miopen.sysdb_missing": 1000}
    assert m.last is not None and m.last.startup_evidence


def test_ids_are_counted_independently_and_sources_kept():
    m = WarningMatcher(CATALOG)
    assert m.feed(KDB, 1.0) is not None
    k = m.feed(OOM, 2.0, source="kernel")
    assert (k.id, k.source, k.severity) == ("kernel.oom_kill", "kernel", "fatal")
    assert m.feed(OOM, 3.0, source="kernel") is None
    assert m.feed("        1/2         0G     0.2232     0.4435", 4.0) is None and m.last is None
    assert m.counts() == {"rocm.miopen.sysdb_missing": 1, "kernel.oom_kill": 2}
    m.reset()
    assert m.counts() == {} and m.feed(OOM, 5.0, source="kernel").count == 1


def test_long_lines_are_truncated():
    line = "RuntimeError: CUDA error: an illegal memory access was encountered " + "x" * 2000
    w = WarningMatcher(CATALOG).feed("\x1b[31m" + line, 0.0)
    assert len(w.text) == MAX_TEXT and w.text.startswith("RuntimeError") and w.text.endswith("…")


# ---------------------------------------------------------------------- NaN from progress
def progress(*losses: float, batch: int = 5) -> Progress:
    names = ("box_loss", "cls_loss", "dfl_loss")
    return Progress(ts=0.0, epoch=3, epochs=10, batch=batch, batches=100, losses=dict(zip(names, losses)))


def test_nan_warning_is_pure():
    assert nan_warning(progress(1.0, 0.5, 0.7), 1.0) is None
    w = nan_warning(progress(1.0, math.nan, 0.7), 7.0)
    assert (w.id, w.severity, w.ts) == (LOSS_NAN, "error", 7.0)
    assert "cls_loss" in w.text and "epoch 3/10" in w.text and "batch 5/100" in w.text
    assert "amp=False" in w.advice
    assert nan_warning(progress(math.inf, 0.5, 0.7), 7.0).id == LOSS_NAN
    assert nan_warning(Progress(ts=0, epoch=None, epochs=None, batch=None, batches=None), 0) is None


def test_nan_episodes_and_shared_count_with_console_lines():
    m = WarningMatcher(CATALOG)
    assert m.feed_progress(progress(1.0, 0.5, 0.7), 1.0) is None
    first = m.feed_progress(progress(math.nan, 0.5, 0.7), 2.0)
    assert first.id == LOSS_NAN and first.count == 1
    assert m.feed_progress(progress(math.nan, 0.5, 0.7, batch=6), 3.0) is None  # same episode
    # the console line of the same frame counts under the same id, not a second alert
    frame = "     91/300        17G        nan        nan        nan          2        640: 100%|██████████| 278/278"
    assert m.feed(frame, 3.5) is None
    assert m.feed_progress(progress(1.0, 0.5, 0.7, batch=7), 4.0) is None  # recovered
    again = m.feed_progress(progress(1.0, math.inf, 0.7, batch=8), 5.0)  # a new episode: shown
    assert again is not None and again.count == 4
    assert m.counts()[LOSS_NAN] == 4


# ---------------------------------------------------------------------- broken catalogs
GOOD = """
[[signature]]
id = "x.one"
title = "One"
severity = "error"
source = "trainer"
action = "warn"
patterns = ['''\\bboom\\b''']
advice = "Do something."
examples = ["it went boom"]
"""


def load(tmp_path: Path, text: str) -> Catalog:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    return Catalog.load(path)


def test_a_small_valid_catalog(tmp_path):
    cat = load(tmp_path, GOOD)
    assert [s.id for s in cat] == ["x.one"] and cat.match("it went boom").id == "x.one"


@pytest.mark.parametrize(
    "change,message",
    [
        (
            ("['''\\bboom\\b''']", "['''(unclosed''']"),
            r"signature 'x\.one' \(entry 1\): pattern 1 .* not a valid regex",
        ),
        (
            ('advice = "Do something."\n', ""),
            r"signature 'x\.one' \(entry 1\): missing key\(s\) \['advice'\]",
        ),
        (
            ('severity = "error"', 'severity = "bad"'),
            r"severity is 'bad'; allowed: info, warning, error, fatal",
        ),
        (('action = "warn"', 'action = "panic"'), r"action is 'panic'; allowed: ignore, warn"),
        (('source = "trainer"', 'source = "gpu"'), r"source is 'gpu'; allowed: trainer, kernel, any"),
        (('id = "x.one"', 'id = "One"'), r"id must be a dotted lower-case name"),
        (('examples = ["it went boom"]', "examples = []"), r"examples must be a non-empty list"),
        (('title = "One"', 'title = "One"\nseverty = "error"'), r"unknown key\(s\) \['severty'\]"),
        (('title = "One"', 'title = "One"\nper_code = "xid"'), r"per_code 'xid' has no \[codes\.xid\]"),
        (("[[signature]]", "[[signature]\n"), r"not valid TOML"),
    ],
)
def test_broken_catalog_gives_a_clear_error(tmp_path, change, message):
    old, new = change
    assert old in GOOD
    with pytest.raises(CatalogError, match=message) as err:
        load(tmp_path, GOOD.replace(old, new, 1))
    assert "bad.toml" in str(err.value)


def test_duplicate_ids_and_missing_file(tmp_path):
    with pytest.raises(CatalogError, match=r"signature 'x\.one' \(entry 2\): duplicate id"):
        load(tmp_path, GOOD + GOOD)
    with pytest.raises(CatalogError, match="nope.toml: cannot read"):
        Catalog.load(tmp_path / "nope.toml")


def test_per_code_needs_its_named_group(tmp_path):
    codes = '\n[codes.xid.default]\ntitle = "t"\nseverity = "warning"\naction = "warn"\nadvice = "a"\n'
    text = GOOD.replace('title = "One"', 'title = "One"\nper_code = "xid"') + codes
    with pytest.raises(CatalogError, match=r"pattern 1 needs a named group \(\?P<xid>"):
        load(tmp_path, text)
    ok = load(tmp_path, text.replace("\\bboom\\b", "\\bboom (?P<xid>\\d+)"))
    assert ok.match("it went boom 7").id == "x.one.7"
    with pytest.raises(CatalogError, match=r"\[codes\.xid\.7\]: unknown key\(s\) \['colour'\]"):
        load(
            tmp_path,
            text + '\n[codes.xid.7]\ntitle = "t"\nseverity = "fatal"\naction = "stop"\n'
            'advice = "a"\ncolour = "red"\n',
        )
