"""The caller's environment over a FIFO (src/trainctl/hosts/env_handover.py): any bytes
survive, garbage or nothing is refused in one line, a writer with no reader gives up."""

from __future__ import annotations

import os
import threading
import time

import pytest

from trainctl.hosts import env_handover as H


def test_any_bytes_survive_the_trip(tmp_path):
    env = {b"CUDA_VISIBLE_DEVICES": b"1", b"ODD": b"a b\n\xff=c", b"EMPTY": b""}
    fifo = H.make_fifo(tmp_path)
    writer = threading.Thread(target=H.send, args=(fifo, env, lambda: False, 10))
    writer.start()
    got = H.receive(fifo, timeout=10)
    writer.join()
    assert got == env
    assert not fifo.exists()


def test_garbage_through_the_fifo_is_refused(tmp_path):
    fifo = H.make_fifo(tmp_path)

    def write() -> None:
        fd = -1
        while fd < 0:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                time.sleep(0.01)
        os.write(fd, b"PATH=/evil\0")
        os.close(fd)

    t = threading.Thread(target=write)
    t.start()
    with pytest.raises(H.HandoverError, match="not an environment"):
        H.receive(fifo, timeout=10)
    t.join()


def test_a_regular_file_is_no_fifo(tmp_path):
    (tmp_path / "env.fifo").write_bytes(H.encode({b"A": b"1"}))
    with pytest.raises(H.HandoverError, match="not a FIFO"):
        H.receive(tmp_path / "env.fifo", timeout=1)


def test_no_writer_and_no_reader_end_in_time(tmp_path):
    fifo = H.make_fifo(tmp_path)
    with pytest.raises(H.HandoverError, match="within"):
        H.receive(fifo, timeout=0.3)
    fifo = H.make_fifo(tmp_path)
    with pytest.raises(H.HandoverError, match="within"):
        H.send(fifo, {b"A": b"1"}, lambda: False, timeout=0.3)
    with pytest.raises(H.HandoverError, match="ended"):
        H.send(fifo, {b"A": b"1"}, lambda: True, timeout=5)


def test_the_agent_keeps_its_own_tmux_variables(monkeypatch):
    monkeypatch.setenv("TMUX_PANE", "%3")
    monkeypatch.setenv("TRAINCTL_TMUX_SESSION", "trainctl-x")
    monkeypatch.setenv("FROM_TMUX_SERVER", "1")
    saved = dict(os.environb)
    try:
        H.take({b"PATH": saved.get(b"PATH", b"/bin"), b"CUDA_VISIBLE_DEVICES": b"2"})
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"
        assert os.environ["TMUX_PANE"] == "%3" and os.environ["TRAINCTL_TMUX_SESSION"] == "trainctl-x"
        assert "FROM_TMUX_SERVER" not in os.environ
    finally:
        os.environb.clear()
        os.environb.update(saved)


def test_the_writer_waits_for_the_agent_without_polling_it(tmp_path):
    """send() blocks in the kernel until the agent opens the FIFO: whether the agent ended (a
    tmux query, a process each time) is asked once per GONE_CHECK_S, not at every retry."""
    env = {b"A": b"1"}
    fifo = H.make_fifo(tmp_path)
    asked = []

    def gone() -> bool:
        asked.append(time.monotonic())
        return False

    writer = threading.Thread(target=H.send, args=(fifo, env, gone, 10))
    writer.start()
    time.sleep(3 * H.GONE_CHECK_S)  # the agent is slow to start
    assert H.receive(fifo, timeout=10) == env
    writer.join(10)
    assert not writer.is_alive()
    assert 1 <= len(asked) <= 4  # polled every 20 ms it was ~75 calls


def test_an_agent_that_ended_unblocks_the_waiting_writer(tmp_path):
    fifo = H.make_fifo(tmp_path)
    t0 = time.monotonic()
    with pytest.raises(H.HandoverError, match="ended"):
        H.send(fifo, {b"A": b"1"}, lambda: True, timeout=30)
    assert time.monotonic() - t0 < 10  # not the 30 s timeout: the blocked open was ended
    assert not any(t.name == "env-handover" for t in threading.enumerate())  # its open returned
