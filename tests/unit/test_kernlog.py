"""KernelLogFollower with real processes standing in for dmesg / journalctl."""

from __future__ import annotations

import sys
import threading
import time

import psutil
import pytest

from trainctl.core.signatures import WarningMatcher
from trainctl.system.kernlog import DEFAULT_COMMANDS, KernelLogCommand, KernelLogFollower

pytestmark = pytest.mark.timeout(30)

PY = sys.executable
KERNEL_LINES = [
    "[ 2679.300365] [drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx_0.0.0 timeout, signaled seq=502589, emitted seq=502591",
    "[ 2679.300601] amdgpu 0000:0c:00.0: amdgpu: GPU reset begin!",
    "[Wed Jul 31 23:14:18 2024] NVRM: Xid (PCI:0000:00:05): 43, pid=1045242, name=pt_main_thread, Ch 00000008",
]


def printer(lines: list[str], then: str = "time.sleep(60)") -> list[str]:
    """A follower stand-in: prints ``lines`` (flushed), then sleeps (like dmesg -w)."""
    body = "".join(f"print({line!r}, flush=True)\n" for line in lines)
    return [PY, "-c", f"import time\n{body}{then}\n"]


class Collector:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.infos: list[str] = []
        self.changed = threading.Condition()

    def on_line(self, line: str) -> None:
        with self.changed:
            self.lines.append(line)
            self.changed.notify_all()

    def on_info(self, text: str) -> None:
        with self.changed:
            self.infos.append(text)
            self.changed.notify_all()

    def wait(self, predicate, timeout: float = 15.0) -> None:
        with self.changed:
            assert self.changed.wait_for(predicate, timeout), (self.lines, self.infos)


@pytest.fixture
def follow():
    """Start followers; stop every one at the end, whatever happened."""
    started: list[KernelLogFollower] = []

    def make(candidates, **kw) -> tuple[KernelLogFollower, Collector]:
        c = Collector()
        f = KernelLogFollower(c.on_line, c.on_info, candidates, **kw)
        started.append(f)
        f.start()
        return f, c

    try:
        yield make
    finally:
        for f in started:
            f.stop()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_real_lines_reach_on_line_and_the_matcher(follow):
    f, c = follow([printer(KERNEL_LINES)])
    c.wait(lambda: len(c.lines) == 3)
    assert c.lines == KERNEL_LINES and c.infos == []
    assert f.command is not None and f.command[0] == PY
    m = WarningMatcher()
    ids = [m.feed(line, 1.0, source="kernel").id for line in c.lines]
    assert ids == ["kernel.amdgpu.ring_timeout", "kernel.amdgpu.gpu_reset", "kernel.nvidia.xid.43"]


def test_stop_kills_the_follower_and_its_children(follow):
    # the stand-in starts a child of its own, like a wrapper script would
    script = printer(
        ["ready"],
        then="import subprocess; subprocess.Popen(['sleep', '60']); "
        "print('child', flush=True); time.sleep(60)",
    )
    f, c = follow([script])
    c.wait(lambda: c.lines[-1:] == ["child"])
    pid = f.pid
    assert pid is not None
    family = [pid] + [p.pid for p in psutil.Process(pid).children(recursive=True)]
    assert len(family) == 2
    f.stop()
    # a SIGKILL is delivered asynchronously: on a loaded machine a member may still run a moment
    deadline = time.monotonic() + 10
    while not all(gone(p) for p in family) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(gone(p) for p in family)
    assert f.pid is None and c.infos == []


def test_unreadable_kernel_log_gives_one_info_and_stops(follow):
    denied = [
        PY,
        "-c",
        "import sys; sys.stderr.write('dmesg: read kernel buffer failed: "
        "Operation not permitted\\n'); sys.exit(1)",
    ]
    f, c = follow([denied, ["trainctl-no-such-dmesg", "-w"], denied])
    c.wait(lambda: c.infos)
    assert f.wait(5)
    assert len(c.infos) == 1 and c.lines == []
    info = c.infos[0]
    assert info.startswith(
        "kernel log not readable: dmesg: read kernel buffer failed: Operation not permitted"
    )
    assert "trainctl-no-such-dmesg: not installed" in info
    assert info.count("Operation not permitted") == 1  # the same reason once
    assert info.endswith("amdgpu/Xid lines will not be seen")


def test_falls_back_to_the_next_command(follow):
    unknown = [
        PY,
        "-c",
        "import sys; sys.stderr.write(\"dmesg: unrecognized option '--follow-new'\\n\"); sys.exit(1)",
    ]
    f, c = follow([unknown, printer(KERNEL_LINES[:1])])
    c.wait(lambda: c.lines)
    assert c.lines == KERNEL_LINES[:1] and c.infos == []


def test_a_follower_that_runs_but_cannot_see_the_log_is_dropped(follow):
    silent = [
        PY,
        "-c",
        "import sys, time; sys.stderr.write('Hint: You are currently not seeing messages "
        "from other users and the system.\\n'); sys.stderr.flush(); time.sleep(60)",
    ]
    f, c = follow([silent], probe_s=0.3)
    c.wait(lambda: c.infos)
    assert "not seeing messages" in c.infos[0] and c.lines == []


def test_backlog_is_skipped(follow):
    backlog = ["[    1.000000] old line one", "[    2.000000] old line two"]
    snapshot = printer(backlog, then="")
    follower = printer(backlog + KERNEL_LINES[:2])
    f, c = follow([KernelLogCommand(tuple(follower), snapshot=tuple(snapshot))])
    c.wait(lambda: len(c.lines) == 2)
    time.sleep(0.2)
    assert c.lines == KERNEL_LINES[:2]


def test_empty_snapshot_means_unreadable_when_output_is_needed(follow):
    empty = printer([], then="")
    f, c = follow([KernelLogCommand(tuple(printer(KERNEL_LINES)), snapshot=tuple(empty), needs_output=True)])
    c.wait(lambda: c.infos)
    assert "no kernel messages readable" in c.infos[0] and c.lines == []


def test_the_default_commands_start_and_stop_cleanly(follow):
    """On this machine dmesg may or may not be readable: either way, nothing is left behind."""
    f, c = follow(None)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and f.pid is None and not c.infos:
        time.sleep(0.05)
    pid = f.pid
    assert pid is not None or c.infos, "neither following nor reporting"
    if pid is not None:
        assert f.command in {cmd.argv for cmd in DEFAULT_COMMANDS}
    f.stop()
    assert pid is None or gone(pid)
