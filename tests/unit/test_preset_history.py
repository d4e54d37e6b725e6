"""The preset history: what a run's events say each preset did (hours, batches, incidents
and their measured cost), and the store that keeps it across runs (atomic per-run files,
a corrupt file set aside, two writers of the same job)."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from trainctl.core import events as E
from trainctl.core.preset_usage import PresetUsage
from trainctl.core.recovery import USER_RESTART_REASON
from trainctl.store.preset_history import PresetHistory, Record, RecordKey, content_hash


def _progress(ts: float, epoch: int, batch: int, batches: int = 100) -> E.Progress:
    return E.Progress(ts, epoch, 3, batch, batches)


def _hang_then_resume() -> list[E.Event]:
    """Preset A runs 100 s (batches 1..50), hangs (last batch at 100, stall at 160), is
    restarted at 170 on B, starts up in 20 s, resumes at batch 41 and passes 50 at 200."""
    evs: list[E.Event] = [E.Start(0.0, 1, 10, "A")]
    evs += [_progress(2.0 * b, 1, b) for b in range(1, 51)]
    evs += [
        E.Stall(160.0, "train", 60.0, "deadlock"),
        E.Exit(165.0, None, "SIGKILL"),
        E.Restart(166.0, 2, "the trainer hung (deadlock); falling back from A to B", "B", "ckpt.pt"),
        E.Start(170.0, 2, 11, "B"),
    ]
    evs += [_progress(190.0 + (b - 41), 1, b) for b in range(41, 61)]
    return evs


def _usage(events: list[E.Event]) -> PresetUsage:
    u = PresetUsage(lambda p: f"h-{p}")
    for ev in events:
        u.on_event(ev)
    return u


def test_a_hang_is_counted_with_its_measured_cost() -> None:
    t = _usage(_hang_then_resume()).tallies(now=209.0)
    a, b = t[("A", "h-A")], t[("B", "h-B")]
    assert a.incidents == {"deadlock": 1}
    assert a.seconds == pytest.approx(100.0)  # start to its last batch; the rest is the incident's cost
    assert a.batches == 50
    assert a.costed == 1
    assert a.cost_s == pytest.approx({"detection": 60.0, "restart": 10.0, "startup": 20.0, "redone": 9.0})
    assert b.incidents == {} and b.seconds == pytest.approx(39.0) and b.batches == 20


def test_a_stall_that_ends_by_itself_is_none_and_repeated_stalls_are_one() -> None:
    evs: list[E.Event] = [E.Start(0.0, 1, 10, "A"), _progress(1.0, 1, 1), _progress(2.0, 1, 2)]
    evs += [E.Stall(9.0, "train", 7.0, "spin"), _progress(10.0, 1, 3)]  # a slow batch, no restart
    evs += [E.Stall(20.0, "train", 10.0, "unknown"), E.Stall(30.0, "train", 20.0, "deadlock")]
    evs += [E.Exit(31.0, -15, "SIGTERM"), E.Restart(32.0, 2, "the trainer stalled", "A", None)]
    a = _usage(evs).tallies(40.0)[("A", "h-A")]
    assert a.incidents == {"deadlock": 1}
    assert a.seconds == pytest.approx(10.0)  # to the last batch


def test_an_incident_not_paid_back_is_counted_but_not_costed() -> None:
    evs = _hang_then_resume()[:-15]  # B got back to batch 45 only
    a = _usage(evs).tallies(now=300.0)[("A", "h-A")]
    assert a.incidents == {"deadlock": 1} and a.costed == 0 and a.cost_s == {}


@pytest.mark.parametrize(
    ("exit_", "warning", "kind"),
    [
        (E.Exit(50.0, 1, exception="RuntimeError: boom"), None, "crash"),
        (E.Exit(50.0, 1, exception="torch.OutOfMemoryError: CUDA out of memory"), None, "oom"),
        (E.Exit(50.0, -9, "SIGKILL"), E.Warning(49.0, "kernel.oom_kill", "error", "killed"), "oom"),
        (E.Exit(50.0, 1), E.Warning(40.0, "loss.nan", "error", "nan loss"), "nan"),
    ],
)
def test_an_exit_with_an_error_then_a_restart_is_an_incident(exit_, warning, kind) -> None:
    evs: list[E.Event] = [E.Start(0.0, 1, 10, "A"), _progress(10.0, 1, 1)]
    evs += [warning] if warning else []
    evs += [exit_, E.Restart(51.0, 2, "the trainer crashed", "A", None)]
    assert _usage(evs).tallies(60.0)[("A", "h-A")].incidents == {kind: 1}


def test_a_user_restart_or_stop_is_no_incident() -> None:
    evs: list[E.Event] = [E.Start(0.0, 1, 10, "A"), _progress(10.0, 1, 1)]
    restarted = [*evs, E.Exit(50.0, -15, "SIGTERM"), E.Restart(51.0, 2, USER_RESTART_REASON, "A", None)]
    stopped = [*evs, E.Exit(50.0, -15, "SIGTERM"), E.State(51.0, "STOPPED", "user")]
    assert _usage(restarted).tallies(60.0)[("A", "h-A")].incidents == {}
    assert _usage(stopped).tallies(60.0)[("A", "h-A")].incidents == {}
    failed = [*evs, E.Exit(50.0, 1), E.State(51.0, "FAILED", "restart budget spent")]
    assert _usage(failed).tallies(60.0)[("A", "h-A")].incidents == {"crash": 1}


def test_the_running_attempt_counts_up_to_now() -> None:
    u = _usage([E.Start(100.0, 1, 10, "A")])
    assert u.tallies(now=460.0)[("A", "h-A")].seconds == pytest.approx(360.0)
    assert u.tallies(now=460.0) is not u.tallies(now=460.0)


def _record(job: str = "yolo", hours: float = 1.0, incidents: dict[str, int] | None = None, **kw) -> Record:
    key = RecordKey(job, "box (H100)", kw.pop("preset", "A"), kw.pop("content", "abc"))
    return Record(key, hours, 100, incidents or {}, kw.pop("cost_s", {}), kw.pop("costed", 0))


def test_runs_merge_on_read(tmp_path: Path) -> None:
    h = PresetHistory(tmp_path / "hist")
    h.write_run(
        "run-1", [_record(hours=2.0, incidents={"deadlock": 1}, cost_s={"detection": 40.0}, costed=1)], 1.0
    )
    h.write_run(
        "run-2", [_record(hours=7.0, incidents={"deadlock": 2}, cost_s={"detection": 80.0}, costed=2)], 2.0
    )
    h.write_run("run-3", [_record(job="other", hours=5.0)], 3.0)
    records, problems = h.read("yolo")
    assert problems == []
    [r] = records
    assert (r.hours, r.incident_count, r.runs) == (9.0, 3, 2)
    risk = r.risk()
    assert risk.incidents == 3 and risk.mean_cost_s == pytest.approx(40.0) and risk.cost_measured
    assert len(h.read()[0]) == 2
    assert h.read("yolo", exclude_run="run-2")[0][0].hours == 2.0


def test_a_write_replaces_the_run_file_whole(tmp_path: Path) -> None:
    h = PresetHistory(tmp_path / "hist")
    h.write_run("run-1", [_record(hours=1.0)], 1.0)
    h.write_run("run-1", [_record(hours=1.5)], 2.0)
    assert [p.name for p in (tmp_path / "hist").iterdir()] == ["run-1.json"]  # no temp file left
    assert h.read()[0][0].hours == 1.5
    assert ((tmp_path / "hist" / "run-1.json").stat().st_mode & 0o777) == 0o600


@pytest.mark.parametrize(
    "text",
    ['{"version": 1, "records": [{"job": ', "not json", "[]", '{"version": 1, "records": [{"job": 1}]}'],
)
def test_a_corrupt_file_is_set_aside_with_a_message_and_nothing_else_is_lost(
    tmp_path: Path, text: str
) -> None:
    h = PresetHistory(tmp_path / "hist")
    h.write_run("good", [_record(hours=3.0)], 1.0)
    (tmp_path / "hist" / "torn.json").write_text(text)
    records, problems = h.read()
    assert [r.hours for r in records] == [3.0]
    assert len(problems) == 1 and "torn.json" in problems[0] and "unreadable" in problems[0]
    assert (tmp_path / "hist" / "torn.json.corrupt").exists()
    assert h.read() == (records, [])  # said once
    h.write_run("torn", [_record(hours=0.5)], 2.0)  # that run's next write: a fresh record
    assert sum(r.hours for r in h.read()[0]) == 3.5


def _writer(path: str, run: str, n: int) -> None:
    h = PresetHistory(Path(path))
    for i in range(1, n + 1):
        h.write_run(run, [_record(hours=i / 10)], float(i))


def test_two_concurrent_runs_of_one_job_keep_each_others_hours(tmp_path: Path) -> None:
    """Two processes rewrite their own files as fast as they can while this one reads:
    no read sees a torn file, and the end holds both runs' hours."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), f"run-{k}", 200)) for k in (1, 2)]
    for p in procs:
        p.start()
    while any(p.is_alive() for p in procs):
        _records, problems = PresetHistory(tmp_path).read()
        assert problems == []
    for p in procs:
        p.join()
        assert p.exitcode == 0
    [r] = PresetHistory(tmp_path).read()[0]
    assert r.hours == pytest.approx(40.0) and r.runs == 2


def test_content_hash_changes_with_a_setting_only() -> None:
    a = content_hash({"dataloader": {"workers": 8}, "train": {"batch": 16}})
    assert a == content_hash({"train": {"batch": 16}, "dataloader": {"workers": 8}})
    assert a != content_hash({"dataloader": {"workers": 4}, "train": {"batch": 16}})


def test_the_file_is_plain_json(tmp_path: Path) -> None:
    h = PresetHistory(tmp_path)
    h.write_run("r", [_record(incidents={"spin": 1})], 5.0)
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["records"][0]["incidents"] == {"spin": 1} and data["version"] == 1


def test_presets_stats_shows_words_and_the_estimate(capsys) -> None:
    from trainctl.cli.main import main
    from trainctl.config import list_presets, load_preset
    from trainctl.store.preset_history import preset_content

    current = {p.stem: preset_content(load_preset(p)) for p in list_presets()}
    PresetHistory().write_run(
        "r1",
        [
            _record(
                hours=9.0,
                incidents={"deadlock": 2, "spin": 1},
                cost_s={"detection": 120.0},
                costed=3,
                content=current["A"],
            ),
            _record(hours=30.0, preset="B", content=current["B"]),
            _record(hours=2.0, incidents={"crash": 1}, content="an-old-one"),
        ],
        1.0,
    )
    assert main(["presets", "stats", "yolo"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "job yolo on box (H100)"
    a = next(line for line in lines if line.startswith("A "))
    assert "9 h" in a and "3 (2 deadlock, 1 spin)" in a and "≈ 40 s" in a and "0.35 (0.11–0.7)" in a
    assert any(line.startswith("A (an earlier version)") and "(default)" in line for line in lines)
    assert any(line.startswith("B ") and "62 h" in line for line in lines)
    assert main(["presets", "stats", "other"]) == 0
    assert "no preset history for job 'other' yet" in capsys.readouterr().out


def test_a_stall_said_at_detection_takes_its_kind_from_the_later_verdict() -> None:
    evs = _hang_then_resume()
    i = next(n for n, e in enumerate(evs) if isinstance(e, E.Stall))
    evs[i : i + 1] = [
        E.Stall(160.0, "train", 60.0, E.DIAGNOSING),
        E.StallDiagnosis(162.0, "train", "deadlock", elapsed_s=2.0),
    ]
    a = _usage(evs).tallies(now=209.0)[("A", "h-A")]
    assert a.incidents == {"deadlock": 1}
