"""Snapshots (issue 20): the run's view written down with the journal position it covers.
A snapshot and the journal after it give the same view as the whole journal folded; a torn,
corrupt, stale or hostile snapshot is ignored and rebuilt; an older journal is indexed once;
a client (the offline one here; the agent's in tests/e2e/test_snapshot_agent.py) gets the
snapshot and the events after it instead of a replay from the start."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainctl.agent.snapshots import SnapshotKeeper
from trainctl.client.connection import local_client
from trainctl.core import events as E
from trainctl.core.runview import RunView, ViewSnapshot
from trainctl.core.series import CHART_POINTS, WHOLE_KEEP, lttb
from trainctl.store.journal import Journal, read_events
from trainctl.store.snapshot import load_view, read_snapshot, save, snapshot_path
from trainctl.store.spec import RunSpec

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]
HANDMADE = ROOT / "tests" / "data" / "journals" / "handmade_run.jsonl"


def long_events(n: int, t0: float = 1.7e9) -> list[E.Event]:
    """``n`` progress events with a stall and a restart in the middle (compactions happen)."""
    out: list[E.Event] = [E.Start(t0, 1, 11, "A"), E.State(t0, "RUNNING", "")]
    for i in range(n):
        if i == n // 2:
            out += [
                E.Stall(t0 + i, "train", 90.0, "deadlock"),
                E.Restart(t0 + i, 2, "stall", "B"),
                E.Start(t0 + i, 2, 12, "B"),
                E.Warning(t0 + i, "nccl.timeout", "warning", "NCCL timeout"),
            ]
        epoch, batch = divmod(i, 1000)
        out.append(
            E.Progress(
                t0 + i + 1,
                epoch + 1,
                50,
                batch + 1,
                1000,
                {"box_loss": 2.0 / (1 + i / 100) + (i % 7) / 100, "cls_loss": 1.0 + (i % 13) / 50},
                rate=2.4,
            )
        )
    return out


def write_run(tmp_path: Path, events: list[E.Event]) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    RunSpec(
        job_name="week", kind="command", command=["python", "t.py"], preset="A", fallback="B", host="box"
    ).save(run_dir / "spec.json")
    j = Journal(run_dir / "events.jsonl")
    for e in events:
        j.append(E.from_dict({k: v for k, v in E.to_dict(e).items() if k != "seq"}))
    j.close()
    return run_dir


def replayed(run_dir: Path) -> RunView:
    view = RunView()
    view.apply_all(list(read_events(run_dir / "events.jsonl")))
    return view


def test_snapshot_and_tail_equal_the_whole_replay_at_every_cut(tmp_path):
    events = long_events(9000)
    run_dir = write_run(tmp_path, events)
    whole = replayed(run_dir)
    assert len(whole.losses["box_loss"].xs) < 2 * WHOLE_KEEP  # it was downsampled
    assert whole.restarts and whole.incidents
    for cut in (1, 4500, 4503, 7000, len(events) - 1):
        # a snapshot of the first `cut` lines, as the agent writes it
        view = RunView()
        view.apply_all(list(read_events(run_dir / "events.jsonl"))[:cut])
        from trainctl.store.snapshot import Covered

        offset = sum(len(line) for line in (run_dir / "events.jsonl").read_bytes().splitlines(True)[:cut])
        assert save(run_dir, Covered(view, cut, offset))
        got = load_view(run_dir, write=False)
        assert got.from_snapshot and got.next_seq == len(events)
        assert got.view.state_key() == whole.state_key(), cut


def test_the_whole_run_keeps_restart_and_incident_points(tmp_path):
    view = RunView()
    view.apply_all(long_events(9000))
    mark = view.restarts[0][0]
    xs = view.losses["box_loss"].xs
    assert mark in xs and xs[0] == 1.0 and xs[-1] == view.x
    series, restarts = view.chart("run")
    assert all(len(xs) <= CHART_POINTS + 3 for _, xs, _ in series)
    assert mark in series[0][1] and restarts == tuple(view.restarts)
    hour, _ = view.chart("hour")
    assert hour[0][1][0] >= view.x - 3600 - 1  # one progress a second: the last 3600 batches
    epoch, _ = view.chart("epoch")
    assert epoch[0][1][0] >= (view.progress.epoch - 1) * 1000


@pytest.mark.parametrize("n", [0, 1, 2, 3, 10, 5000])
def test_lttb_keeps_first_last_and_marks(n):
    xs = [float(i) for i in range(n)]
    ys = [((i * 7919) % 101) / 10 for i in range(n)]
    keep = lttb(xs, ys, 100, keep=[37.0] if n > 37 else [])
    assert len(keep) <= max(n, 0) and len(keep) <= 101
    if n:
        assert keep[0] == 0 and keep[-1] == n - 1 and keep == sorted(set(keep))
    if n > 37:
        assert 37 in keep


@pytest.mark.parametrize("name", ["handmade_run.jsonl", "demo_run.jsonl"])
def test_an_old_format_journal_indexes_once_then_reads_the_tail(tmp_path, name):
    old = HANDMADE.with_name(name)
    run_dir = write_run(tmp_path, [])
    # the old-format file itself, lines with their seq and every field
    (run_dir / "events.jsonl").write_bytes(old.read_bytes())
    first = load_view(run_dir)
    assert not first.from_snapshot and snapshot_path(run_dir).exists()
    second = load_view(run_dir)
    assert second.from_snapshot and second.view.state_key() == first.view.state_key()
    assert second.view.state_key() == replayed(run_dir).state_key()
    assert second.view.progress is not None and second.view.losses["box_loss"].xs
    if name == "handmade_run.jsonl":
        assert second.view.preset == "B" and second.view.restarts


def hostile(run_dir: Path, how: str) -> None:
    path = snapshot_path(run_dir)
    doc = json.loads(path.read_text())
    if how == "torn":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif how == "not json":
        path.write_bytes(b"\x1b]0;pwned\x07" + os.urandom(64))
    elif how == "other format":
        doc["format"] = 99
        path.write_text(json.dumps(doc))
    elif how == "columns":
        name = next(iter(doc["view"]["losses"]))
        doc["view"]["losses"][name][0].append(1.0)
        path.write_text(json.dumps(doc))
    elif how == "types":
        doc["view"]["progress"] = {"type": "stall", "ts": 1}
        path.write_text(json.dumps(doc))
    elif how == "offset past the end":
        doc["offset"] += 10**9
        path.write_text(json.dumps(doc))
    elif how == "another journal":
        doc["tail"] = "0" * 64
        path.write_text(json.dumps(doc))
    elif how == "seq ahead":
        doc["view"]["last_seq"] = doc["next_seq"] + 5
        path.write_text(json.dumps(doc))
    elif how == "symlink":
        path.unlink()
        (run_dir / "elsewhere.json").write_text(json.dumps(doc))
        path.symlink_to(run_dir / "elsewhere.json")
    elif how == "huge":
        with open(path, "ab") as f:
            f.truncate(65 << 20)
    elif how == "nested":
        path.write_text("[" * 100000 + "]" * 100000)


HOW = [
    "torn",
    "not json",
    "other format",
    "columns",
    "types",
    "offset past the end",
    "another journal",
    "seq ahead",
    "symlink",
    "huge",
    "nested",
]


@pytest.mark.parametrize("how", HOW)
def test_a_hostile_snapshot_is_ignored_and_rebuilt(tmp_path, how):
    run_dir = write_run(tmp_path, long_events(300))
    load_view(run_dir)  # index: a good snapshot
    hostile(run_dir, how)
    assert read_snapshot(run_dir) is None
    got = load_view(run_dir)
    assert not got.from_snapshot and got.view.state_key() == replayed(run_dir).state_key()
    if how != "symlink":
        assert read_snapshot(run_dir) is not None  # rebuilt
    else:
        assert (run_dir / "elsewhere.json").exists()  # never written through the link


def test_a_journal_cut_shorter_or_replaced_makes_the_snapshot_stale(tmp_path):
    run_dir = write_run(tmp_path, long_events(300))
    load_view(run_dir)
    journal = run_dir / "events.jsonl"
    lines = journal.read_bytes().splitlines(True)
    journal.write_bytes(b"".join(lines[:100]))  # cut shorter (restored from a backup)
    assert read_snapshot(run_dir) is None
    assert load_view(run_dir).next_seq == 100
    other = write_run(tmp_path / "b", long_events(400, t0=1.6e9))  # another run's journal put in its place
    journal.write_bytes((other / "events.jsonl").read_bytes())
    got = load_view(run_dir)
    assert not got.from_snapshot and got.view.state_key() == replayed(run_dir).state_key()


def test_a_torn_last_line_is_left_for_later(tmp_path):
    run_dir = write_run(tmp_path, long_events(50))
    journal = run_dir / "events.jsonl"
    with open(journal, "ab") as f:
        f.write(b'{"ts":1,"type":"state","state":"FAI')  # the agent killed mid-write
    got = load_view(run_dir)
    assert got.offset == journal.stat().st_size - len(b'{"ts":1,"type":"state","state":"FAI')
    assert got.view.state == "RUNNING"


async def test_the_keeper_writes_and_primes_from_what_is_there(tmp_path):
    events = long_events(500)
    run_dir = write_run(tmp_path, events[:300])
    journal = Journal(run_dir / "events.jsonl")  # an adopting agent goes on with it
    keeper = SnapshotKeeper(run_dir, journal, lambda: 0.0, every_events=50)
    upto = keeper.prime_at()
    journaled = []
    for e in events[300:320]:  # journaled while the keeper primes: folded after
        journaled.append(journal.append(e))
        keeper(journaled[-1])
    keeper.primed(await asyncio.get_running_loop().run_in_executor(None, keeper.prime, upto))
    for e in events[320:]:
        keeper(journal.append(e))
    keeper.close()
    journal.close()
    assert keeper.written >= 2
    snap = read_snapshot(run_dir)
    assert snap is not None and snap.next_seq == len(events)
    assert snap.view.state_key() == replayed(run_dir).state_key()


async def test_offline_client_gets_the_snapshot_then_the_tail(tmp_path):
    events = long_events(3000)
    run_dir = write_run(tmp_path, events)
    load_view(run_dir)
    more = long_events(5, t0=2e9)[2:]
    with open(run_dir / "events.jsonl", "ab") as f:  # noqa: ASYNC230 - lines after the snapshot, written before the client starts
        for e in more:
            f.write((E.encode(e) + "\n").encode())
    total = len(events) + len(more)
    client = local_client(run_dir)
    try:
        hello = await client.connect(snapshot=True)
        got = [e async for e in client.events()]
    finally:
        await client.close()
    assert hello["live"] is False and hello["state"] == "RUNNING"
    # the snapshot's view, folded on with the lines after it: the whole journal
    assert isinstance(got[0], ViewSnapshot) and got[0].next_seq == total and len(got) == 1
    assert read_snapshot(run_dir).next_seq == len(events)  # the file: written once, not per client
    view = RunView()
    view.load_dict(got[0].view)
    view.apply_all(got[1:])
    assert view.state_key() == replayed(run_dir).state_key()


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainctl", *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_status_and_attach_json_without_an_agent(tmp_path):
    events = long_events(2500) + [E.State(1.8e9, "FINISHED", "done")]
    run_dir = write_run(tmp_path, events)
    r = cli("status", "--json", str(run_dir))
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    assert status["state"] == "FINISHED" and status["progress"]["batch"] == 500
    assert read_snapshot(run_dir) is not None  # indexed once, by the first status
    r = cli("attach", "--json", "--tail", "3", str(run_dir))
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert r.returncode == 0 and [d["seq"] for d in lines] == [
        len(events) - 3,
        len(events) - 2,
        len(events) - 1,
    ]
    r = cli("attach", "--json", "--from-snapshot", str(run_dir))
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert r.returncode == 0, r.stderr
    assert lines[0]["op"] == "snapshot" and lines[0]["next_seq"] == len(events)
    assert lines[0]["view"]["state"] == "FINISHED" and len(lines) == 1
    r = cli("attach", "--tail", "3", str(run_dir))
    assert r.returncode == 2 and "--json" in r.stderr


def test_status_merges_the_last_counter_with_a_loss_only_line(tmp_path):
    """Issue 26: HF Trainer's last line carries only a loss; status keeps the batch counter
    read before it: "epoch 1, batch 200/1000, loss 2.1"."""
    t0 = 1.7e9
    events = [
        E.Start(t0, 1, 11, "A"),
        E.State(t0, "RUNNING", ""),
        E.Progress(t0 + 1, None, None, 200, 1000, {}, rate=3.2),
        E.Progress(t0 + 2, 1, None, None, None, {"loss": 2.1}),
        E.State(t0 + 3, "STALLED", "no batch"),
    ]
    run_dir = write_run(tmp_path, events)
    r = cli("status", str(run_dir))
    assert r.returncode == 0, r.stderr
    assert "at      epoch 1, batch 200/1000, loss 2.1" in r.stdout, r.stdout
