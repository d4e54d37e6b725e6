"""The holder (src/trainctl/holder/main.py) and the agent's side of it (src/trainctl/holder/handle.py), with real
processes: the trainer's output, returncode, its survival of the agent's death, what is
left of its tree, a full disk, and the file tails. Every test kills what it started."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tests.helpers import kernel_keeps_exit_status
from trainctl.holder.handle import FileTail, HeldTrainer, JsonLinesTail, read_status

NEEDS_PIDFD_EXIT = pytest.mark.skipif(
    not kernel_keeps_exit_status(), reason="a reaped process's exit through its pidfd needs Linux 6.15+"
)

pytestmark = pytest.mark.e2e
PY = sys.executable


def py(code: str, *args: str) -> list[str]:
    return [PY, "-u", "-c", textwrap.dedent(code), *args]


@pytest.fixture
def track():
    """track(pid, ...): SIGKILLed at the end with their descendants, if still the same."""
    seen: list[psutil.Process] = []

    def add(*pids: int) -> None:
        for pid in pids:
            try:
                seen.append(psutil.Process(pid))
            except psutil.Error:
                pass

    yield add
    for p in seen:
        try:
            if p.is_running():  # is_running compares the create time too
                for q in [*p.children(recursive=True), p]:
                    q.kill()
        except psutil.Error:
            pass


async def until(pred, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def gone(pid: int, start: float) -> bool:
    try:
        p = psutil.Process(pid)
        return p.create_time() != start or p.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


# ---------------------------------------------------------------- output and returncode
@pytest.mark.parametrize("tail, expected", [("", 0), ("sys.exit(3)", 3), ("os.kill(os.getpid(), 9)", -9)])
async def test_lines_in_order_and_the_returncode(tmp_path, track, tail, expected):
    code = f"""
        import os, sys
        for i in range(200):
            print(f"line {{i}}", flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        {tail}
        """
    t0 = time.monotonic()
    ht = await HeldTrainer.start(py(code), None, tmp_path, tmp_path, 1)
    print(f"\nHeldTrainer.start -> trainer pid known: {1000 * (time.monotonic() - t0):.0f} ms")
    track(ht.holder_pid, ht.pid)
    assert ht.pid != ht.holder_pid
    assert await asyncio.wait_for(ht.wait(), 30) == expected
    lines = (tmp_path / "train.log").read_text().splitlines()
    assert lines == [f"line {i}" for i in range(200)] + ["to stderr"]
    st = ht.status()
    assert st["returncode"] == expected and st["pid"] == ht.pid and st["ended"] >= st["started"]
    assert st["log_bytes"] == (tmp_path / "train.log").stat().st_size
    assert st["dropped_lines"] == 0 and st["last_line"] is None
    assert os.stat(ht.status_path).st_size == 4096
    assert not ht.alive() and HeldTrainer.adopt(tmp_path, 1) is None


async def test_a_command_that_does_not_exist_is_an_oserror(tmp_path, track):
    with pytest.raises(OSError, match="no-such-trainer"):
        await HeldTrainer.start([str(tmp_path / "no-such-trainer")], None, None, tmp_path, 1)
    st = read_status(tmp_path / "trainer-1.json")
    assert st["returncode"] == 127 and "No such file" in st["spawn_error"]
    assert gone(st["holder_pid"], st["holder_start"])


async def test_sigterm_to_the_holder_reaches_the_trainer(tmp_path, track):
    ht = await HeldTrainer.start(
        py("import time; print('up', flush=True); time.sleep(60)"), None, None, tmp_path, 1
    )
    track(ht.holder_pid, ht.pid)
    await until(lambda: (tmp_path / "train.log").exists(), 10, "the first line")
    os.kill(ht.holder_pid, signal.SIGTERM)
    assert await asyncio.wait_for(ht.wait(), 15) == -signal.SIGTERM


async def test_the_lock_fd_stays_with_the_holder_not_the_trainer(tmp_path, track):
    lock = tmp_path / "job.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        ht = await HeldTrainer.start(py("import time; time.sleep(60)"), None, None, tmp_path, 1, lock_fd=fd)
    finally:
        os.close(fd)  # the holder's copy keeps the lock now
    track(ht.holder_pid, ht.pid)

    def holds(pid: int) -> bool:
        return any(f.path == str(lock) for f in psutil.Process(pid).open_files())

    assert holds(ht.holder_pid) and not holds(ht.pid)
    probe = os.open(lock, os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.kill(ht.pid, signal.SIGKILL)
        assert await asyncio.wait_for(ht.wait(), 15) == -9
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with the holder
    finally:
        os.close(probe)


# ---------------------------------------------------------------- the exit, from the trainer
@NEEDS_PIDFD_EXIT
@pytest.mark.parametrize("code", [0, 3])
async def test_a_holder_killed_as_its_trainer_exits_leaves_the_exit_readable(tmp_path, track, code):
    """The holder stopped, the trainer exits (a zombie its holder never reaps), the holder
    killed: the exit is read from the trainer (its pidfd), never taken for a lost holder."""
    go = tmp_path / "go"
    trainer = py(f"""
        import os, sys, time
        while not os.path.exists({str(go)!r}):
            time.sleep(0.02)
        sys.exit({code})
        """)
    ht = await HeldTrainer.start(trainer, None, None, tmp_path, 1)
    track(ht.holder_pid, ht.pid)
    os.kill(ht.holder_pid, signal.SIGSTOP)  # it cannot reap the trainer now
    go.touch()
    await until(lambda: gone(ht.pid, psutil.Process(ht.pid).create_time()), 10, "the trainer's exit")
    os.kill(ht.holder_pid, signal.SIGKILL)
    assert await asyncio.wait_for(ht.wait(), 30) == code
    st = read_status(tmp_path / "trainer-1.json")
    assert st is not None and st["returncode"] == code and st["exit_from"] == "trainer"


@NEEDS_PIDFD_EXIT
def test_the_exit_status_of_a_zombie_and_of_a_reaped_process():
    from trainctl.holder.exit_status import exit_code, open_pidfd

    proc = subprocess.Popen([PY, "-c", "import os; os._exit(5)"])
    start = psutil.Process(proc.pid).create_time()
    fd = open_pidfd(proc.pid, start)
    assert fd is not None
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert exit_code(fd, proc.pid, start) == 5  # a zombie: /proc/PID/stat
        assert proc.wait(5) == 5
        assert exit_code(fd, proc.pid, start) == 5  # reaped: what the kernel kept
    finally:
        os.close(fd)
    assert open_pidfd(proc.pid, start) is None  # gone: nothing to pin


# ---------------------------------------------------------------- the trainer outlives its agent
AGENT = """
import asyncio, json, sys
from trainctl.holder.handle import HeldTrainer
async def main():
    ht = await HeldTrainer.start(json.loads(sys.argv[2]), None, None, sys.argv[1], 1)
    print(json.dumps([ht.holder_pid, ht.pid]), flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


async def test_the_trainer_outlives_the_holders_parent_and_is_adopted(tmp_path, track):
    trainer = py("""
        import time
        for i in range(40):
            print(f"tick {i}", flush=True)
            time.sleep(0.05)
        """)
    agent = subprocess.Popen(  # noqa: ASYNC220 - the agent must start before the loop awaits it; a test, no other task waits
        [PY, "-c", AGENT, str(tmp_path), json.dumps(trainer)], stdout=subprocess.PIPE, text=True
    )
    try:
        track(agent.pid)
        holder_pid, pid = json.loads(agent.stdout.readline())
        track(holder_pid, pid)
        log = tmp_path / "train.log"
        await until(lambda: log.exists() and log.stat().st_size > 0, 10, "the first tick")
        agent.kill()
        agent.wait(10)
        ht = HeldTrainer.adopt(tmp_path, 1)
        assert ht is not None and (ht.pid, ht.holder_pid) == (pid, holder_pid) and ht.alive()
        size = log.stat().st_size
        assert await asyncio.wait_for(ht.wait(), 30) == 0
    finally:
        agent.kill()
        agent.wait(10)
        agent.stdout.close()
    assert log.stat().st_size > size  # it went on printing after the agent died
    assert log.read_text().splitlines() == [f"tick {i}" for i in range(40)]
    assert ht.status()["returncode"] == 0 and not ht.alive()


async def test_a_double_forked_daemon_is_not_left_behind(tmp_path, track):
    pidfile = tmp_path / "daemon.pid"
    code = """
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork():
                os._exit(0)
            with open(sys.argv[1] + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(sys.argv[1] + ".tmp", sys.argv[1])
            time.sleep(0.5)
            print("daemon still here", flush=True)   # on the pipe, after the trainer's exit
            time.sleep(1000)
            os._exit(0)
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.01)
        print("trainer done", flush=True)
        """
    ht = await HeldTrainer.start(py(code, str(pidfile)), None, None, tmp_path, 1)
    track(ht.holder_pid, ht.pid)
    await until(pidfile.exists, 10, "the daemon")
    daemon = int(pidfile.read_text())
    start = psutil.Process(daemon).create_time()
    track(daemon)
    assert psutil.Process(daemon).ppid() != ht.pid
    assert await asyncio.wait_for(ht.wait(), 30) == 0
    assert gone(daemon, start)
    assert (tmp_path / "train.log").read_text().splitlines() == ["trainer done", "daemon still here"]


# ---------------------------------------------------------------- a full disk
TEN_THOUSAND = """
    for i in range(10000):
        print(f"line {i}", flush=True)
    """


async def test_dev_full_drops_lines_and_the_trainer_runs_to_its_end(tmp_path, track):
    ht = await HeldTrainer.start(py(TEN_THOUSAND), None, None, tmp_path, 1, log="/dev/full")
    track(ht.holder_pid, ht.pid)
    assert await asyncio.wait_for(ht.wait(), 60) == 0
    st = ht.status()
    assert st["dropped_lines"] == 10000 and st["log_bytes"] == 0
    assert st["dropped_bytes"] == sum(len(f"line {i}\n") for i in range(10000))
    assert st["last_line"] == "line 9999"


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


async def test_a_full_tmpfs_drops_lines_then_writes_again_once_there_is_room(tmp_path, tiny_tmpfs, track):
    run_dir, go = tiny_tmpfs, tmp_path / "go"
    filler = run_dir / "filler"
    filler.write_bytes(b"\0" * (200 << 10))
    code = """
        import os, sys, time
        for i in range(3000):
            print(f"line {i:05d} " + "x" * 50, flush=True)
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.02)
        for i in range(100):
            print(f"after {i}", flush=True)
        """
    ht = await HeldTrainer.start(py(code, str(go)), None, None, run_dir, 1)
    track(ht.holder_pid, ht.pid)
    first = 3000 * 62
    # The status file is rewritten in place on the full disk.
    await until(
        lambda: ht.status()["log_bytes"] + ht.status()["dropped_bytes"] == first, 20, "the first part counted"
    )
    st = ht.status()
    assert st["dropped_lines"] > 0 and st["last_line"] == "line 02999 " + "x" * 50
    filler.unlink()
    go.touch()
    assert await asyncio.wait_for(ht.wait(), 30) == 0
    st = ht.status()
    log = (run_dir / "train.log").read_bytes()
    assert st["last_line"] is None and st["log_bytes"] == len(log)
    assert st["log_bytes"] + st["dropped_bytes"] == first + sum(len(f"after {i}\n") for i in range(100))
    assert log.endswith(b"".join(f"after {i}\n".encode() for i in range(100)))


# ---------------------------------------------------------------- tails
async def test_file_tail_follows_another_process_promptly(tmp_path):
    path = tmp_path / "out.log"
    writer = await asyncio.create_subprocess_exec(
        *py(
            """
        import sys, time
        time.sleep(0.3)   # the file does not exist yet when the tail starts
        with open(sys.argv[1], "ab", buffering=0) as f:
            for i in range(15):
                f.write(f"{time.time()!r}\\n".encode())
                time.sleep(0.1)
        """,
            str(path),
        )
    )
    done = asyncio.Event()

    async def wait_writer():
        await writer.wait()
        done.set()

    waiter = asyncio.create_task(wait_writer())
    tail = FileTail(path).until_eof_after(done)
    latencies, buf = [], b""
    try:
        async for chunk in tail:
            now = time.time()
            *lines, buf = (buf + chunk).split(b"\n")
            latencies += [now - float(x) for x in lines]
    finally:
        writer.kill() if writer.returncode is None else None
        await waiter
    print(
        f"\nFileTail latency: median {1000 * statistics.median(latencies):.0f} ms, "
        f"max {1000 * max(latencies):.0f} ms"
    )
    assert len(latencies) == 15 and buf == b"" and tail.offset == path.stat().st_size
    assert statistics.median(latencies) < 0.3


async def test_json_lines_tail_keeps_a_partial_line_until_it_ends(tmp_path):
    path = tmp_path / "events.jsonl"
    done = asyncio.Event()
    tail = JsonLinesTail(path, max_line=200, poll_s=0.02).until_eof_after(done)
    got: list[dict] = []

    async def read():
        async for obj in tail:
            got.append(obj)

    reader = asyncio.create_task(read())
    with open(path, "ab", buffering=0) as f:  # noqa: ASYNC230 - a tiny local write in a test
        f.write(b'{"a": 1}\n{"b"')
        await until(lambda: got == [{"a": 1}], 5, "the first object")
        assert tail.offset == len(b'{"a": 1}\n')
        await asyncio.sleep(0.1)
        f.write(b": 2}\nnot json\n" + b"x" * 300 + b'\n{"c": 3}\n{"d"')
    done.set()
    await asyncio.wait_for(reader, 5)
    assert got == [{"a": 1}, {"b": 2}, {"c": 3}]
    assert tail.bad_lines == 2  # "not json" and the over-long line
    assert tail.offset == path.stat().st_size - len(b'{"d"')  # the partial one is not read


async def test_json_lines_tail_starts_over_on_a_truncated_file(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n{"partial')
    done = asyncio.Event()
    tail = JsonLinesTail(path, poll_s=0.02).until_eof_after(done)
    got: list[dict] = []

    async def read():
        async for obj in tail:
            got.append(obj)

    reader = asyncio.create_task(read())
    await until(lambda: len(got) == 2, 5, "the first two")
    path.write_bytes(b'{"c": 3}\n')  # truncated, then shorter than before
    await until(lambda: len(got) == 3, 5, "the one after the truncation")
    done.set()
    await asyncio.wait_for(reader, 5)
    assert got == [{"a": 1}, {"b": 2}, {"c": 3}] and tail.offset == path.stat().st_size


async def test_file_tail_close_stops_it(tmp_path):
    tail = FileTail(tmp_path / "never")

    async def read():
        return [c async for c in tail]

    reader = asyncio.create_task(read())
    await asyncio.sleep(0.2)
    tail.close()
    assert await asyncio.wait_for(reader, 2) == []


async def test_file_tail_reads_a_deleted_file_on_and_a_copy_of_it_from_where_it_was(tmp_path):
    """Issue 27 (the run directory deleted): the tail reads on through its descriptor what
    the writer goes on writing to the deleted file, then the holder's copy (copy_out) from
    where it was: nothing lost, nothing read twice; another file is read from its start."""
    from trainctl.holder.main import copy_out

    path = tmp_path / "train.log"
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    done = asyncio.Event()
    tail = FileTail(path, poll_s=0.02).until_eof_after(done)
    got = bytearray()

    async def read():
        async for chunk in tail:
            got.extend(chunk)

    reader = asyncio.create_task(read())
    os.write(fd, b"one\n")
    await until(lambda: got == b"one\n", 5, "the first line")
    path.unlink()
    os.write(fd, b"two\n")  # into the deleted file
    await until(lambda: got == b"one\ntwo\n", 5, "a line written to the deleted file")
    new = copy_out(fd, str(path))
    os.close(fd)
    os.write(new, b"three\n")
    await until(lambda: got == b"one\ntwo\nthree\n", 5, "a line written to the copy")
    os.close(new)
    path.unlink()
    path.write_bytes(b"other\n")  # not a copy: read from its start
    await until(lambda: got.endswith(b"three\nother\n"), 5, "another file")
    done.set()
    await asyncio.wait_for(reader, 5)
    assert bytes(got) == b"one\ntwo\nthree\nother\n"
