"""Shared e2e helpers: run the real `trainctl` command as a subprocess and read its journal.

Use from any e2e test (``from tests.e2e.conftest import run_trainctl, start_trainctl``):

* :func:`run_trainctl` ``(args, timeout, env=None, run_dir=None) -> Result`` runs
  ``python -m trainctl *args`` to completion (or kills it at ``timeout`` and raises
  ``TimeoutError`` with the output tail), then returns
  ``Result(returncode, events, stdout, stderr, run_dir)``.
* :func:`start_trainctl` ``(args, env=None, run_dir=None) -> Trainctl`` starts it in the
  background; use ``with start_trainctl(...) as tc:`` (or call ``tc.kill()`` in a
  ``finally``) and ``tc.wait_event(pred, timeout)`` / ``tc.wait(timeout) -> Result``.

For ``run`` and ``demo`` a fresh run directory is chosen (and ``--run-dir DIR`` inserted
before any ``--``) unless ``args`` already holds ``--run-dir``; ``Result.run_dir`` and
``Trainctl.run_dir`` name it (for other sub-commands it is the ``run_dir`` argument or None).
:func:`write_ultralytics_job` writes a small Ultralytics job (synthetic data set, CPU) and
:func:`write_command_job` a generic one, for tests that need a job file.

``events`` are the journal's events (``events.jsonl``, typed, with seq) as
``trainctl.core.events`` dataclasses; :func:`of_type` filters them.

Cleanup: trainctl starts in its own session; :meth:`Trainctl.kill` SIGKILLs its whole tree:
every descendant, its session and process group, the trainer's own session, and any process
whose environment names the run directory (``TRAINCTL_RUN_DIR``: trainer workers orphaned
when the agent died) — that last one only for ``run``/``demo``/``agent``, so killing a
``ctl`` or ``attach`` helper never touches the run it talks to.  Pids seen while the run
was going (:meth:`Trainctl.tree_pids`) are remembered and killed too.  An autouse fixture
kills every Trainctl a test made, even one it forgot.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.helpers.hangs import wait_until  # noqa: F401  (re-exported for the e2e tests)
from trainctl.core import events as E
from trainctl.store.journal import read_events

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
_RUN_COUNTER = iter(range(1, 10**9))
_ALL: list[Trainctl] = []


@dataclass
class Result:
    returncode: int
    events: list[E.Event]
    stdout: str
    stderr: str
    run_dir: Path | None
    pids: set[int] = field(default_factory=set)  # every process seen in the run's tree

    def of_type(self, *types: str) -> list[E.Event]:
        return of_type(self.events, *types)

    def describe(self) -> str:
        """For assertion messages: exit code, stderr tail, event summary."""
        kinds = [e.type + (f":{getattr(e, 'state', '')}" if e.type == "state" else "") for e in self.events]
        return (
            f"rc={self.returncode}\nstderr tail:\n{self.stderr[-2000:]}\nstdout tail:\n"
            f"{self.stdout[-1500:]}\nevents: {kinds[-60:]}"
        )


def of_type(events: Iterable[E.Event], *types: str) -> list[E.Event]:
    return [e for e in events if e.type in types]


def verdicts(events: Iterable[E.Event]) -> list[E.Event]:
    """Each stall's verdict: its stall_diagnosis event (the stall goes out at detection and
    its verdict after), or the stall itself where it carries one (several nodes' ranks are
    diagnosed before the stall is said)."""
    return [
        e
        for e in events
        if e.type == "stall_diagnosis" or (e.type == "stall" and e.diagnosis != E.DIAGNOSING)
    ]


def read_journal(run_dir: Path | str | None) -> list[E.Event]:
    """The journal of a run directory (empty when there is none yet)."""
    if run_dir is None:
        return []
    path = Path(run_dir) / "events.jsonl"
    return list(read_events(path)) if path.exists() else []


def _with_run_dir(
    args: list[str], run_dir: Path | str | None, base: Path | None
) -> tuple[list[str], Path | None]:
    """For run/demo: make sure the command names a run directory, and return it."""
    args = [str(a) for a in args]
    head = args[: args.index("--")] if "--" in args else args
    for i, a in enumerate(head):
        if a == "--run-dir" and i + 1 < len(head):
            return args, Path(head[i + 1])
        if a.startswith("--run-dir="):
            return args, Path(a.split("=", 1)[1])
    if head and head[0] == "agent" and len(head) > 1:
        return args, Path(head[1])
    if not head or head[0] not in ("run", "demo"):
        return args, Path(run_dir) if run_dir else None
    if run_dir is None:
        parent = base or Path(os.environ.get("TRAINCTL_RUNS_DIR") or "/tmp/trainctl-e2e-runs")
        run_dir = parent / f"e2e-{os.getpid()}-{next(_RUN_COUNTER)}"
    i = args.index("--") if "--" in args else len(args)
    return args[:i] + ["--run-dir", str(run_dir)] + args[i:], Path(run_dir)


class Trainctl:
    """A `trainctl` process running in the background (own session), output read in threads."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str] | None = None,
        run_dir: Path | str | None = None,
        cwd: Path | str | None = None,
    ):
        self.args, self.run_dir = _with_run_dir(list(args), run_dir, None)
        # Only a run it started is its to kill by run directory (not `ctl`, `attach`, ...).
        self.owns_run = bool(self.args) and self.args[0] in ("run", "demo", "agent")
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        self.started = time.time()
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "trainctl", *self.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            cwd=str(cwd or ROOT),
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self._out: list[bytes] = []
        self._err: list[bytes] = []
        self._threads = [
            threading.Thread(target=self._pump, args=(s, buf), daemon=True)
            for s, buf in ((self.proc.stdout, self._out), (self.proc.stderr, self._err))
        ]
        for t in self._threads:
            t.start()
        self._seen: dict[int, psutil.Process] = {}
        _ALL.append(self)

    @staticmethod
    def _pump(stream, buf: list[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):
            for chunk in iter(lambda: stream.read1(65536), b""):
                buf.append(chunk)

    # ---------------------------------------------------------------- reading
    @property
    def stdout(self) -> str:
        return b"".join(self._out).decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return b"".join(self._err).decode("utf-8", "replace")

    def events(self) -> list[E.Event]:
        return read_journal(self.run_dir)

    def poll(self) -> int | None:
        return self.proc.poll()

    def tree(self, scan_env: bool = False) -> list[psutil.Process]:
        """The live processes of the run now (trainctl and its descendants; with ``scan_env``
        also every process whose env names the run directory), remembered for kill."""
        found: dict[int, psutil.Process] = {}
        try:
            me = psutil.Process(self.pid)
            found[me.pid] = me
            for c in me.children(recursive=True):
                found[c.pid] = c
        except psutil.Error:
            pass
        for p in self._run_dir_procs() if scan_env else ():
            found.setdefault(p.pid, p)
        for pid, p in found.items():
            self._seen.setdefault(pid, p)
        return list(found.values())

    def tree_pids(self) -> set[int]:
        """Pids of every process seen in the run's tree so far (call during the run)."""
        self.tree()
        return set(self._seen)

    def _run_dir_procs(self) -> list[psutil.Process]:
        if self.run_dir is None or not self.owns_run:
            return []
        want = str(self.run_dir)
        out = []
        for p in psutil.process_iter():
            try:
                if p.pid != os.getpid() and p.environ().get("TRAINCTL_RUN_DIR") == want:
                    out.append(p)
            except (psutil.Error, OSError):
                continue
        return out

    def wait_event(self, pred: Callable[[E.Event], bool] | str, timeout: float, what: str = "") -> E.Event:
        """Poll the journal until an event matches (a type name or a predicate); TimeoutError
        (with the output tail) when it does not come or trainctl exits first."""
        if isinstance(pred, str):
            kind = pred
            pred = lambda e: e.type == kind  # noqa: E731
            what = what or kind
        deadline = time.monotonic() + timeout
        while True:
            self.tree()
            for ev in self.events():
                if pred(ev):
                    return ev
            if self.poll() is not None:
                for ev in self.events():
                    if pred(ev):
                        return ev
                raise TimeoutError(
                    f"trainctl exited before {what or 'the event'}:\n{self.result().describe()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no {what or 'matching event'} within {timeout}s:\n{self.result().describe()}"
                )
            time.sleep(0.1)

    def result(self) -> Result:
        return Result(
            self.proc.returncode if self.proc.returncode is not None else -999,
            self.events(),
            self.stdout,
            self.stderr,
            self.run_dir,
            set(self._seen),
        )

    # ---------------------------------------------------------------- ending
    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def wait(self, timeout: float) -> Result:
        """Wait for trainctl to exit; on timeout kill everything and raise TimeoutError."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.tree()
            time.sleep(0.1)
        if self.proc.poll() is None:
            self.kill()
            raise TimeoutError(
                f"trainctl {' '.join(self.args)} still running after {timeout}s:\n{self.result().describe()}"
            )
        for t in self._threads:
            t.join(timeout=5)
        return self.result()

    def kill(self) -> None:
        """SIGKILL the whole run (see the module docstring); safe to call twice."""
        procs = {p.pid: p for p in self.tree(scan_env=True)}
        procs.update(self._seen)
        own_group = os.getpgid(0)
        for pid, p in list(procs.items()):
            with contextlib.suppress(psutil.Error, OSError):
                if not p.is_running():  # is_running also checks the pid was not reused
                    continue
                pgid = os.getpgid(pid)
                if pgid != own_group:  # each trainer runs in its own session: take its group
                    os.killpg(pgid, signal.SIGKILL)
                p.kill()
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        psutil.wait_procs([p for p in procs.values() if p.pid != self.pid], timeout=5)
        for t in self._threads:
            t.join(timeout=2)

    def __enter__(self) -> Trainctl:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


def start_trainctl(
    args: list[str],
    env: dict[str, str] | None = None,
    run_dir: Path | str | None = None,
    cwd: Path | str | None = None,
) -> Trainctl:
    """Start `python -m trainctl *args` in the background (see the module docstring)."""
    return Trainctl(args, env=env, run_dir=run_dir, cwd=cwd)


def run_trainctl(
    args: list[str],
    timeout: float,
    env: dict[str, str] | None = None,
    run_dir: Path | str | None = None,
    cwd: Path | str | None = None,
) -> Result:
    """Run `python -m trainctl *args` to the end; kill its whole tree afterwards either way."""
    tc = start_trainctl(args, env=env, run_dir=run_dir, cwd=cwd)
    try:
        return tc.wait(timeout)
    finally:
        tc.kill()


def _toml(value) -> str:
    import json

    return (
        json.dumps(value)
        if isinstance(value, (str, list))
        else str(value).lower()
        if isinstance(value, bool)
        else str(value)
    )


def write_ultralytics_job(
    root: Path,
    *,
    n_train: int = 32,
    n_val: int = 8,
    epochs: int = 1,
    batch: int = 4,
    imgsz: int = 64,
    preset: str | None = None,
    fallback: str | None = None,
    stall: dict | None = None,
    extra: dict | None = None,
    max_restarts: int | None = None,
) -> Path:
    """A ``kind = "ultralytics"`` job in ``root`` (data set in ``root/data``, YOLOv8n from
    YAML, CPU); ``extra`` adds ``[ultralytics]`` keys, ``stall`` a ``[stall]`` table."""
    from trainctl.config.demo import make_dataset

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    data = make_dataset(root / "data", n_train=n_train, n_val=n_val, size=imgsz)
    lines = ['kind = "ultralytics"', 'name = "e2e-yolo"']
    if preset:
        lines.append(f"preset = {_toml(str(preset))}")
    if fallback:
        lines.append(f"fallback = {_toml(str(fallback))}")
    if max_restarts is not None:
        lines.append(f"max_restarts = {max_restarts}")
    ul = {
        "model": "yolov8n.yaml",
        "data": str(data),
        "epochs": epochs,
        "imgsz": imgsz,
        "batch": batch,
        "device": "cpu",
        "project": str(root / "runs"),
        "plots": False,
    }
    ul.update(extra or {})
    lines.append("\n[ultralytics]")
    lines += [f"{k} = {_toml(v)}" for k, v in ul.items()]
    if stall:
        lines.append("\n[stall]")
        lines += [f"{k} = {_toml(v)}" for k, v in stall.items()]
    job = root / "trainctl.toml"
    job.write_text("\n".join(lines) + "\n")
    return job


def write_command_job(
    root: Path,
    command: list[str],
    *,
    stall: dict | None = None,
    name: str = "e2e-cmd",
    preset: str | None = None,
) -> Path:
    """A ``kind = "command"`` job in ``root`` running ``command``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    lines = ['kind = "command"', f"name = {_toml(name)}", f"command = {_toml([str(c) for c in command])}"]
    if preset:
        lines.append(f"preset = {_toml(str(preset))}")
    if stall:
        lines.append("\n[stall]")
        lines += [f"{k} = {_toml(v)}" for k, v in stall.items()]
    job = root / "trainctl.toml"
    job.write_text("\n".join(lines) + "\n")
    return job


_SLURM_MODULES = ("test_slurm.py", "test_slurm_nodes.py")


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups off the markers
def pytest_collection_modifyitems(config, items):
    """Under ``--dist loadgroup`` (``make test``) every test that uses the two-node test Slurm
    runs on one worker, one after the other: they drain, fail and preempt its nodes and wait
    for a queue of their own, so two at once break each other."""
    for item in items:
        if item.path.name in _SLURM_MODULES or "slurm" in item.name:
            item.add_marker(pytest.mark.xdist_group("slurm"))


@pytest.fixture(autouse=True)
def _kill_trainctl_runs():
    """Whatever a test started with start_trainctl/run_trainctl is killed after it."""
    n = len(_ALL)
    yield
    for tc in _ALL[n:]:
        tc.kill()
    del _ALL[n:]


@pytest.fixture
def python() -> str:
    return PYTHON


@pytest.fixture
def tmux_runs(tmp_path):
    """Runs whose agents live in a private tmux server, and a second one for a terminal
    (tests/helpers/tmux_runs.py); nothing of them is left after the test."""
    from tests.helpers.tmux_runs import TmuxRuns

    r = TmuxRuns(tmp_path)
    try:
        yield r
    finally:
        r.kill()


@pytest.fixture
def browser_page():
    """A page of a real headless Chromium (tests/e2e/browser.py): ``.page`` is a Playwright
    Page, ``.requests`` every URL it asked for, ``.external`` those that would have left the
    machine (aborted).  Skipped where Chromium is missing; a failure under
    TRAINCTL_REQUIRE_BROWSER=1 (CI)."""
    from tests.e2e.browser import headless_page

    with headless_page() as bp:
        yield bp
