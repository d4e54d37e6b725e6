"""Every table between bench markers in docs/benchmarks.md parses as its script writes it
(bench/doc_tables.py): the provenance line, the script's own header, as many cells a row as
columns.  A table edited by hand into another shape fails here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import doc_tables  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"


def test_every_marked_table_is_its_scripts():
    blocks = doc_tables.parse_blocks(DOC.read_text())
    assert blocks, "no bench table between markers"
    names = [b.name for b in blocks]
    assert len(names) == len(set(names)), "a block written twice"
    for b in blocks:
        script = ROOT / b.provenance["command"].split()[0]
        declared = doc_tables.declared_tables(script)
        assert b.name in declared, f"bench:{b.name}: {script.name} declares no such table"
        assert b.header == declared[b.name], f"bench:{b.name}: not {script.name}'s header"
        assert b.rows, f"bench:{b.name}: no rows"


def test_render_then_parse_round_trip():
    header = ("case", "seconds", "why")
    rows = [["a | b", 1.5, "x\ny"], ["c", "—", ""]]
    body = "Ran 2026-12-04 13:00 → 2026-12-04 13:05 UTC, commit abc1234, 2 cores (AMD EPYC), "
    body += "load average 0.10 0.20 0.30 at the start, 1.00 0.50 0.40 at the end: `bench/bench_x.py --a 1`."
    body += "\n\n" + doc_tables.render(header, rows)
    parsed = doc_tables.parse_block("x", body)
    assert parsed.header == header
    assert parsed.rows == [["a \\| b", "1.5", "x y"], ["c", "—", ""]]
    assert parsed.provenance["load0"] == "0.10 0.20 0.30"
    assert parsed.provenance["command"] == "bench/bench_x.py --a 1"


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: t.replace("| 1.5 |", "| 1.5 | extra |"),  # a cell added to a row
        lambda t: t.replace("| case | seconds | why |", "| case | seconds |"),  # a column dropped
        lambda t: t.replace("Ran 2026", "Measured 2026"),  # the provenance line rewritten
        lambda t: t.replace("|---|---|---|", "|---|---|"),
    ],
)
def test_a_hand_edit_into_another_shape_fails(edit):
    body = "Ran 2026-12-04 13:00 → 2026-12-04 13:05 UTC, commit abc1234, 2 cores (AMD EPYC), "
    body += "load average 0.10 0.20 0.30 at the start, 1.00 0.50 0.40 at the end: `bench/bench_x.py`."
    body += "\n\n" + doc_tables.render(("case", "seconds", "why"), [["a", 1.5, "b"]])
    doc_tables.parse_block("x", body)
    with pytest.raises(ValueError):
        doc_tables.parse_block("x", edit(body))


def test_write_block_replaces_only_its_block(tmp_path):
    doc = tmp_path / "b.md"
    doc.write_text("intro\n<!-- bench:a begin -->\nold\n<!-- bench:a end -->\nprose\n")
    doc_tables.write_block(doc, "a", "new")
    assert doc.read_text() == "intro\n<!-- bench:a begin -->\nnew\n<!-- bench:a end -->\nprose\n"
    with pytest.raises(SystemExit):
        doc_tables.write_block(doc, "b", "x")
