from trainctl.engine import events as E
from trainctl.engine.journal import Journal, ProgressThrottle, read_events


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
        f.write('{"ts": 4.0, "type": "pha')   # agent killed mid-write
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
