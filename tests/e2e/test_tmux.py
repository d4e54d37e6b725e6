"""src/trainctl/hosts/tmux.py against a real tmux server on a private socket (never the user's)."""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from trainctl.hosts import tmux as tm

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not tm.tmux_available(), reason="tmux is not installed")]


def wait_for(cond, timeout: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def server():
    t = tm.Tmux(socket=f"trainctl-test-{uuid.uuid4().hex[:10]}")
    try:
        yield t
    finally:
        t.kill_server()
        remove_socket(t.socket)


def remove_socket(name: str) -> None:
    """tmux -L leaves its socket file behind after kill-server."""
    base = Path(os.environ.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}"
    (base / name).unlink(missing_ok=True)


# A pane command that ignores SIGHUP and has a child in its process group.
STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGHUP, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "300"])
print("hello", os.environ["FOO"], os.getcwd(), "child", child.pid, flush=True)
time.sleep(300)
"""


def test_session_name_is_safe_for_tmux():
    assert tm.session_name("yolo-v8_run1") == "trainctl-yolo-v8_run1"  # kept as is
    assert re.fullmatch(r"trainctl-yolo-v8-run-1\+[0-9a-f]{8}", tm.session_name("yolo.v8:run 1"))
    assert re.fullmatch(r"trainctl-job\+[0-9a-f]{8}", tm.session_name("..."))
    assert re.fullmatch(r"trainctl-rm-rf\+[0-9a-f]{8}", tm.session_name("$(rm -rf ~)"))
    long = tm.session_name("x" * 500)
    assert long.startswith("trainctl-") and len(long) <= 60


def test_session_names_do_not_collide():
    names = [
        "a.b",
        "a-b",
        "a_b",
        "a b",
        "a-b+",
        "x" * 51 + "1",
        "x" * 51 + "2",
        "x" * 64,
        "x" * 63,
        "é",
        "e",
        "-",
        "_",
    ]
    sessions = [tm.session_name(n) for n in names]
    assert len(set(sessions)) == len(names), dict(zip(names, sessions))
    for s in sessions:  # what tmux keeps as given, and what a shell need not quote
        assert re.fullmatch(r"[A-Za-z0-9_+-]{1,60}", s), s


def test_session_command_quotes_argv_and_env():
    cmd = tm.session_command(["python", "a b", "$(x)"], {"FOO": "it's"})
    assert cmd == "exec env 'FOO=it'\"'\"'s' python 'a b' '$(x)'"
    with pytest.raises(ValueError, match="not allowed"):
        tm.session_command(["true"], {"BAD-NAME": "1"})
    with pytest.raises(ValueError):
        tm.session_command([], None)


@pytest.mark.timeout(60)
def test_start_capture_duplicate_kill(server, tmp_path):
    cwd = tmp_path / "work dir 'q'"
    cwd.mkdir()
    marker = tmp_path / "pwned"
    foo = f'it\'s $(touch {marker}) `touch {marker}` "q"'
    name = tm.session_name("job.one")
    server.start_session(name, [sys.executable, "-c", STUBBORN], cwd=str(cwd), env={"FOO": foo})
    text = wait_for(
        lambda: "child" in server.capture(name) and server.capture(name), what="the pane's output"
    )
    assert f"hello {foo} {cwd} child" in text
    assert not marker.exists()
    assert server.session_exists(name) and server.session_alive(name)
    assert not server.session_exists(name + "-other")
    assert not server.session_exists(name[:-2])  # exact names, never a prefix

    with pytest.raises(tm.SessionRunning) as err:
        server.start_session(name, ["true"], cwd=str(cwd))
    assert name in str(err.value) and "attach-session" in str(err.value)
    assert err.value.session == name

    panes = list(server.pane_pids(name))
    child = int(text.split("child")[-1].split()[0])
    server.kill_session(name, grace=0.5)  # SIGHUP is ignored: SIGKILL follows
    assert not server.session_exists(name)
    wait_for(lambda: all(gone(p) for p in [*panes, child]), 10, "the pane's processes to end")


@pytest.mark.timeout(60)
def test_finished_pane_stays_readable_and_can_restart(server, tmp_path):
    name = tm.session_name("quick")
    script = "import sys; print('done with 3'); sys.exit(3)"
    server.start_session(name, [sys.executable, "-c", script], cwd=str(tmp_path))
    wait_for(lambda: not server.session_alive(name), what="the command to end")
    assert server.session_exists(name)  # remain-on-exit keeps it
    assert "done with 3" in server.capture(name)
    server.ensure_not_running(name)  # a finished run does not block
    assert not server.session_exists(name)
    server.start_session(name, [sys.executable, "-c", "print('second')"], cwd=str(tmp_path))
    wait_for(lambda: "second" in server.capture(name), what="the second run's output")
    server.kill_session(name)
    assert not server.session_exists(name)


@pytest.mark.timeout(60)
def test_module_functions_use_the_given_socket(server, tmp_path):
    name = tm.session_name("mod")
    tm.start_session(name, ["sleep", "300"], cwd=str(tmp_path), env=None, socket=server.socket)
    assert tm.session_exists(name, socket=server.socket)
    assert not tm.session_exists(name, socket=server.socket + "-other")
    with pytest.raises(tm.SessionRunning):
        tm.ensure_not_running(name, socket=server.socket)
    assert isinstance(tm.capture(name, socket=server.socket), str)
    pid = next(iter(server.pane_pids(name)))
    tm.kill_session(name, socket=server.socket)
    assert not tm.session_exists(name, socket=server.socket)
    wait_for(lambda: gone(pid), 10, "sleep to end")


def test_capture_of_missing_session_is_a_clear_error(server):
    with pytest.raises(tm.TmuxError, match="cannot read tmux session 'trainctl-nope'"):
        server.capture("trainctl-nope")
