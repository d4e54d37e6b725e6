"""Issue 38, items 4 and 5 under real processes: a run whose state files are hostile (a FIFO,
a link to /dev/zero, an overflowing figure) starts, names each file in one line, sets it
aside and finishes; `status`, `attach` and `report` read a journal with a wrong-typed line,
a loss of ±1e308 and a torn last line without crashing and say what they skipped; one bad
entry of hosts.toml does not empty `trainctl ls`.  Real `python -m trainctl` processes, real
agents and trainers; every command has a timeout (a hang fails, it never waits)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import PYTHON, of_type, read_journal, run_trainctl

pytestmark = pytest.mark.e2e

SCRIPT = "import time\nfor i in range(6):\n    print(f'epoch 1/1 batch {i + 1}/6 loss {1 / (i + 1):.3f}', flush=True)\n    time.sleep(0.1)\n"


def _trainctl(args: list[str], timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainctl", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """One short real run, finished, to copy and damage (its own runs, data and config: the
    module's, made before each test's own)."""
    base = tmp_path_factory.mktemp("damaged")
    (base / "t.py").write_text(SCRIPT)
    run_dir = base / "run"
    env = {f"TRAINCTL_{k}_DIR": str(base / k.lower()) for k in ("RUNS", "DATA", "CONFIG", "CACHE")}
    res = run_trainctl(
        [
            "run",
            "--json",
            "--no-tmux",
            "--no-spare",
            "--run-dir",
            str(run_dir),
            "--",
            PYTHON,
            str(base / "t.py"),
        ],
        timeout=90,
        env=env,
    )
    assert res.returncode == 0, res.describe()
    return run_dir


def _copy(run_dir: Path, where: Path, lines: list[str], tail: str = "") -> Path:
    copy = where / "copy"
    shutil.copytree(
        run_dir, copy, symlinks=True, ignore=shutil.ignore_patterns("snapshot.json", "agent.sock")
    )
    (copy / "events.jsonl").write_text("".join(ln + "\n" for ln in lines) + tail)
    return copy


def _lines(run_dir: Path) -> list[str]:
    return (run_dir / "events.jsonl").read_text().splitlines()


def test_a_wrong_typed_line_is_skipped_and_said_by_status_attach_and_report(finished_run, tmp_path):
    lines = _lines(finished_run)
    bad = json.loads(lines[3])
    bad["ts"] = "yesterday"  # a string where a number stands
    copy = _copy(finished_run, tmp_path, [*lines[:3], json.dumps(bad), *lines[3:]])
    status = _trainctl(["status", str(copy)])
    assert status.returncode == 0, status.stderr
    assert "journal 1 unreadable line skipped" in status.stdout
    assert "FINISHED" in status.stdout
    attach = _trainctl(["attach", "--headless", str(copy)])
    assert attach.returncode == 0 and "FINISHED" in attach.stdout, attach.stderr
    report = _trainctl(["report", "-o", str(tmp_path / "r.html"), str(copy)])
    assert report.returncode == 0 and (tmp_path / "r.html").stat().st_size > 0, report.stderr


def test_a_loss_of_plus_minus_1e308_is_reported(finished_run, tmp_path):
    out = []
    for line in _lines(finished_run):
        d = json.loads(line)
        if d.get("type") == "progress":
            if "k" in d:
                d["k"] = ["loss"]
            d["l"] = [1e308 if d.get("b") == 1 else -1e308]
        out.append(json.dumps(d))
    copy = _copy(finished_run, tmp_path, out)
    report = _trainctl(["report", "-o", str(tmp_path / "r.html"), str(copy)])
    assert report.returncode == 0, report.stderr
    assert "<svg" in (tmp_path / "r.html").read_text()
    md = _trainctl(["report", "--md", "--stdout", str(copy)])
    assert md.returncode == 0, md.stderr
    assert "e+308" in _trainctl(["status", str(copy)]).stdout


def test_attach_says_why_it_ends_on_a_journal_cut_mid_line(finished_run, tmp_path):
    lines = _lines(finished_run)
    copy = _copy(finished_run, tmp_path, lines[:9], tail=lines[9][:30])  # the agent died mid-line
    attach = _trainctl(["attach", "--headless", str(copy)], timeout=90)
    assert attach.returncode == 3
    said = attach.stderr.strip().splitlines()
    assert len(said) == 1 and "no agent is running" in said[0] and "cut short" in said[0], attach.stderr
    status = _trainctl(["status", str(copy)])
    assert status.returncode == 0 and "RUNNING" in status.stdout, status.stderr


def test_hostile_state_files_are_named_set_aside_and_the_run_finishes(tmp_path):
    data, config = Path(os.environ["TRAINCTL_DATA_DIR"]), Path(os.environ["TRAINCTL_CONFIG_DIR"])
    (data / "preset-history").mkdir(parents=True, mode=0o700)
    config.mkdir(parents=True, mode=0o700, exist_ok=True)
    os.mkfifo(data / "ladder.json", 0o600)
    (data / "preset-history" / "other.json").symlink_to("/dev/zero")
    (data / "preset-history" / "big.json").write_text(
        json.dumps(
            {
                "version": 1,
                "run": "big",
                "records": [
                    {
                        "job": "hostile",
                        "machine": "m",
                        "preset": "A",
                        "content": "c",
                        "hours": 1e308,
                        "batches": 1,
                    }
                ],
            }
        )
    )
    (data / "preset-history" / "big.json").chmod(0o600)
    os.mkfifo(config / "rates.json", 0o600)
    (tmp_path / "presets").mkdir()
    for name in ("A", "B"):
        (tmp_path / "presets" / f"{name}.toml").write_text("[dataloader]\nworkers = 0\n")
    (tmp_path / "t.py").write_text(SCRIPT)
    job = tmp_path / "trainctl.toml"
    job.write_text(
        f'name = "hostile"\nkind = "command"\ncommand = {json.dumps([PYTHON, str(tmp_path / "t.py")])}\n'
        'preset = "A"\nladder = ["A", "B"]\n'
    )
    res = run_trainctl(["run", "--json", "--no-tmux", "--no-spare", str(job)], timeout=90)
    assert res.returncode == 0, res.describe()
    said = [e.text for e in of_type(res.events, "info")]
    for path in (data / "ladder.json", data / "preset-history" / "other.json", config / "rates.json"):
        mine = [t for t in said if str(path) in t]
        assert len(mine) == 1 and "moved to" in mine[0], (path, said)
        assert not os.path.lexists(path) and os.path.lexists(f"{path}.corrupt")
    assert any("big.json" in t and "out of range" in t for t in said), said
    assert of_type(read_journal(res.run_dir), "state")[-1].state == "FINISHED"


def test_one_bad_entry_of_hosts_toml_leaves_ls_listing_the_rest(finished_run):
    config = Path(os.environ["TRAINCTL_CONFIG_DIR"])
    config.mkdir(parents=True, mode=0o700, exist_ok=True)
    (config / "hosts.toml").write_text("hosts = [42]\n")
    ls = _trainctl(["ls", "--json"], TRAINCTL_RUNS_DIR=str(finished_run.parent / "runs"))
    assert ls.returncode == 0, ls.stderr
    rows = json.loads(ls.stdout)
    assert any(r.get("run_dir") == str(finished_run.resolve()) for r in rows), rows
    skipped = [r for r in rows if r.get("where") == "hosts.toml"]
    assert len(skipped) == 1 and "hosts[0] = 42 skipped" in skipped[0]["error"]
    assert (config / "hosts.toml").read_text() == "hosts = [42]\n"  # the user's: never changed
