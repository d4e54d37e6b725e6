"""Issue 38, items 3 and 4: the one atomic writer (a link planted at a temporary name guessed
in advance never redirects a write) and the one reader of state files (a FIFO, a device, a
huge file, overflowing or wrong-typed values, another user's directory: one line naming the
file, defaults, nothing hangs).  Real files, FIFOs and devices; a second local user where
the test runs as root (tests/helpers/other_user.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.helpers.other_user import other_uid
from trainctl.core import statefile
from trainctl.core.rates import RateHistory
from trainctl.core.statefile import UnsafePathError, read_regular, write_atomic
from trainctl.inside.checkpoint_every import read_every
from trainctl.store.ladder_memory import LadderMemory
from trainctl.store.preset_history import PresetHistory

pytestmark = pytest.mark.timeout(20)  # a reader that waits on a FIFO fails here, never hangs the suite


# --------------------------------------------------------------------------- the writer
def _write_report(path: Path) -> None:
    from trainctl.cli.report import _write

    _write(path, "<html>report</html>")


def _write_snapshot(path: Path) -> None:
    from trainctl.store.snapshot import write_snapshot

    write_snapshot(path.parent, {"format": 1})


def _write_private(path: Path) -> None:
    from trainctl.store.paths import write_private

    write_private(path, "{}")


def _write_alerts(path: Path) -> None:
    from trainctl.alerts.settings import write_private

    write_private(path, {"urls": []})


def _write_save_request(path: Path) -> None:
    from trainctl.inside.report import write_save_request

    write_save_request(path.parent, 1, "planned", 1.0)


def _write_rates(path: Path) -> None:
    assert RateHistory(path).record("job", "A", 2.0, 1.0)


def _write_ladder(path: Path) -> None:
    LadderMemory(path).remember("job", "box", ["A", "B"], "B", 1.0)


def _write_preset(path: Path) -> None:
    from trainctl.config.store import save_preset_text

    save_preset_text(path, "[dataloader]\nworkers = 2\n")


WRITERS = {  # the writer, and the name it writes in its folder
    "report --output": (_write_report, "r.html"),
    "snapshot": (_write_snapshot, "snapshot.json"),
    "write_private (spec, ladder, intake, agent.json...)": (_write_private, "spec.json"),
    "alerts.json": (_write_alerts, "alerts.json"),
    "save request": (_write_save_request, "save-request.json"),
    "rates.json": (_write_rates, "rates.json"),
    "ladder.json": (_write_ladder, "ladder.json"),
    "preset": (_write_preset, "A.toml"),
}


def _guessed_names(name: str) -> list[str]:
    """Every temporary name trainctl's writers used before issue 38 (pid-based, fixed)."""
    pid = os.getpid()
    return [
        f".{name}.{pid}.tmp",  # report, write_private, snapshot, listing, Lightning, save request
        f"{name}.tmp{pid}",  # alerts.json
        f".{name}.{pid}",  # the font
        f"{name}.ready.tmp",  # the spare's ready file
        f".{name}.tmp",
    ]


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_link_planted_at_a_guessed_temporary_name_never_redirects_a_write(
    tmp_path: Path, writer: str
) -> None:
    write, name = WRITERS[writer]
    folder = tmp_path / "folder"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    for guess in _guessed_names(name):
        (folder / guess).symlink_to(victim)
    write(folder / name)
    assert victim.read_text() == "precious"
    written = folder / name
    assert written.is_file() and not written.is_symlink() and written.stat().st_size > 0
    left = sorted(p.name for p in folder.iterdir() if p.name not in (name, *_guessed_names(name)))
    assert left == [], f"temporary files left behind: {left}"


def test_write_atomic_modes_and_a_failed_write_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    write_atomic(path, "old")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text() == "old"
    old_umask = os.umask(0o022)
    try:
        write_atomic(path, "shared", mode=None)  # what a new file gets: 0666 less the umask
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    with pytest.raises(TypeError):
        write_atomic(path, 42)  # type: ignore[arg-type]
    assert path.read_text() == "shared"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_the_latest_link_is_replaced_through_a_random_name(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    link = tmp_path / "latest"
    (tmp_path / f".latest.{os.getpid()}.tmp").symlink_to(victim)
    statefile.replace_with_symlink(link, tmp_path / "run-1")
    statefile.replace_with_symlink(link, tmp_path / "run-2")
    assert os.readlink(link) == str(tmp_path / "run-2")
    assert os.readlink(tmp_path / f".latest.{os.getpid()}.tmp") == str(victim)  # untouched


# --------------------------------------------------------------------------- the reader
def _fifo(path: Path) -> None:
    os.mkfifo(path, 0o600)


def _dev_zero_link(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _device(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root (the CI and the dev machines run as root)")
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's own numbers


def _huge(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(8 << 30)  # 8 GB, sparse: refused by its size, never read
    path.chmod(0o600)


def _shared_writable(path: Path) -> None:
    path.write_text("{}")
    path.chmod(0o666)


HOSTILE = {
    "fifo": _fifo,
    "dev-zero link": _dev_zero_link,
    "device": _device,
    "huge": _huge,
    "shared-writable": _shared_writable,
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_read_regular_refuses_at_once_naming_the_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "state.json"
    HOSTILE[kind](path)
    with pytest.raises(UnsafePathError) as e:
        read_regular(path, 1 << 20)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_read_regular_of_a_named_file_follows_links_but_never_reads_a_device(tmp_path: Path) -> None:
    real = tmp_path / "job.toml"
    real.write_text('name = "x"\n')
    (tmp_path / "link.toml").symlink_to(real)
    assert read_regular(tmp_path / "link.toml", named=True) == b'name = "x"\n'
    _dev_zero_link(tmp_path / "zero.toml")
    with pytest.raises(UnsafePathError, match="not a regular file"):
        read_regular(tmp_path / "zero.toml", named=True)
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    ("value", "ok"),
    [(3, True), (0.5, True), (1e308, False), (-1, False), (float("nan"), False), ("3", False), (True, False)],
)
def test_bounded(value: object, ok: bool) -> None:
    if ok:
        assert statefile.bounded(value, "x", 10.0) == float(value)  # type: ignore[arg-type]
    else:
        with pytest.raises(ValueError, match="x"):
            statefile.bounded(value, "x", 10.0)


# ------------------------------------------------------------ the files trainctl writes
def _history_file(tmp_path: Path) -> tuple[PresetHistory, Path]:
    history = PresetHistory(tmp_path / "data" / "preset-history")
    history.dir.mkdir(parents=True, mode=0o700)
    return history, history.dir / "bad.json"


def _record(**over: object) -> dict:
    d = {"job": "j", "machine": "m", "preset": "A", "content": "c", "hours": 1.0, "batches": 10}
    return {**d, "incidents": {"stall": 1}, "cost_s": {"detection": 5.0}, "costed": 1, **over}


def _history_text(**over: object) -> str:
    return json.dumps({"version": 1, "run": "bad", "records": [_record(**over)]})


DAMAGE = {  # what is put where a state file trainctl wrote should be
    **HOSTILE,
    "hours 1e308": lambda p: p.write_text(_history_text(hours=1e308)),
    "batches 1e308": lambda p: p.write_text(_history_text(batches=1e308)),
    "incidents 1e308": lambda p: p.write_text(_history_text(incidents={"stall": 1e308})),
    "costed a string": lambda p: p.write_text(_history_text(costed="1")),
    "torn": lambda p: p.write_text(_history_text()[:40]),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_preset_history_is_set_aside_and_the_others_count(tmp_path: Path, kind: str) -> None:
    history, bad = _history_file(tmp_path)
    (history.dir / "good.json").write_text(_history_text())
    (history.dir / "good.json").chmod(0o600)
    DAMAGE[kind](bad)
    records, problems = history.read("j")
    assert [r.hours for r in records] == [1.0]
    assert records[0].risk().rate_per_h >= 0  # no OverflowError in the figures the ladder reads
    assert len(problems) == 1 and str(bad) in problems[0] and "moved to" in problems[0], problems
    assert not os.path.lexists(bad) and os.path.lexists(f"{bad}.corrupt")
    assert history.read("j") == (records, [])  # said once


def _ladder_text(**over: object) -> str:
    return json.dumps({"job@box": {"rungs": ["A", "B"], "rung": "B", "ts": 1.0, **over}})


LADDER_DAMAGE = {
    **HOSTILE,
    "ts 1e308": lambda p: p.write_text(_ladder_text(ts=1e308)),
    "rung a number": lambda p: p.write_text(_ladder_text(rung=2)),
    "rungs a string": lambda p: p.write_text(_ladder_text(rungs="A,B")),
    "another file's shape": lambda p: p.write_text(_history_text()),
    "torn": lambda p: p.write_text(_ladder_text()[:20]),
}


@pytest.mark.parametrize("kind", sorted(LADDER_DAMAGE))
def test_a_damaged_ladder_memory_is_set_aside_named_and_rewritten(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "ladder.json"
    LADDER_DAMAGE[kind](path)
    memory = LadderMemory(path)
    assert memory.rung("job", "box", ["A", "B"]) is None
    assert len(memory.problems) == 1 and str(path) in memory.problems[0]
    assert not os.path.lexists(path) and os.path.lexists(f"{path}.corrupt")
    memory.remember("job", "box", ["A", "B"], "B", 1.0)
    assert LadderMemory(path).rung("job", "box", ["A", "B"]) == "B"


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_rate_history_is_set_aside_and_counts_as_empty(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "rates.json"
    DAMAGE[kind](path)
    history = RateHistory(path)
    assert history.rate("job", "A") is None
    assert len(history.problems) == 1 and str(path) in history.problems[0]
    assert history.record("job", "A", 2.0, 1.0) and RateHistory(path).rate("job", "A") == 2.0


@pytest.mark.parametrize(
    "kind", sorted({**HOSTILE, "every_s 1e308": None, "every_s a string": None, "torn": None})
)
def test_a_damaged_checkpoint_interval_is_set_aside_and_the_jobs_holds(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "checkpoint-every.json"
    if kind in HOSTILE:
        HOSTILE[kind](path)
    else:
        text = {
            "every_s 1e308": '{"every_s": 1e308}',
            "every_s a string": '{"every_s": "60"}',
            "torn": '{"ev',
        }
        path.write_text(text[kind])
    assert read_every(path) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "moved to" in err
    assert not os.path.lexists(path)
    path.write_text('{"every_s": 60}')
    assert read_every(path) == 60.0


# --------------------------------------------------------------- another user's directory
def test_a_data_directory_another_user_owns_is_not_read(tmp_path: Path) -> None:
    uid = other_uid()
    data = tmp_path / "data"
    history = PresetHistory(data / "preset-history")
    history.write_run("theirs", [], 1.0)
    (history.dir / "theirs.json").write_text(_history_text(hours=500.0))
    LadderMemory(data / "ladder.json").remember("job", "box", ["A", "B"], "B", 1.0)
    os.chown(data, uid, -1)
    records, problems = history.read("j")
    assert records == [] and len(problems) == 1 and f"owned by uid {uid}" in problems[0]
    memory = LadderMemory(data / "ladder.json")
    assert memory.rung("job", "box", ["A", "B"]) is None  # the choice does not follow their file
    assert len(memory.problems) == 1 and str(data) in memory.problems[0]
    with pytest.raises(UnsafePathError):
        memory.remember("job", "box", ["A", "B"], "A", 2.0)
    assert (history.dir / "theirs.json").exists()  # not ours to move


def test_a_group_writable_data_directory_is_not_read(tmp_path: Path) -> None:
    data = tmp_path / "data"
    LadderMemory(data / "ladder.json").remember("job", "box", ["A", "B"], "B", 1.0)
    data.chmod(0o777)
    memory = LadderMemory(data / "ladder.json")
    assert memory.rung("job", "box", ["A", "B"]) is None
    assert "writable by group or others" in memory.problems[0]
    data.chmod(0o1777)  # sticky: nobody else can replace what is ours in it
    assert LadderMemory(data / "ladder.json").rung("job", "box", ["A", "B"]) == "B"


# ------------------------------------------------------------------ the files the user writes
def test_one_bad_entry_of_hosts_toml_is_skipped_and_named_the_rest_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainctl.hosts import box

    config = tmp_path / "config"
    config.mkdir(mode=0o700)
    monkeypatch.setenv("TRAINCTL_CONFIG_DIR", str(config))
    path = config / "hosts.toml"
    path.write_text('hosts = ["gpu-a", 42, "", "-oProxyCommand=x", "gpu-b"]\n')
    good, skipped = box.ls_hosts()
    assert good == ["gpu-a", "gpu-b"]
    assert [s.split(" skipped")[0] for s in skipped] == [
        f"{path}: hosts[1] = 42",
        f'{path}: hosts[2] = ""',
        f'{path}: hosts[3] = "-oProxyCommand=x"',
    ]
    assert path.read_text().startswith('hosts = ["gpu-a"')  # the user's file: never changed
    rows = [row for host in box.listed()[2:] for row in host.runs()]
    assert [r["error"] for r in rows] == skipped
    path.unlink()
    _fifo(path)
    good, skipped = box.ls_hosts()
    assert good == [] and len(skipped) == 1 and "not a regular file" in skipped[0]
    assert stat.S_ISFIFO(os.lstat(path).st_mode)  # never moved


def test_a_bad_entry_of_alerts_toml_is_skipped_and_named_the_rest_used(tmp_path: Path) -> None:
    from trainctl.alerts.settings import load_user_alerts

    path = tmp_path / "alerts.toml"
    path.write_text(
        'default = ["ops", "gone"]\nbell = "loud"\n[alert.ops]\nurl = "ntfy://ntfy.sh/topic"\n'
        '[alert.bad]\nurl = 42\n[alert.worse]\nurls = "json://x"\n'
    )
    path.chmod(0o600)
    user = load_user_alerts(path)
    assert user.named == {"ops": ("ntfy://ntfy.sh/topic",)} and user.default == ("ops",) and user.bell
    assert sorted(s.split(" skipped")[0] for s in user.skipped) == sorted(
        [f"{path}: bell", f"{path}: [alert.bad]", f"{path}: [alert.worse]", f'{path}: default "gone"']
    )
    assert path.read_text().startswith("default")  # never changed nor moved


def test_atomic_path_renames_what_was_written_and_removes_a_failed_write(tmp_path: Path) -> None:
    dest = tmp_path / "last.ckpt"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / f".{dest.name}.{os.getpid()}.tmp").symlink_to(victim)  # Lightning's old name
    with statefile.atomic_path(dest) as tmp:
        assert tmp.parent == tmp_path and tmp.exists() and not tmp.is_symlink()
        tmp.write_bytes(b"weights")
    assert dest.read_bytes() == b"weights" and victim.read_text() == "precious"
    with pytest.raises(RuntimeError), statefile.atomic_path(dest) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("the save failed")
    assert dest.read_bytes() == b"weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["last.ckpt", "victim", f".{dest.name}.{os.getpid()}.tmp"]
    )
