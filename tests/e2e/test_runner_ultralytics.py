"""The Ultralytics runner, for real: YOLOv8n trains on CPU on a tiny synthetic data set.

Each run is a subprocess in its own session (killed as a group afterwards); events are
read from a real pipe passed as TRAINCTL_EVENTS_FD, DataLoader workers are counted with
psutil while the run trains.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

import psutil
import pytest

from tests.helpers.hangs import wait_until
from trainctl.config import load_job, load_preset
from trainctl.config.demo import make_dataset, make_demo_job
from trainctl.core import events as E
from trainctl.store.checkpoint import GOOD_NAME, inspect_checkpoint
from trainctl.store.paths import cache_dir

pytest.importorskip("ultralytics")
pytestmark = pytest.mark.e2e

PRESETS = Path(str(resources.files("trainctl.presets")))
PRESET_A, PRESET_B = PRESETS / "A.toml", PRESETS / "B.toml"
LOSSES = {"box_loss", "cls_loss", "dfl_loss"}


def spawn_workers(pid: int) -> set[int]:
    """Pids of the multiprocessing-spawn children (DataLoader workers) of ``pid``."""
    found = set()
    try:
        children = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return found
    for child in children:
        try:
            if "spawn_main" in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                found.add(child.pid)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def dataset() -> Path:
    return make_dataset(cache_dir() / "runner-e2e", n_train=8, n_val=4)


def write_job(root: Path, data_yaml: Path, epochs: int) -> Path:
    job = root / "trainctl.toml"
    job.write_text(f"""\
kind = "ultralytics"
name = "runner-test"
preset = "A"
fallback = "B"

[ultralytics]
model = "yolov8n.yaml"
data = "{data_yaml}"
epochs = {epochs}
imgsz = 64
batch = 4
device = "cpu"
project = "{root / "runs"}"
""")
    return job


class Run:
    """A runner subprocess; ``events`` fills in as they arrive."""

    def __init__(self, proc: subprocess.Popen, on_event: Callable[[E.Event, int], None] | None) -> None:
        self.proc = proc
        self.events: list[E.Event] = []
        self.on_event = on_event
        self.reader: threading.Thread | None = None

    def read(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as pipe:
            for line in pipe:
                event = E.decode(line)
                if self.on_event is not None:
                    self.on_event(event, self.proc.pid)
                self.events.append(event)

    def wait(self, timeout: float) -> int:
        rc = self.proc.wait(timeout)
        if self.reader is not None:
            self.reader.join(10)
        return rc

    def of(self, kind: type[E.Event]) -> list:
        return [e for e in self.events if isinstance(e, kind)]


@contextmanager
def runner(
    job: Path,
    preset: Path,
    run_dir: Path,
    *extra: str,
    events: bool = True,
    on_event: Callable[[E.Event, int], None] | None = None,
) -> Iterator[Run]:
    """Start the runner the way the agent does (preset env, own session); kill its group after."""
    env = dict(os.environ)
    env.update(load_preset(preset).child_env())
    argv = [
        sys.executable,
        "-m",
        "trainctl.inside.ultralytics_runner",
        "--job",
        str(job),
        "--preset",
        str(preset),
        "--run-dir",
        str(run_dir),
        *extra,
    ]
    r_fd = w_fd = None
    if events:
        r_fd, w_fd = os.pipe()
        env["TRAINCTL_EVENTS_FD"] = str(w_fd)
    log = open(run_dir.parent / f"{run_dir.name}-{len(list(run_dir.parent.glob('*.log')))}.log", "wb")  # noqa: SIM115 - the child writes to it while this yields; closed in the finally below
    proc = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        pass_fds=(w_fd,) if events else (),
    )
    run = Run(proc, on_event)
    try:
        if events:
            os.close(w_fd)
            run.reader = threading.Thread(target=run.read, args=(r_fd,), daemon=True)
            run.reader.start()
        yield run
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)
        log.close()


def assert_epochs(progress: list[E.Progress], first: int, last: int) -> None:
    """Every epoch first..last reported, its batch counting up to its last batch."""
    assert sorted({p.epoch for p in progress}) == list(range(first, last + 1))
    for epoch in range(first, last + 1):
        mine = [p for p in progress if p.epoch == epoch]
        batches = [p.batch for p in mine]
        assert batches == sorted(set(batches)), f"epoch {epoch}: batches go back: {batches}"
        assert batches[-1] == mine[-1].batches == 2
        assert all(p.epochs == last for p in mine)
    assert all(set(p.losses) == LOSSES and all(v >= 0 for v in p.losses.values()) for p in progress)


@pytest.mark.timeout(300)  # bounds for a loaded box
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="Ultralytics caps workers at the CPU count")
def test_preset_a_spawns_two_workers_and_reports(tmp_path, dataset):
    job = write_job(tmp_path, dataset, epochs=2)
    run_dir = tmp_path / "run"
    workers: dict[int, set[int]] = {}

    def sample(event: E.Event, pid: int) -> None:
        if isinstance(event, E.Progress):
            workers.setdefault(event.epoch, set()).update(spawn_workers(pid))

    with runner(job, PRESET_A, run_dir, on_event=sample) as run:
        assert run.wait(270) == 0

    phases = [e.phase for e in run.of(E.Phase)]
    assert phases[0] == "startup" and phases[-1] == "finished"
    assert {"train", "save", "val"} <= set(phases)
    assert_epochs(run.of(E.Progress), 1, 2)

    good = run_dir / "checkpoints" / GOOD_NAME
    checkpoints = run.of(E.Checkpoint)
    assert [(c.epoch, c.ok, c.path) for c in checkpoints] == [(1, True, str(good)), (2, True, str(good))]
    assert inspect_checkpoint(good).epoch == 1

    info = " | ".join(i.text for i in run.of(E.Info))
    assert "preset A: 2 DataLoader workers, spawn start, prefetch 2, new each epoch" in info
    # Two spawned workers while training, although Ultralytics forces 0 on CPU; and
    # persistent_workers = false gives each epoch new ones.
    assert len(workers[1]) == 2 and len(workers[2]) == 2, workers
    assert not workers[1] & workers[2]


@pytest.mark.timeout(360)
def test_preset_b_standalone_stopped_then_resumed(tmp_path, dataset):
    job = write_job(tmp_path, dataset, epochs=5)
    run_dir = tmp_path / "run"
    good = run_dir / "checkpoints" / GOOD_NAME

    # Standalone (no event channel): stop it with SIGTERM once a good checkpoint is kept.
    with runner(job, PRESET_B, run_dir, events=False) as run:
        wait_until(good.exists, 180, what=f"{good}")
        assert run.proc.poll() is None
        assert not spawn_workers(run.proc.pid)  # preset B: workers = 0
        run.proc.send_signal(signal.SIGTERM)
        assert run.wait(30) == -signal.SIGTERM
    kept = inspect_checkpoint(good)
    assert kept.ok and not kept.complete, kept
    next_epoch = kept.epoch + 2  # 1-based epoch the resumed run starts with

    seen_workers: set[int] = set()
    with runner(
        job,
        PRESET_B,
        run_dir,
        "--resume",
        str(good),
        on_event=lambda ev, pid: seen_workers.update(spawn_workers(pid)),
    ) as run:
        assert run.wait(240) == 0
    assert_epochs(run.of(E.Progress), next_epoch, 5)
    assert [c.epoch for c in run.of(E.Checkpoint)] == list(range(next_epoch, 6))
    assert any(i.key == "runner.resume" for i in run.of(E.Info))
    assert run.of(E.Phase)[-1].phase == "finished"
    assert not seen_workers

    # The run is complete now: resuming again says so and exits 0 without training.
    with runner(job, PRESET_B, run_dir, "--resume", str(good)) as run:
        assert run.wait(60) == 0
    assert [i.key for i in run.of(E.Info)] == ["runner.resume_complete"]
    assert [e.phase for e in run.of(E.Phase)] == ["startup", "finished"]
    assert not run.of(E.Progress)


@pytest.mark.timeout(60)
def test_demo_job_is_valid_and_idempotent(tmp_path):
    job_path = make_demo_job(tmp_path / "demo", epochs=3)
    first = {p: p.read_bytes() for p in (tmp_path / "demo").rglob("*") if p.is_file()}
    assert make_demo_job(tmp_path / "demo", epochs=3) == job_path
    again = {p: p.read_bytes() for p in (tmp_path / "demo").rglob("*") if p.is_file()}
    assert again == first

    job = load_job(job_path)
    assert job.kind == "ultralytics" and job.preset == "A" and job.fallback == "B"
    assert job.ultralytics["epochs"] == 3 and job.ultralytics["device"] == "cpu"
    assert job.load_preset().dataloader.workers == 2 and job.load_fallback().dataloader.workers == 0
    data = Path(job.ultralytics["data"])
    images = sorted((data.parent / "images" / "train").glob("*.jpg"))
    labels = sorted((data.parent / "labels" / "train").glob("*.txt"))
    assert len(images) == len(labels) > 0
    classes = {int(line.split()[0]) for f in labels for line in f.read_text().splitlines()}
    assert classes == {0, 1}
