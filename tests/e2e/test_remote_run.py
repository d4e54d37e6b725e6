"""`trainctl run --host` end to end: a real PyTorch training (train_loop.py, preset A with
fallback B) run "remotely" on a loopback box reached through a real sshd on 127.0.0.1.

The box is this machine seen through `tests/helpers/sshd.py`'s sshd, with its own login
environment (what ~/.profile sets on a real box, here an sshd ForceCommand script): a
private HOME, a private tmux server (TRAINCTL_TMUX_SOCKET, TMUX_TMPDIR) and private runs
and config dirs. trainctl is pointed at it the way a user would: TRAINCTL_SSH_CONFIG (an
`ssh -F` file with the test's key and known_hosts; host keys stay checked) and
TRAINCTL_REMOTE_TRAINCTL (the venv's trainctl, as a box's `[host] trainctl` would be).
The ControlMaster lives in a private directory (XDG_RUNTIME_DIR/trainctl-ssh).

Teardown kills the agent and trainer (they run under tmux, outside this test's process
tree), the tmux server, the ssh ControlMaster and sshd, and fails when one survives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import read_journal, start_trainctl
from tests.helpers.hangs import wait_until
from tests.helpers.sshd import LocalSshd, require_sshd
from trainctl.client.connection import AgentClient
from trainctl.core.recovery import FINAL_STATES
from trainctl.hosts import tmux as tm
from trainctl.hosts.ssh_transport import SshTransport

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
TRAINCTL = Path(sys.executable).parent / "trainctl"
TRAIN_LOOP = ROOT / "tests" / "helpers" / "scripts" / "train_loop.py"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.ssh,
    pytest.mark.skipif(not tm.tmux_available(), reason="tmux is not installed"),
]


# --------------------------------------------------------------------------- the box


class BoxSshd(LocalSshd):
    """The loopback sshd, every session of which starts in the box's login environment."""

    def __init__(self, tmp_path: Path, login_script: Path) -> None:
        self.login_script = login_script
        super().__init__(tmp_path)

    def _config_text(self) -> str:
        return super()._config_text() + f"ForceCommand {self.login_script}\n"


class Box:
    """A loopback "GPU box": sshd, a login environment, and a teardown that kills all."""

    dest = LocalSshd.alias

    def __init__(self, tmp_path: Path) -> None:
        require_sshd()
        # Short paths: the agent's socket, tmux's socket and ssh's ControlPath live here.
        self.root = Path(tempfile.mkdtemp(prefix="trb-", dir="/tmp"))
        self.home = self.root / "home"  # the box user's HOME (`rm -rf ~` target)
        self.runs = self.root / "runs"
        self.tmux_tmpdir = self.root / "tmux"
        self.xdg = self.root / "xdg"  # the client's XDG_RUNTIME_DIR
        self.control_dir = self.xdg / "trainctl-ssh"
        for d in (self.home, self.runs, self.tmux_tmpdir, self.xdg):
            d.mkdir(mode=0o700)
        self.canary = self.home / "canary"
        self.canary.write_text("still here\n")
        self.tmux_socket = f"trainctl-test-box-{uuid.uuid4().hex[:10]}"
        self._hosts: list = []
        self.client_home = tmp_path / "client-home"
        self.client_home.mkdir()
        box_env = {
            "HOME": str(self.home),
            "TRAINCTL_TMUX_SOCKET": self.tmux_socket,
            "TMUX_TMPDIR": str(self.tmux_tmpdir),
            "TRAINCTL_RUNS_DIR": str(self.root / "box-runs"),
            "TRAINCTL_CONFIG_DIR": str(self.root / "box-config"),
            "TRAINCTL_CACHE_DIR": str(self.root / "box-cache"),
            "PYTHONUNBUFFERED": "1",
        }
        script = tmp_path / "box-login.sh"
        script.write_text(
            "#!/bin/sh\n# The box's login environment (a real box: ~/.profile).\n"
            + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in box_env.items())
            + 'cd "$HOME" || exit 1\n'
            + 'if [ -n "${SSH_ORIGINAL_COMMAND+x}" ]; then\n'
            + '  exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"\nfi\nexec /bin/sh\n'
        )
        script.chmod(0o755)
        try:
            self.sshd = BoxSshd(tmp_path, script)
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise
        # What the user's side of trainctl sees.
        self.client_env = {
            "TRAINCTL_SSH_CONFIG": str(self.sshd.ssh_config_path),
            "TRAINCTL_REMOTE_TRAINCTL": str(TRAINCTL),
            "XDG_RUNTIME_DIR": str(self.xdg),
            "HOME": str(self.client_home),
        }

    def host(self):
        """An SshHost for the box sharing trainctl's ControlMaster (closed by stop())."""
        from trainctl.hosts.ssh import SshHost

        host = SshHost(
            self.dest,
            ssh_config=self.sshd.ssh_config_path,
            control_dir=self.control_dir,
            remote_trainctl=[str(TRAINCTL)],
        )
        self._hosts.append(host)
        return host

    def tmux(self) -> tm.Tmux:
        """The box's private tmux server, driven locally (the box is this machine)."""
        env = {**os.environ, "TMUX_TMPDIR": str(self.tmux_tmpdir)}

        def runner(argv):
            return subprocess.run(
                list(argv),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
                env=env,
            )

        return tm.Tmux(self.tmux_socket, runner=runner)

    # ---- teardown
    def _procs(self) -> list[psutil.Process]:
        """Everything started for the box: agents and trainers (their command line or
        TRAINCTL_RUN_DIR names the box's dirs), workers, the tmux server, the ControlMaster
        and ssh clients (their ControlPath is under root), bridges on the box."""
        root, me = str(self.root), os.getpid()
        found: dict[int, psutil.Process] = {}
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if p.pid == me or p.status() == psutil.STATUS_ZOMBIE:
                    continue
                cmd = " ".join(p.cmdline())
                if (
                    root in cmd
                    or self.tmux_socket in cmd
                    or p.environ().get("TRAINCTL_RUN_DIR", "").startswith(root)
                ):
                    found[p.pid] = p
                    for c in p.children(recursive=True):
                        found[c.pid] = c
        return list(found.values())

    def kill_all(self) -> list[str]:
        """Kill everything of the box (not sshd itself); returns what survived."""
        with contextlib.suppress(Exception):
            self.tmux().kill_server(grace=0.5)  # the agent ignores SIGHUP: killed below
        spared = {os.getpgid(0)}  # never this test's own process group
        if self.sshd.proc is not None:
            spared.add(self.sshd.proc.pid)  # nor sshd's (stop() ends it)
        deadline = time.monotonic() + 10
        while True:
            procs = self._procs()
            if not procs:
                return []
            if time.monotonic() > deadline:
                return [f"{p.pid} {describe(p)}" for p in procs if p.is_running()]
            for p in procs:
                with contextlib.suppress(psutil.Error, OSError):
                    pgid = os.getpgid(p.pid)
                    if pgid not in spared:  # trainers and workers: their whole group
                        os.killpg(pgid, signal.SIGKILL)
                    p.kill()
            psutil.wait_procs(procs, timeout=3)

    def stop(self) -> None:
        left = []
        try:
            for host in self._hosts:
                with contextlib.suppress(Exception):
                    host.close()  # the ControlMaster (`ssh -O exit`)
            left = self.kill_all()
        finally:
            self.sshd.stop()  # kills sshd and its sessions (bridges on the box)
            left += self.kill_all()  # a bridge or master that came back meanwhile
            shutil.rmtree(self.root, ignore_errors=True)
        assert not left, f"processes of the box survived the teardown: {left}"


def describe(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())[:150]
    except psutil.Error:
        return "?"


@pytest.fixture
def box(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # nothing here may touch the real home
    b = Box(tmp_path)
    try:
        yield b
    finally:
        b.stop()


# --------------------------------------------------------------------------- helpers


def cli(
    args: list, env: dict[str, str], timeout: float = 90, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """`trainctl ARGS` to the end (its whole process group killed on a timeout)."""
    proc = subprocess.Popen(
        [PYTHON, "-m", "trainctl", *map(str, args)],
        cwd=str(cwd or ROOT),
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"trainctl {args} did not finish in {timeout}s:\n{out}\n{err}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def started_run_dir(r: subprocess.CompletedProcess, box: Box) -> Path:
    """The run directory `trainctl run --host --detach` says it started (and how to attach)."""
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    prefix = f"trainctl: started on {box.dest}: "
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(prefix)]
    assert len(lines) == 1, r.stdout
    run_dir = Path(lines[0][len(prefix) :])
    assert f"trainctl attach ssh://{box.dest}{run_dir}" in r.stdout, r.stdout
    return run_dir


def start_remote(box: Box, run_dir: Path | None, command: list, *extra: str, cwd: Path | None = None) -> Path:
    """`trainctl run --host BOX --detach [EXTRA] [--run-dir RUN_DIR] -- COMMAND`; the run dir."""
    where = ["--run-dir", run_dir] if run_dir is not None else []
    r = cli(["run", "--host", box.dest, "--detach", *extra, *where, "--", *command], box.client_env, cwd=cwd)
    got = started_run_dir(r, box)
    assert run_dir is None or got == run_dir
    return got


def train_loop(*args: str) -> list[str]:
    return [PYTHON, str(TRAIN_LOOP), *args]


def json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            d = json.loads(line)
            if isinstance(d, dict) and "type" in d:
                out.append(d)
    return out


def wait_json(tc, pred, timeout: float, what: str) -> dict:
    """The first JSON event on `tc`'s stdout matching `pred`."""
    deadline = time.monotonic() + timeout
    while True:
        for d in json_lines(tc.stdout):
            if pred(d):
                return d
        if tc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(
                f"no {what} within {timeout}s (rc={tc.poll()}):\n"
                f"stderr: {tc.stderr[-2000:]}\nstdout: {tc.stdout[-3000:]}"
            )
        time.sleep(0.1)


def wait_journal(run_dir: Path, pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        for ev in read_journal(run_dir):
            if pred(ev):
                return ev
        if time.monotonic() > deadline:
            kinds = [e.type for e in read_journal(run_dir)]
            log = (
                (run_dir / "train.log").read_text(errors="replace")[-2000:]
                if (run_dir / "train.log").exists()
                else "(no train.log)"
            )
            raise AssertionError(f"no {what} in {run_dir} within {timeout}s: {kinds[-40:]}\n{log}")
        time.sleep(0.1)


def assert_contiguous(seqs: list[int], what: str) -> None:
    assert seqs == list(range(len(seqs))), (
        f"{what}: seq numbers not 0..N contiguous (gap or duplicate): {seqs}"
    )


def assert_finished_cleanly(events: list[dict]) -> None:
    exits = [e for e in events if e["type"] == "exit"]
    states = [e for e in events if e["type"] == "state"]
    assert exits and exits[-1]["returncode"] == 0, exits
    assert states and states[-1]["state"] == "FINISHED", states[-3:]
    assert events[-1]["type"] == "state" and events[-1]["state"] == "FINISHED", events[-3:]


async def command_over_ssh(host, run_dir: Path, name: str, **args) -> tuple[dict, dict]:
    """(hello, reply) of one agent command through `ssh box trainctl bridge RUN_DIR`."""
    transport = SshTransport(host, str(run_dir))
    client = AgentClient(transport)
    try:
        hello = await asyncio.wait_for(client.connect(since=10**9), 30)
        return hello, await client.command(name, timeout=30, **args)
    finally:
        await client.close()
        await transport.close()


async def reattach_until_finished(host, run_dir: Path, timeout: float) -> tuple[dict, list[dict]]:
    """Connect with since=0 over ssh and collect every journal event until the run ends."""
    from trainctl.core import events as E

    transport = SshTransport(host, str(run_dir))
    client = AgentClient(transport)
    got: list[dict] = []
    try:
        hello = await asyncio.wait_for(client.connect(since=0), 30)

        async def collect():
            async for ev in client.events():
                if ev.seq is None:
                    continue
                got.append(E.to_dict(ev))
                if isinstance(ev, E.State) and ev.state in FINAL_STATES:
                    return

        await asyncio.wait_for(collect(), timeout)
        return hello, got
    finally:
        await client.close()
        await transport.close()


# --------------------------------------------------------------------------- tests


@pytest.mark.timeout(120)
def test_remote_run_streams_events_and_falls_back_over_ssh(box, tmp_path):
    run_dir = box.runs / "fallback"
    start_remote(
        box,
        run_dir,
        train_loop("--epochs", "2", "--batches", "120", "--batch-time", "0.03"),
        "--preset",
        "A",
        "--fallback",
        "B",
    )
    # The agent runs on the box, in tmux (private server), in the run directory asked for.
    assert box.tmux().session_alive("trainctl-train_loop")
    assert (run_dir / "agent.sock").exists()

    att = start_trainctl(["attach", f"ssh://{box.dest}{run_dir}", "--json"], env=box.client_env)
    start1 = wait_json(att, lambda d: d["type"] == "start", 60, "start of attempt 1")
    assert (start1["attempt"], start1["preset"]) == (1, "A")
    assert start1["command"] == train_loop("--epochs", "2", "--batches", "120", "--batch-time", "0.03")
    wait_json(att, lambda d: d["type"] == "progress", 60, "progress of attempt 1")

    # The fallback, from here, through the ssh transport to the agent on the box.
    hello, reply = asyncio.run(command_over_ssh(box.host(), run_dir, "fallback"))
    assert (hello["preset"], hello["fallback"], hello["state"]) == ("A", "B", "RUNNING")
    assert reply["ok"], reply
    assert reply["result"] == {"restart": "now", "preset": "B"}

    restart = wait_json(att, lambda d: d["type"] == "restart", 30, "restart event")
    assert (restart["attempt"], restart["preset"]) == (2, "B"), restart
    start2 = wait_json(att, lambda d: d["type"] == "start" and d["attempt"] == 2, 30, "start of attempt 2")
    assert start2["preset"] == "B" and start2["seq"] > restart["seq"]
    wait_json(
        att, lambda d: d["type"] == "progress" and d["seq"] > start2["seq"], 60, "progress of attempt 2"
    )
    log = (run_dir / "train.log").read_text()
    assert "attempt=2 workers=0" in log and "TRAINCTL_PRESET=B" in log  # B reached the trainer

    result = att.wait(90)
    assert result.returncode == 0, result.describe()
    events = json_lines(result.stdout)
    assert_contiguous([e["seq"] for e in events], "attach --json")
    assert_finished_cleanly(events)
    assert [(e["attempt"], e["preset"]) for e in events if e["type"] == "start"] == [(1, "A"), (2, "B")]
    assert len([e for e in events if e["type"] == "restart"]) == 1
    last = [e for e in events if e["type"] == "progress"][-1]
    assert (last["epoch"], last["batch"]) == (2, 120)
    journal = read_journal(run_dir)  # what the client saw is the box's journal
    assert [e.seq for e in journal] == [e["seq"] for e in events]

    # Later, with the agent gone, a reattach still shows the whole run and ends.
    wait_until(lambda: not (run_dir / "agent.sock").exists(), 30, what="the agent to exit")
    later = cli(["attach", f"ssh://{box.dest}{run_dir}", "--json"], box.client_env, timeout=60)
    assert later.returncode == 0, later.stderr
    assert [e["seq"] for e in json_lines(later.stdout)] == [e.seq for e in journal]
    # Its report, made on the box (`trainctl report --stdout` there), written here.
    out = tmp_path / "fallback.html"
    rep = cli(["report", f"ssh://{box.dest}{run_dir}", "-o", str(out)], box.client_env, timeout=90)
    assert rep.returncode == 0 and rep.stdout.strip() == str(out), rep.stderr
    page = out.read_text()
    assert page.count("<svg") >= 3 and "FINISHED" in page and "goodput " in page


@pytest.mark.timeout(120)
def test_ssh_loss_mid_run_leaves_the_training_alone_and_reattach_has_it_all(box):
    run_dir = box.runs / "lossy"
    start_remote(
        box,
        run_dir,
        train_loop("--epochs", "2", "--batches", "150", "--batch-time", "0.03"),
        "--preset",
        "A",
        "--fallback",
        "B",
    )
    att = start_trainctl(["attach", f"ssh://{box.dest}{run_dir}", "--json"], env=box.client_env)
    first = wait_json(att, lambda d: d["type"] == "progress", 60, "progress")

    # The connection dies: the follower's ssh client and the shared ControlMaster.
    master = box.host().master_pid()
    assert master is not None
    ssh_clients = [p for p in att.tree() if p.name() == "ssh"]
    assert ssh_clients, "attach runs no ssh client"
    victims = [psutil.Process(master), *ssh_clients]
    for p in victims:
        with contextlib.suppress(psutil.NoSuchProcess):  # a client may go with its master
            p.kill()
    psutil.wait_procs(victims, timeout=5)
    n_at_kill = len(read_journal(run_dir))
    assert box.host().master_pid() is None  # the shared connection is gone

    # The training goes on on the box: its journal grows, nothing restarts.
    wait_journal(
        run_dir,
        lambda e: (
            e.type == "progress"
            and e.seq > n_at_kill
            and (e.epoch, e.batch) > (first["epoch"], first["batch"])
        ),
        30,
        "progress after the ssh kill",
    )

    # A fresh client over a new connection, from seq 0: the whole history, then live.
    hello, events = asyncio.run(reattach_until_finished(box.host(), run_dir, 90))
    assert hello["run_dir"] == str(run_dir)
    assert_contiguous([e["seq"] for e in events], "reattach since=0")
    assert_finished_cleanly(events)
    assert not [e for e in events if e["type"] in ("restart", "stall")], [
        e for e in events if e["type"] in ("restart", "stall")
    ]
    assert [(e["attempt"], e["preset"]) for e in events if e["type"] == "start"] == [(1, "A")]
    assert [e["state"] for e in events if e["type"] == "state"] == ["RUNNING", "FINISHED"]
    last = [e for e in events if e["type"] == "progress"][-1]
    assert (last["epoch"], last["batch"]) == (2, 150)
    assert [e.seq for e in read_journal(run_dir)] == [e["seq"] for e in events]

    # The follower whose ssh was killed reconnected and caught up: no gap, no duplicate.
    result = att.wait(60)
    assert result.returncode == 0, result.describe()
    assert "connection to the agent lost" in result.stderr and "reconnected" in result.stderr, result.stderr
    followed = json_lines(result.stdout)
    assert [e["seq"] for e in followed] == [e["seq"] for e in events]
    assert followed == events


ARGV_ENV = """\
import json, os, sys
print("ARGV_ENV " + json.dumps({"argv": sys.argv[1:], "env": os.environ.get("HOSTILE")}), flush=True)
"""


def toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


@pytest.mark.timeout(90)
def test_hostile_preset_values_reach_the_remote_trainer_literally(box, tmp_path):
    marker = Path("/tmp") / f"pwned-{uuid.uuid4().hex}"
    hostile = [
        f"$(touch {marker})",
        "; rm -rf ~",
        f"`touch {marker}`",
        "it's \"quoted\" 'twice'",
        "line1\nline2; rm -rf ~",
        "$HOME ${PATH} \\ *",
        "--",
    ]
    env_value = f"$(touch {marker}); rm -rf ~ 'single' \"double\"\nsecond line `touch {marker}`"
    # The hostile preset is a file elsewhere (`--preset PATH`); the fallback a name from the
    # presets dir next to where trainctl runs: both must travel to the box and be found there.
    preset = tmp_path / "elsewhere" / "hostile.toml"
    preset.parent.mkdir()
    preset.write_text(
        'description = "hostile values"\n'
        f"args = [{', '.join(toml_str(a) for a in hostile)}]\n"
        f"[env]\nHOSTILE = {toml_str(env_value)}\n"
    )
    work = tmp_path / "work"
    (work / "presets").mkdir(parents=True)
    (work / "presets" / "calm.toml").write_text('description = "calm"\n[env]\nHOSTILE = "calm"\n')
    script = box.root / "argv_env.py"
    script.write_text(ARGV_ENV)
    first_arg = f"cmd arg $(touch {marker}) ; rm -rf ~"
    try:
        run_dir = start_remote(
            box, None, [PYTHON, script, first_arg], "--preset", str(preset), "--fallback", "calm", cwd=work
        )
        # The default run directory is named as a local run's: after the script.
        assert run_dir.parent == box.home / "trainctl" / "argv_env" / "runs", run_dir
        assert run_dir.name.startswith("argv_env-"), run_dir
        wait_journal(
            run_dir, lambda e: e.type == "state" and e.state in FINAL_STATES, 60, "the end of the run"
        )
        events = read_journal(run_dir)
        assert [e.state for e in events if e.type == "state"][-1] == "FINISHED"
        assert [(e.attempt, e.preset) for e in events if e.type == "start"] == [(1, "hostile")]
        assert [e.returncode for e in events if e.type == "exit"] == [0]
        lines = [ln for ln in (run_dir / "train.log").read_text().splitlines() if ln.startswith("ARGV_ENV ")]
        assert len(lines) == 1, (run_dir / "train.log").read_text()
        seen = json.loads(lines[0][len("ARGV_ENV ") :])
        assert seen["argv"] == [first_arg, *hostile]
        assert seen["env"] == env_value
        # The presets arrived byte for byte, and nothing ran.
        assert (run_dir / "presets" / "hostile.toml").read_bytes() == preset.read_bytes()
        assert (run_dir / "presets" / "calm.toml").read_bytes() == (
            work / "presets" / "calm.toml"
        ).read_bytes()
        assert not marker.exists()
        assert box.canary.read_text() == "still here\n"
    finally:
        marker.unlink(missing_ok=True)


@pytest.mark.timeout(90)
def test_job_file_with_a_host_runs_on_the_box(box, tmp_path):
    """`trainctl run trainctl.toml` whose [host] names the box (default run dir, a `~/`
    workdir): the job and its presets travel, the run starts there and finishes."""
    script = box.root / "argv_env.py"
    script.write_text(ARGV_ENV)
    job_dir = tmp_path / "job"
    (job_dir / "presets").mkdir(parents=True)
    (job_dir / "presets" / "calm.toml").write_text(
        'description = "calm"\n[env]\nHOSTILE = "from the job\'s preset"\n'
    )
    (job_dir / "trainctl.toml").write_text(
        'kind = "command"\nname = "boxjob"\n'
        f'command = [{toml_str(PYTHON)}, {toml_str(str(script))}, "a b"]\n'
        'preset = "calm"\n\n[host]\n'
        f'destination = "{box.dest}"\nworkdir = "~/jobs"\n'
    )
    run_dir = started_run_dir(cli(["run", job_dir / "trainctl.toml", "--detach"], box.client_env), box)
    assert run_dir.parent == box.home / "jobs" / "boxjob" / "runs" and run_dir.name.startswith("boxjob-")
    wait_journal(run_dir, lambda e: e.type == "state" and e.state in FINAL_STATES, 60, "the end of the run")
    events = read_journal(run_dir)
    assert [(e.attempt, e.preset) for e in events if e.type == "start"] == [(1, "calm")]
    assert [e.state for e in events if e.type == "state"][-1] == "FINISHED"
    seen = [
        json.loads(ln[len("ARGV_ENV ") :])
        for ln in (run_dir / "train.log").read_text().splitlines()
        if ln.startswith("ARGV_ENV ")
    ]
    assert seen == [{"argv": ["a b"], "env": "from the job's preset"}]


@pytest.mark.timeout(150)
async def test_dashboard_over_ssh_edits_the_remote_preset_and_falls_back(box):
    """The TUI itself, attached from here over ssh: the preset editor reads and writes the
    box's preset, and the fallback key restarts the remote trainer under B."""
    from tests.tui.tui_helpers import (
        edit_workers_and_save,
        screen_text,
        shown,
        wait_for,
    )
    from trainctl.tui.app import TrainctlApp
    from trainctl.tui.screens.confirm import ConfirmScreen

    run_dir = box.runs / "tui"
    await asyncio.to_thread(
        start_remote,
        box,
        run_dir,
        train_loop("--epochs", "2", "--batches", "200", "--batch-time", "0.03"),
        "--preset",
        "A",
        "--fallback",
        "B",
    )
    host = box.host()
    app = TrainctlApp(lambda: AgentClient(SshTransport(host, str(run_dir))))
    async with app.run_test(size=(160, 48)) as pilot:
        model = app.dashboard.model
        await wait_for(pilot, lambda: model.progress is not None, 60, "progress over ssh")
        await wait_for(pilot, lambda: "RUNNING" in screen_text(app), 10, "RUNNING on screen")
        assert (model.preset, model.attempt) == ("A", 1)

        # The editor opens the running preset as the box has it, and saves it there.
        editor = await edit_workers_and_save(pilot, "ctrl+s", "2", "1")
        assert str(run_dir / "presets" / "A.toml") in screen_text(app)  # the box's file
        await pilot.press("y")
        preset_a = run_dir / "presets" / "A.toml"
        await wait_for(pilot, lambda: "workers = 1" in preset_a.read_text(), 30, "A.toml written")
        assert "# " in preset_a.read_text()  # its comments kept
        await wait_for(pilot, lambda: not editor.dirty, 10, "editor clean")
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is not editor, 10, "editor closed")

        # Fall back: confirm, and the box's agent restarts the trainer under B.
        await pilot.press("f")
        await shown(pilot, ConfirmScreen)
        await pilot.press("y")
        await wait_for(pilot, lambda: model.attempt == 2 and model.preset == "B", 60, "attempt 2 on B")
        await wait_for(pilot, lambda: model.state == "FINISHED", 90, "the run to finish")
        text = screen_text(app)
        assert "FINISHED" in text, text
    events = read_journal(run_dir)
    assert [(e.attempt, e.preset) for e in events if e.type == "start"] == [(1, "A"), (2, "B")]
    assert [e.preset for e in events if e.type == "restart"] == ["B"]
    assert "attempt=2 workers=0" in (run_dir / "train.log").read_text()
