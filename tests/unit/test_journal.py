from trainctl.core import events as E
from trainctl.store.journal import Journal, ProgressThrottle, journal_lines, read_events, wire_lines_from


def prog(ts, epoch, batch, batches=100):
    return E.Progress(ts, epoch, 3, batch, batches, {"loss": 1.0 / batch}, 10.0)


def test_journal_numbers_events_and_survives_reopen_and_a_torn_line(tmp_path):
    path = tmp_path / "events.jsonl"
    j = Journal(path)
    a = j.append(E.Phase(1.0, "train"))
    b = j.append(prog(2.0, 1, 1))
    j.close()
    assert (a.seq, b.seq) == (0, 1)
    j = Journal(path)
    c = j.append(E.Exit(3.0, 0))
    j.close()
    assert c.seq == 2
    with open(path, "a") as f:
        f.write('{"ts": 4.0, "type": "pha')  # agent killed mid-write
    evs = list(read_events(path))
    assert [e.seq for e in evs] == [0, 1, 2]
    assert evs[1] == b and evs[1].losses == {"loss": 1.0}
    assert [e.seq for e in read_events(path, since=2)] == [2]


def test_nan_loss_survives_the_codec():
    ev = E.decode(E.encode(E.Progress(1.0, 1, 1, 1, 1, {"box": float("nan")}, None)))
    assert ev.losses["box"] != ev.losses["box"]


def test_throttle_keeps_at_most_one_per_second_plus_epoch_ends():
    t = ProgressThrottle(1.0)
    kept = []
    ts = 0.0
    for epoch in (1, 2):
        for batch in range(1, 101):
            ts += 0.05
            ev = t.offer(prog(ts, epoch, batch))
            if ev:
                kept.append(ev)
            flushed = t.flush(ts)
            if flushed:
                kept.append(flushed)
    # 10 s of batches at 20/s: about one a second, plus each epoch's first and last batch
    assert 10 <= len(kept) <= 16
    assert any(e.epoch == 1 and e.batch == 100 for e in kept)
    assert any(e.epoch == 2 and e.batch == 100 for e in kept)
    assert kept[0].batch == 1


def test_throttle_flushes_a_held_back_event_once_it_is_old():
    t = ProgressThrottle(1.0)
    assert t.offer(prog(0.0, 1, 1)) is not None
    assert t.offer(prog(0.2, 1, 2)) is None
    assert t.flush(0.5) is None
    assert t.flush(1.1).batch == 2
    assert t.flush(5.0) is None


# ---------------------------------------------------------------------- compact progress (issue 20)
def yolo(ts, epoch, batch, **kw):
    losses = kw.pop("losses", {"box_loss": 1.2345, "cls_loss": 2.3456, "dfl_loss": 1.1234})
    return E.Progress(ts, epoch, 50, batch, 41163, losses, kw.pop("rate", 2.41), **kw)


def test_compact_progress_lines_read_back_and_are_small(tmp_path):
    path = tmp_path / "events.jsonl"
    j = Journal(path)
    written = [j.append(E.Start(1.0, 1, 7, "A"))]
    for i in range(1, 2501):
        written.append(j.append(yolo(1.0 + i + 1e-7, 24 + i // 1200, 12000 + i, rank=None)))
    written.append(j.append(yolo(3000.0, 26, 1, losses={"loss": float("inf")}, rank=1)))
    written.append(j.append(yolo(3001.0, 26, 2, losses={}, rate=None)))
    j.append(yolo(3002.0, 26, 3, losses={"loss": float("nan")}))
    j.close()
    got = list(read_events(path))
    assert got[:-1] == written and got[-1].losses["loss"] != got[-1].losses["loss"]  # NaN
    assert written[1].ts == 2.0  # to the millisecond, live and journaled alike
    lines = path.read_bytes().splitlines(True)
    compact = [line for line in lines[2:1000] if b'"k"' not in line]
    assert compact and max(len(line) for line in compact) <= 100, compact[0]
    assert sum(b'"k"' in line for line in lines) <= 2 + 2500 // 1000 + 2 + 2  # restated rarely


def test_an_old_journal_goes_on_compact_and_reads_as_one(tmp_path):
    from pathlib import Path

    old = Path(__file__).resolve().parents[1] / "data" / "journals" / "handmade_run.jsonl"
    path = tmp_path / "events.jsonl"
    path.write_bytes(old.read_bytes())
    before = list(read_events(path))
    j = Journal(path)  # an agent of this version goes on with it
    more = [j.append(yolo(2e9 + i, 3, 100 + i)) for i in range(5)]
    j.close()
    assert list(read_events(path)) == before + more
    assert all(b'"l":' in line for line in path.read_bytes().splitlines()[-5:])


def test_clients_get_the_full_form_from_any_seq(tmp_path):
    path = tmp_path / "events.jsonl"
    j = Journal(path)
    events = [j.append(yolo(float(i), 1, i)) for i in range(1, 50)]
    j.close()
    lines = journal_lines(path, 30)
    assert [E.decode(line) for line in lines] == events[30:]
    assert all('"losses":{"box_loss"' in line and '"seq":' in line for line in lines)
    assert wire_lines_from(path, 0, 0, None) == journal_lines(path, 0)


def test_a_lost_restating_line_loses_the_names_not_the_values_wrongly(tmp_path):
    path = tmp_path / "events.jsonl"
    j = Journal(path)
    j.append(yolo(1.0, 1, 1))
    j.append(yolo(2.0, 1, 2))
    j.append(yolo(3.0, 1, 3, losses={"a": 1.0, "b": 2.0}))  # the names change: restated here
    j.append(yolo(4.0, 1, 4, losses={"a": 1.5, "b": 2.5}))
    j.close()
    lines = path.read_bytes().splitlines(True)
    lines[2] = b"\x00" * (len(lines[2]) - 1) + b"\n"  # that line lost (a bad sector)
    path.write_bytes(b"".join(lines))
    got = list(read_events(path))
    assert [e.seq for e in got] == [0, 1, 3]
    assert got[2].losses == {} and got[2].batch == 4  # not box/cls/dfl names on a, b
