"""Other versions' wordings of the catalog's signatures (tests/data/signature_variants.toml):
older and newer kernel, ROCm, PyTorch, NCCL and CPython lines, each rendered from its
source's format string or quoted from the public thread the file names.  Each must be
claimed FIRST by its own signature, from its own source (trainer or kernel), with the
prefilter giving the same answer as trying every signature."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from trainctl.core.signature_prefilter import required_literals, required_words
from trainctl.core.signatures import Catalog, normalise

pytestmark = pytest.mark.timeout(60)

DATA = Path(__file__).resolve().parents[1] / "data" / "signature_variants.toml"
CATALOG = Catalog.load()
VARIANTS = tomllib.loads(DATA.read_text(encoding="utf-8"))["variant"]


def own_id(sig_id: str, matched) -> bool:
    return matched is not None and (matched.id == sig_id or matched.id.startswith(sig_id + "."))


def test_the_variants_file_is_well_formed():
    assert len(VARIANTS) >= 60
    for v in VARIANTS:
        assert set(v) == {"id", "source", "line"}, v
        assert CATALOG.get(v["id"]) is not None, v["id"]
        assert v["source"].startswith(("render: ", "quote: https://")), v["source"]
    lines = [v["line"] for v in VARIANTS]
    assert len(lines) == len(set(lines)), "a variant listed twice"
    examples = {ex for sig in CATALOG for ex in sig.examples}
    assert not examples & set(lines), "a variant that is already a catalog example"


@pytest.mark.parametrize("variant", VARIANTS, ids=[f"{v['id']}-{n}" for n, v in enumerate(VARIANTS)])
def test_each_variant_is_claimed_by_its_own_signature_first(variant):
    sig_id, line = variant["id"], variant["line"]
    sig = CATALOG.get(sig_id)
    assert own_id(sig_id, CATALOG.match(line, "any")), (CATALOG.match(line, "any"), variant["source"])
    own_source = sig.source if sig.source != "any" else "trainer"
    assert own_id(sig_id, CATALOG.match(line, own_source))
    assert CATALOG.matches(line, "any")[0].id == CATALOG.match(line, "any").id  # prefilter is exact


def test_prefilter_needles_are_in_every_variant_their_pattern_matches():
    for v in VARIANTS:
        for p in CATALOG.get(v["id"]).patterns:
            if not p.search(normalise(v["line"])):
                continue
            words, literals = required_words(p), required_literals(p)
            if words:
                assert words & set(re.findall(r"[A-Za-z]+", v["line"])), (v["id"], p.pattern)
            if literals:
                assert any(s in v["line"] for s in literals), (v["id"], p.pattern)
