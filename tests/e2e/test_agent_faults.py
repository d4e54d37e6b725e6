"""Faults in the agent itself (issue 13): it is killed with -9 again and again, its
file descriptors run out, its stacks directory cannot be written, its disk is full.
Each time the trainer lives on, supervision goes on, and nothing is lost in silence."""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import PYTHON, ROOT, of_type, read_journal, start_trainctl
from tests.helpers.hangs import wait_until

pytestmark = pytest.mark.e2e

COUNTER = """
import os, sys, time
n, every = int(sys.argv[1]), float(sys.argv[2])
hang_at = int(sys.argv[3]) if len(sys.argv) > 3 else 0
hold = sys.argv[0] + ".hold"
held = os.path.exists(hold)  # a test's event ends it: once the file is gone, its last batch
for i in range(1, n + 1):
    if held and not os.path.exists(hold):
        i = n
    print(f"epoch=1/1 batch={i}/{n} loss={1.0 / i:.4f}", flush=True)
    if i == hang_at and not os.environ.get('TRAINCTL_ATTEMPT') == '2':
        time.sleep(3600)
    if i == n:
        break
    time.sleep(every)
"""


def write_counter(tmp_path: Path) -> Path:
    script = tmp_path / "counter.py"
    script.write_text(COUNTER)
    return script


def trainers(script: Path) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if len(cmd) > 1 and cmd[1] == str(script):
            out.append(p)
    return out


def agent_pid(run_dir: Path) -> int | None:
    try:
        return json.loads((run_dir / "agent.json").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


BATCHES = 100_000  # never reached by the clock: the test's hold file ends the run


@pytest.mark.timeout(150)
def test_kill_9_of_the_agent_ten_times_the_run_finishes_adopted(tmp_path):
    script = write_counter(tmp_path)
    hold = Path(f"{script}.hold")  # the trainer trains until the ten kills are done, however slow
    hold.touch()
    run_dir = tmp_path / "run"
    rng = random.Random(1307)
    log = []
    first = start_trainctl(
        [
            "run",
            "--json",
            "--run-dir",
            str(run_dir),
            "--stall-timeout",
            "20",
            "--",
            PYTHON,
            str(script),
            str(BATCHES),
            "0.1",
        ]
    )
    attaches = []
    try:
        trainer = first.wait_event("start", 30).pid
        t0 = time.monotonic()
        for k in range(10):
            pid = wait_until(
                lambda: (p := agent_pid(run_dir)) and p not in [x for _, x, _ in log] and p,
                20,
                what="a live agent",
            )
            time.sleep(rng.uniform(0.3, 1.6))
            events = read_journal(run_dir)
            last = events[-1].type if events else "-"
            os.kill(pid, signal.SIGKILL)
            log.append((round(time.monotonic() - t0, 2), pid, last))
            print(f"kill {k + 1}: agent {pid} at {log[-1][0]} s (last event: {last})")
            time.sleep(0.2)
            live = trainers(script)
            assert [p.pid for p in live] == [trainer], f"after kill {k + 1}: {live}"
            # `trainctl attach` finds the run orphaned and starts an agent that adopts it.
            attaches.append(
                subprocess.Popen(
                    [PYTHON, "-m", "trainctl", "attach", "--json", str(run_dir)],
                    cwd=str(ROOT),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            )
        wait_until(  # the last attach's agent adopted it: its last batch now, supervised
            lambda: len([e for e in of_type(read_journal(run_dir), "info") if e.key == "adopt"]) == 10,
            60,
            what="the tenth adoption",
        )
        hold.unlink()
        final = attaches[-1]
        out, err = final.communicate(timeout=90)
        assert final.returncode == 0, err.decode()[-2000:]
    finally:
        for p in attaches:
            if p.poll() is None:
                p.kill()
                p.wait()
    events = read_journal(run_dir)
    states = [e.state for e in of_type(events, "state")]
    assert states[-1] == "FINISHED", states
    assert [s.pid for s in of_type(events, "start")] == [trainer], "never a second trainer"
    assert of_type(events, "exit")[-1].returncode == 0
    adopted = [e for e in of_type(events, "info") if e.key == "adopt"]
    assert len(adopted) == 10, [e.text for e in adopted]
    seqs = [e.seq for e in events]
    assert seqs == list(range(len(seqs))), "the journal goes on gapless"
    batches = [e.batch for e in of_type(events, "progress")]
    assert batches[-1] == BATCHES and batches == sorted(batches), batches
    wait_until(lambda: not trainers(script), 10, what="the trainer to end")


def _idle_clients(sock: Path, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(sock))
        except OSError:
            s.close()
            break
        out.append(s)
    return out


@pytest.mark.timeout(120)
def test_a_hang_is_caught_while_idle_clients_use_up_the_agents_descriptors(tmp_path):
    script = write_counter(tmp_path)
    run_dir = tmp_path / "run"

    def few_fds():
        resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))

    proc = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "trainctl",
            "run",
            "--json",
            "--run-dir",
            str(run_dir),
            "--stall-timeout",
            "4",
            "--max-restarts",
            "2",
            "--",
            PYTHON,
            str(script),
            "60",
            "0.1",
            "15",
        ],
        cwd=str(ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=few_fds,
        start_new_session=True,
    )
    clients: list[socket.socket] = []
    try:
        wait_until(lambda: any(e.type == "progress" for e in read_journal(run_dir)), 30, what="progress")
        clients = _idle_clients(run_dir / "agent.sock", 80)  # never say hello
        assert len(clients) == 80
        out, err = proc.communicate(timeout=90)
    finally:
        for s in clients:
            s.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    events = read_journal(run_dir)
    stall = of_type(events, "stall")
    assert stall, err.decode()[-2000:]
    last_batch = [e for e in of_type(events, "progress") if e.batch == 15][0]
    assert stall[0].ts - last_batch.ts <= 4 + 2.5, stall[0].ts - last_batch.ts
    assert proc.returncode == 0 and of_type(events, "state")[-1].state == "FINISHED"


@pytest.mark.timeout(90)
def test_recovery_happens_when_the_stacks_cannot_be_written(tmp_path):
    script = write_counter(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    (run_dir / "events.jsonl").touch(mode=0o600)  # an (empty) run of this user: reusable
    (run_dir / "stacks").write_text("not a directory")  # root ignores modes: a file blocks it
    with start_trainctl(
        [
            "run",
            "--json",
            "--run-dir",
            str(run_dir),
            "--stall-timeout",
            "3",
            "--",
            PYTHON,
            str(script),
            "40",
            "0.05",
            "10",
        ]
    ) as tc:
        r = tc.wait(60)
    assert r.returncode == 0, r.describe()
    verdict = r.of_type("stall_diagnosis")[0]
    assert verdict.stacks is None and "could not be written" in verdict.detail, verdict
    assert len(r.of_type("start")) == 2 and r.events[-1].state == "FINISHED"


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)], capture_output=True
    )
    return r.returncode == 0


@pytest.mark.timeout(90)
def test_a_full_disk_never_kills_the_trainer(tmp_path):
    disk = tmp_path / "small"
    if os.geteuid() != 0 or not _mount_tmpfs(disk, "256k"):
        pytest.skip("cannot mount a tmpfs here")
    try:
        noisy = tmp_path / "noisy.py"  # 2,000 progress lines of ~200 bytes: 400 KB > 256 KB
        noisy.write_text(
            "import time\nfor i in range(1, 2001):\n"
            "    print(f'epoch=1/1 batch={i}/2000 loss=0.5 ' + 'x' * 160, flush=True)\n"
            "    time.sleep(0.002)\n"
        )
        run_dir = disk / "run"
        with start_trainctl(
            ["run", "--json", "--run-dir", str(run_dir), "--stall-timeout", "20", "--", PYTHON, str(noisy)]
        ) as tc:
            r = tc.wait(60)
        printed = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        kinds = [e["type"] for e in printed]
        assert r.returncode == 0, r.describe()
        assert [e["returncode"] for e in printed if e["type"] == "exit"] == [0], kinds
        ids = {e.get("id") for e in printed if e["type"] == "warning"}
        assert "trainctl.log_write_failed" in ids or "trainctl.journal_failed" in ids, ids
        assert printed[-1]["type"] == "state" and printed[-1]["state"] == "FINISHED"
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_the_journal_survives_enospc(tmp_path):
    """/dev/full gives a real ENOSPC: the event is lost, the bus goes on, and the journal
    says how many were lost once it can write again."""
    from trainctl.agent.bus import EventBus
    from trainctl.core import events as E
    from trainctl.store.journal import Journal

    journal = Journal(tmp_path / "events.jsonl")
    seen: list[E.Event] = []
    bus = EventBus(journal, time.time)
    bus.sinks.append(seen.append)
    bus.emit(E.Info(1.0, "before"))
    good_fd = journal._fd
    journal._fd = os.open("/dev/full", os.O_WRONLY)
    for i in range(3):
        bus.emit(E.Info(2.0 + i, f"lost {i}"))
    os.close(journal._fd)
    journal._fd = good_fd
    bus.emit(E.Info(9.0, "after"))
    journal.close()
    from trainctl.store.journal import read_events

    kept = list(read_events(tmp_path / "events.jsonl"))
    assert [getattr(e, "text", "") for e in kept][0] == "before"
    assert any(e.type == "warning" and e.id == "trainctl.journal_gap" and "3 events" in e.text for e in kept)
    assert kept[-1].text == "after" and [e.seq for e in kept] == list(range(len(kept)))
    assert [e.text for e in seen if e.type == "info"] == ["before", "lost 0", "lost 1", "lost 2", "after"]
    assert any(e.type == "warning" and e.id == "trainctl.journal_failed" for e in seen)
    assert sys.platform.startswith("linux")


GATED = """
import os, sys, time
print("epoch=1/1 batch=1/2 loss=1.0", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
print("epoch=1/1 batch=2/2 loss=0.5", flush=True)
"""


@pytest.mark.timeout(90)
def test_a_holder_killed_as_its_trainer_exits_0_finishes_the_run_once(tmp_path):
    """The holder stopped (it cannot reap), the trainer exits 0, the holder killed: the exit
    is read from the trainer, the run FINISHED, the attempt never run again."""
    script, go = tmp_path / "gated.py", tmp_path / "go"
    script.write_text(GATED)
    with start_trainctl(["run", "--json", "--", PYTHON, "-u", str(script), str(go)]) as tc:
        tc.wait_event("progress", 60, "the first batch")
        status = json.loads((tc.run_dir / "trainer-1.json").read_text())
        trainer = psutil.Process(status["pid"])
        os.kill(status["holder_pid"], signal.SIGSTOP)
        go.touch()
        wait_until(
            lambda: not trainer.is_running() or trainer.status() == psutil.STATUS_ZOMBIE,
            20,
            what="the trainer's exit",
        )
        os.kill(status["holder_pid"], signal.SIGKILL)
        r = tc.wait(60)
    assert r.returncode == 0, r.describe()
    assert [e.attempt for e in r.of_type("start")] == [1]
    assert [e.returncode for e in r.of_type("exit")] == [0]
    assert r.events[-1].state == "FINISHED"


def helpers_of(agent: psutil.Process) -> list[psutil.Process]:
    """What the agent started for itself: its descendants outside the trainers' holders."""
    out = []
    for p in agent.children():
        try:
            if "trainctl.holder.main" not in " ".join(p.cmdline()):
                out += [p, *p.children(recursive=True)]
        except psutil.Error:
            continue
    return out


@pytest.mark.timeout(90)
def test_no_helper_outlives_an_agent_killed_with_sigkill(tmp_path):
    script = write_counter(tmp_path)
    with start_trainctl(["run", "--json", "--", PYTHON, str(script), "4000", "0.05"]) as tc:
        tc.wait_event("progress", 60, "the first batch")
        agent = psutil.Process(agent_pid(tc.run_dir))
        wait_until(
            lambda: any(p.name() == "dmesg" for p in helpers_of(agent)), 30, what="the kernel-log reader"
        )
        helpers = helpers_of(agent)
        agent.kill()
        time.sleep(2.0)
        left = [
            f"{p.pid} {p.name()}" for p in helpers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        ]
        assert left == []
        assert trainers(script)  # the trainer lives on, by design
