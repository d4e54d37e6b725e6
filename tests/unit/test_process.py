"""PID safety in kill_tree (issue 13): one reaper for the trainer, and no signal to a pid
that may have been reused.  Real processes; each test kills what it started."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from trainctl.system.process import Signaller, kill_tree

pytestmark = pytest.mark.timeout(60)
HAVE_PIDFD = hasattr(os, "pidfd_open")
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
# Ignores SIGTERM: only the SIGKILL after the grace ends it.
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(60)",
]


class _Reused(psutil.Process):
    """A captured process whose pid now belongs to another process (what psutil's create
    time check sees after a reuse): is_running() is False."""

    def is_running(self) -> bool:
        return False


@contextlib.contextmanager
def _sleeper():
    proc = subprocess.Popen(SLEEPER, start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()


@pytest.mark.parametrize("use_pidfd", [True, False] if HAVE_PIDFD else [False])
def test_a_process_whose_create_time_does_not_match_is_not_signalled(use_pidfd):
    with _sleeper() as proc:
        with Signaller(use_pidfd=use_pidfd) as sig:
            assert not sig.send(_Reused(proc.pid), signal.SIGTERM)
            assert not sig.send_group(_Reused(proc.pid), proc.pid, signal.SIGTERM)
            time.sleep(0.2)
            assert proc.poll() is None, "a process that is not the captured one was signalled"
            assert sig.send(psutil.Process(proc.pid), signal.SIGTERM)  # the same one: yes
        assert proc.wait(10) == -signal.SIGTERM


@pytest.mark.parametrize("use_pidfd", [True, False] if HAVE_PIDFD else [False])
def test_the_group_is_signalled_only_while_its_leader_is_the_captured_one(use_pidfd):
    with _sleeper() as proc:
        leader = psutil.Process(proc.pid)
        proc.kill()
        proc.wait()  # reaped: its pid (and group id) may now be anyone's
        with Signaller(use_pidfd=use_pidfd) as sig:
            assert not sig.send_group(leader, proc.pid, signal.SIGTERM)
            assert not sig.send(leader, signal.SIGTERM)
    with _sleeper() as proc:
        with Signaller(use_pidfd=use_pidfd) as sig:
            assert sig.send_group(psutil.Process(proc.pid), proc.pid, signal.SIGTERM)
        assert proc.wait(10) == -signal.SIGTERM


def test_a_bare_pid_that_is_not_ours_is_left_alone():
    """A pid handed over as a number is ours only while it descends from us: a process
    re-parented elsewhere (what a reused pid looks like) is not signalled."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(60)'], start_new_session=True, "
            "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    orphan = psutil.Process(int(out.stdout))
    try:
        if any(p.pid == os.getpid() for p in orphan.parents()):
            pytest.skip("this test process is a subreaper: the orphan came to us")
        report = kill_tree(orphan.pid, orphan.pid, grace=0.5)
        assert report.pids == () and orphan.is_running() and orphan.status() != psutil.STATUS_ZOMBIE
    finally:
        with contextlib.suppress(psutil.Error):
            orphan.kill()


async def _kill_an_asyncio_child(argv: list[str], grace: float) -> int | None:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None
        if argv is STUBBORN:
            await asyncio.wait_for(proc.stdout.readline(), 20)  # its SIG_IGN is in place
        loop = asyncio.get_running_loop()
        report = await loop.run_in_executor(None, lambda: kill_tree(proc.pid, proc.pid, grace=grace))
        assert report.survivors == (), report
        return await asyncio.wait_for(proc.wait(), 10)
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


@pytest.mark.parametrize(
    "argv, grace, code",
    [(SLEEPER, 5.0, -signal.SIGTERM), (STUBBORN, 0.2, -signal.SIGKILL)],
    ids=["sigterm", "sigkill"],
)
def test_kill_tree_leaves_the_trainer_to_its_own_reaper(argv, grace, code):
    """asyncio reaps the trainer; kill_tree must not waitpid it too, or proc.wait() reads
    255 ("Unknown child process").  Twenty times, each with the real signal's code."""

    async def main() -> list[int | None]:
        return [await _kill_an_asyncio_child(argv, grace) for _ in range(20)]

    assert asyncio.run(main()) == [code] * 20


def test_workers_killed_at_once_do_not_wait_for_the_grace():
    """Issue 30: a deadlocked trainer's workers hold nothing to save: SIGKILL at once, the
    grace only for the rest.  A worker that ignores SIGTERM ends well before the grace."""
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, time; subprocess.Popen({STUBBORN!r}); time.sleep(60)"],
        start_new_session=True,
    )
    try:
        root = psutil.Process(parent.pid)
        end = time.monotonic() + 20
        while not root.children() and time.monotonic() < end:
            time.sleep(0.05)
        (worker,) = root.children()
        report = kill_tree(root, parent.pid, grace=30.0, at_once=(worker,))
        assert report.survivors == () and worker.pid in report.forced and report.seconds < 15, report
        with contextlib.suppress(psutil.NoSuchProcess):
            assert worker.status() == psutil.STATUS_ZOMBIE  # dead, not yet reaped by its new parent
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
