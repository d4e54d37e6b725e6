"""Issue 38, item 5: readers of the journal never crash.  A wrong-typed line (a string where
a number stands), a line that is no object, a torn line ended by a later write and a line too
long to hold are each skipped and counted by every reader (the replay, the view and its
snapshot, `ls`'s fold, the wire to clients, the report); a torn last line of any size ends
the read without being held."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainctl.core import events as E
from trainctl.report.collect import collect
from trainctl.report.render import html_report, markdown_report
from trainctl.store import journal as J
from trainctl.store.journal import Journal, JournalReader, iter_journal_lines, raw_lines, read_events
from trainctl.store.listing import JournalFold
from trainctl.store.snapshot import load_view

BAD_LINES = {
    "a state's ts a string": '{"ts":"yesterday","type":"state","state":"RUNNING","reason":""}',
    "a compact batch a string": '{"ts":3.5,"type":"progress","e":1,"b":"7","k":["loss"],"E":2,"B":10,"l":[0.5]}',
    "a compact loss a string": '{"ts":3.5,"type":"progress","e":1,"b":7,"l":["low"]}',
    "a full progress epoch a string": (
        '{"ts":3.5,"type":"progress","epoch":"1","epochs":2,"batch":7,"batches":10,"losses":{}}'
    ),
    "loss names not strings": '{"ts":3.5,"type":"progress","e":1,"b":7,"k":[1],"l":[0.5]}',
    "a list": "[1, 2]",
    "a number": "5",
    "a torn line ended later": '{"ts":3.5,"type":"inf',
    "a deep nest": "[" * 100_000 + "]" * 100_000,
}


def _journal(path: Path) -> list[E.Event]:
    j = Journal(path)
    evs = [
        j.append(E.Start(1.0, 1, 42, None, ("python", "t.py"))),
        j.append(E.Progress(2.0, 1, 2, 5, 10, {"loss": 1e308}, rate=1.0)),
    ]
    j.close()
    return evs


def _more(path: Path) -> list[E.Event]:
    j = Journal(path)
    evs = [
        j.append(E.Progress(4.0, 1, 2, 6, 10, {"loss": -1e308}, rate=1.0)),
        j.append(E.Exit(5.0, 0)),
        j.append(E.State(5.0, "FINISHED", "the trainer finished")),
    ]
    j.close()
    return evs


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
def test_a_bad_line_is_skipped_and_counted_by_every_reader(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "events.jsonl"
    before = _journal(path)
    with open(path, "a") as f:
        f.write(BAD_LINES[kind] + "\n")
    after = _more(path)
    assert [e.seq for e in after] == [3, 4, 5]  # the bad line keeps its seq: a line number

    assert list(read_events(path)) == before + after

    covered = load_view(tmp_path, write=True)
    assert covered.view.unreadable == 1 and covered.view.state == "FINISHED"
    again = load_view(tmp_path)  # from the snapshot just written: still said
    assert again.from_snapshot and again.view.unreadable == 1

    fold = JournalFold()
    assert fold.advance(path)["state"] == "FINISHED"
    assert fold.reader.unreadable == 1

    wire = list(iter_journal_lines(path, 0))
    assert len(wire) == 6
    decoded = []
    for line in wire:  # as a client takes them: the bad one fails the check, the rest pass
        try:
            decoded.append(E.check(E.from_dict(json.loads(line))).seq)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            decoded.append(None)
    assert decoded == [0, 1, None, 3, 4, 5]

    report = collect(tmp_path)
    assert report.state == "FINISHED"
    assert "<svg" in html_report(report) and markdown_report(report)  # ±1e308: off the chart, no overflow


def test_a_line_too_long_to_hold_is_skipped_and_the_next_one_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(J, "MAX_LINE", 1000)
    monkeypatch.setattr(J, "_SKIP_CHUNK", 64)
    path = tmp_path / "events.jsonl"
    before = _journal(path)
    with open(path, "a") as f:
        f.write('{"ts":3.0,"type":"info","text":"' + "x" * 10_000 + '"}\n')
    after = _more(path)
    assert list(read_events(path)) == before + after
    with open(path, "rb") as f:
        lines = list(raw_lines(f))
    assert [raw is None for raw, _ in lines] == [False, False, True, False, False, False]
    assert [end for _, end in lines][-1] == path.stat().st_size
    reader = JournalReader()
    assert [reader.event(raw, n) is None for n, (raw, _) in enumerate(lines)].count(True) == 1
    assert reader.unreadable == 1


@pytest.mark.parametrize("size", [10, 10_000])
def test_a_torn_last_line_of_any_size_ends_the_read_uncounted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    monkeypatch.setattr(J, "MAX_LINE", 1000)
    monkeypatch.setattr(J, "_SKIP_CHUNK", 64)
    path = tmp_path / "events.jsonl"
    before = _journal(path)
    good_end = path.stat().st_size
    with open(path, "a") as f:
        f.write('{"ts":3.0,"type":"info","text":"' + "x" * size)  # the agent killed mid-line
    assert list(read_events(path)) == before
    covered = load_view(tmp_path, write=False)
    assert covered.offset == good_end and covered.next_seq == 2 and covered.view.unreadable == 0
    assert len(list(iter_journal_lines(path, 0))) == 2


def test_a_journal_appended_after_a_torn_line_counts_it_once(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _journal(path)
    with open(path, "a") as f:
        f.write('{"ts": 3.0, "type": "pha')
    _more(path)  # the next agent ends the torn line: one unreadable line
    assert load_view(tmp_path, write=False).view.unreadable == 1
