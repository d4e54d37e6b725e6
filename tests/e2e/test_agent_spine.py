"""Issue 2, end to end: `trainctl` supervises real trainings headless (--json).

Real processes only: the Ultralytics demo (YOLOv8n on CPU), a PyTorch loop with a real
multi-worker DataLoader, presets reaching the trainer, bad config refused, Ctrl-C.
Each run has a timeout and its whole process tree is killed afterwards (conftest).
"""

from __future__ import annotations

import re
import signal
import time

import psutil
import pytest

from tests.e2e.conftest import PYTHON, ROOT, of_type, run_trainctl, start_trainctl, write_ultralytics_job
from tests.helpers.hangs import TRAIN_LOOP
from trainctl.store.journal import journal_lines

pytestmark = pytest.mark.e2e
PRESET_A = ROOT / "src" / "trainctl" / "presets" / "A.toml"
PRESET_B = ROOT / "src" / "trainctl" / "presets" / "B.toml"
LOSSES = {"box_loss", "cls_loss", "dfl_loss"}


def _spawn_workers(pid: int) -> set[int]:
    """Live multiprocessing-spawn children (DataLoader workers) of ``pid``."""
    found = set()
    try:
        children = psutil.Process(pid).children()
    except psutil.Error:
        return found
    for c in children:
        try:
            if "spawn_main" in " ".join(c.cmdline()) and c.status() != psutil.STATUS_ZOMBIE:
                found.add(c.pid)
        except psutil.Error:
            continue
    return found


def _training(events) -> bool:
    """The last phase event is "train" and a batch came after it."""
    last_phase = max((i for i, e in enumerate(events) if e.type == "phase"), default=None)
    return (
        last_phase is not None
        and events[last_phase].phase == "train"
        and any(e.type == "progress" for e in events[last_phase:])
    )


def _check_progress(progress, epochs: int) -> None:
    """Within each epoch the batch only goes up and reaches the last; epochs reach the last."""
    by_epoch: dict[int, list[int]] = {}
    for ev in progress:
        assert ev.epochs == epochs and ev.batches and ev.batches > 0
        by_epoch.setdefault(ev.epoch, []).append(ev.batch)
    assert sorted(by_epoch) == list(range(1, epochs + 1)), by_epoch.keys()
    for epoch, batches in by_epoch.items():
        assert batches == sorted(batches) and len(set(batches)) == len(batches), (epoch, batches)
        assert batches[-1] == progress[-1].batches, f"epoch {epoch} ends at batch {batches[-1]}"
        assert len(batches) >= 2, f"epoch {epoch}: one progress event only"


@pytest.mark.timeout(300)  # 120 real YOLO batches: ~30 s on a quiet box, 150+ at load 15
def test_demo_json_runs_a_real_yolo_training_to_the_end():
    r = run_trainctl(["demo", "--json", "--epochs", "1"], timeout=280)
    assert r.returncode == 0, r.describe()
    kinds = [e.type for e in r.events]
    assert kinds[0] == "start" and r.events[0].attempt == 1 and r.events[0].preset == "A"
    phases = [e.phase for e in r.of_type("phase")]
    assert {"startup", "train", "val", "save", "finished"} <= set(phases), phases
    assert phases[0] == "startup" and phases[-1] == "finished"
    assert all(a != b for a, b in zip(phases, phases[1:])), f"repeated phase events: {phases}"
    progress = r.of_type("progress")
    _check_progress(progress, epochs=1)  # 120 batches: 2 epochs take minutes on a busy box
    assert all(set(p.losses) == LOSSES for p in progress), progress[-1].losses
    assert all(v > 0 for v in progress[-1].losses.values())
    assert [c.epoch for c in r.of_type("checkpoint") if c.ok] == [1]
    exits = r.of_type("exit")
    assert len(exits) == 1 and exits[0].returncode == 0 and exits[0].signal is None
    assert r.events[-1].type == "state" and r.events[-1].state == "FINISHED", kinds[-5:]
    assert not r.of_type("stall"), r.of_type("stall")
    # The raw trainer output is in train.log (Ultralytics' \r frames included) ...
    log = (r.run_dir / "train.log").read_bytes()
    assert b"\r" in log and b"1 epochs completed" in log
    # ... and --json printed exactly the journal, as clients get it (progress lines in the
    # journal are compact; clients get the full form, with seq).
    printed = [line for line in r.stdout.splitlines() if line.strip()]
    assert printed == [line.rstrip("\n") for line in journal_lines(r.run_dir / "events.jsonl", 0)]
    assert len(printed) == len((r.run_dir / "events.jsonl").read_text().splitlines())


@pytest.mark.timeout(90)
def test_generic_pytorch_loop_sees_the_preset(tmp_path):
    r = run_trainctl(
        [
            "run",
            "--json",
            "--preset",
            str(PRESET_A),
            "--",
            PYTHON,
            str(TRAIN_LOOP),
            "--epochs",
            "2",
            "--batches",
            "8",
            "--batch-time",
            "0.02",
        ],
        timeout=80,
    )
    assert r.returncode == 0, r.describe()
    log = (r.run_dir / "train.log").read_text()
    env_line = re.search(r"^env (.*)$", log, re.M)
    assert env_line, log[:2000]
    seen = dict(kv.split("=", 1) for kv in env_line.group(1).split())
    assert seen["OMP_NUM_THREADS"] == "2" and seen["TRAINCTL_PRESET"] == "A"
    assert seen["TRAINCTL_WORKERS"] == "2" and seen["TRAINCTL_MP_CONTEXT"] == "spawn"
    assert seen["TRAINCTL_PERSISTENT_WORKERS"] == "0" and seen["TRAINCTL_PREFETCH_FACTOR"] == "2"
    assert seen["TRAINCTL_ATTEMPT"] == "1"
    assert "workers=2 context=spawn" in log
    assert r.events[0].type == "start" and r.events[0].preset == "A"
    _check_progress(r.of_type("progress"), epochs=2)
    assert [p.losses.keys() for p in r.of_type("progress")][0] == {"loss"}
    assert r.of_type("exit")[0].returncode == 0 and r.events[-1].state == "FINISHED"


@pytest.mark.timeout(300)  # bounds for a loaded box: two real YOLO epochs, spawn workers
def test_ultralytics_preset_a_really_uses_two_spawn_workers(tmp_path):
    """Ultralytics forces workers=0 on CPU; the runner restores the preset's 2 (spawn).
    Counted while the journal says "train" (validation adds its own loader's workers)."""
    job = write_ultralytics_job(tmp_path / "job", n_train=16, n_val=4, batch=2, epochs=2)
    seen_workers: set[int] = set()
    most = 0
    with start_trainctl(["run", str(job), "--json", "--preset", str(PRESET_A)]) as tc:
        start = tc.wait_event("start", 60)
        deadline = time.monotonic() + 230
        while tc.poll() is None and time.monotonic() < deadline:
            workers = _spawn_workers(start.pid)
            if _training(tc.events()):
                seen_workers |= workers
                most = max(most, len(workers))
            time.sleep(0.05)
        r = tc.wait(10)
    assert r.returncode == 0, r.describe()
    assert most == 2, f"at most {most} spawn workers seen at once in train ({seen_workers})"
    assert len(seen_workers) >= 4, f"not new workers each epoch (persistent_workers = false): {seen_workers}"
    info = [e.text for e in r.of_type("info") if e.key == "runner.preset"]
    assert info and "2 DataLoader workers, spawn start" in info[0], info
    progress = r.of_type("progress")
    _check_progress(progress, epochs=2)
    assert all(set(p.losses) == LOSSES for p in progress), progress[-1].losses


@pytest.mark.timeout(120)
def test_preset_b_has_no_workers_and_ctrl_c_stops_the_whole_tree(tmp_path):
    job = write_ultralytics_job(tmp_path / "job", n_train=200, batch=2, epochs=3)
    with start_trainctl(["run", str(job), "--json", "--preset", str(PRESET_B)]) as tc:
        start = tc.wait_event("start", 30)
        tc.wait_event(lambda e: e.type == "progress" and (e.batch or 0) >= 3, 90, "progress")
        pids = tc.tree_pids()
        children: set[int] = set()
        for _ in range(15):  # ~1.5 s of training: no worker appears
            children |= {c.pid for c in psutil.Process(start.pid).children(recursive=True)}
            pids |= tc.tree_pids()
            time.sleep(0.1)
        assert children == set(), "preset B (workers = 0) started child processes"
        assert start.pid in pids and tc.pid in pids
        tc.signal(signal.SIGINT)  # Ctrl-C
        r = tc.wait(30)
    assert r.returncode == 130, r.describe()
    assert [e.type for e in r.events[-2:]] == ["exit", "state"], [e.type for e in r.events[-4:]]
    assert r.events[-1].state == "STOPPED" and r.of_type("exit")[-1].returncode is not None
    left = [p for p in pids if psutil.pid_exists(p) and _alive(p)]
    assert left == [], f"processes left after Ctrl-C: {left}"
    assert not of_type(r.events, "restart"), "Ctrl-C must not restart the run"


@pytest.mark.timeout(60)
def test_ctrl_c_also_takes_the_dataloader_workers():
    with start_trainctl(
        [
            "run",
            "--json",
            "--",
            PYTHON,
            str(TRAIN_LOOP),
            "--epochs",
            "1",
            "--batches",
            "2000",
            "--batch-time",
            "0.02",
        ]
    ) as tc:
        start = tc.wait_event("start", 30)
        tc.wait_event(lambda e: e.type == "progress" and (e.batch or 0) >= 3, 45, "progress")
        workers = psutil.Process(start.pid).children()
        assert len(workers) == 2, workers
        pids = tc.tree_pids()
        assert {w.pid for w in workers} <= pids
        tc.signal(signal.SIGINT)
        r = tc.wait(30)
    assert r.returncode == 130, r.describe()
    assert [e.type for e in r.events[-2:]] == ["exit", "state"] and r.events[-1].state == "STOPPED"
    assert [p for p in pids if _alive(p)] == []


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


BAD = [
    (
        "preset-context",
        "preset",
        '[dataloader]\nmultiprocessing_context = "fork2"\n',
        ("multiprocessing_context", '"fork", "spawn", "forkserver"', "fork2"),
    ),
    ("preset-workers", "fallback", "[dataloader]\nworkers = -1\n", ("workers", "integer >= 0")),
    (
        "preset-unknown-key",
        "preset",
        "[dataloader]\nnum_workers = 2\n",
        ("num_workers", "allowed keys", "workers"),
    ),
    (
        "job-kind",
        "job",
        'kind = "bogus"\ncommand = ["true"]\n',
        ("kind", '"ultralytics", "command"', "bogus"),
    ),
    (
        "job-stall",
        "job",
        'kind = "command"\ncommand = ["true"]\n[stall]\ntrain_timeout = -3\n',
        ("[stall] train_timeout", "> 0"),
    ),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name,where,text,needles", BAD, ids=[b[0] for b in BAD])
def test_bad_config_is_refused_with_exit_2_naming_file_key_and_allowed(tmp_path, name, where, text, needles):
    bad = tmp_path / f"{name}.toml"
    bad.write_text(text)
    run_dir = tmp_path / "run"
    if where == "job":
        args = ["run", str(bad), "--json"]
    else:
        args = ["run", "--json", f"--{where}", str(bad), "--", PYTHON, "-c", "pass"]
    r = run_trainctl(args, timeout=30, run_dir=run_dir)
    assert r.returncode == 2, r.describe()
    assert str(bad) in r.stderr, r.stderr
    for needle in needles:
        assert needle in r.stderr, (needle, r.stderr)
    assert not run_dir.exists(), "a refused run must not create its run directory"


@pytest.mark.timeout(30)
def test_unknown_preset_name_lists_the_available_ones(tmp_path):
    r = run_trainctl(
        ["run", "--json", "--preset", "nosuch", "--", PYTHON, "-c", "pass"],
        timeout=20,
        run_dir=tmp_path / "run",
    )
    assert r.returncode == 2, r.describe()
    assert '"nosuch"' in r.stderr and "A, B" in r.stderr and "looked in" in r.stderr, r.stderr
