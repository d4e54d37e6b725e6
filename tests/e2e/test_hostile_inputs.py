"""Issue 14, points 5 and 7: every bad input a careless or hostile user gives the CLI or the
agent's socket gets exit 2 (or an error reply) in one clear line, never a traceback; names
and run directories are checked before anything is written.

Real processes: `python -m trainctl ...` subprocesses, a real agent for the socket; no
training (`-- true`, `-- sleep`). The remote case runs against the loopback sshd of
test_remote_run.py (skipped without sshd unless TRAINCTL_REQUIRE_SSHD=1).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.e2e.conftest import PYTHON, ROOT, run_trainctl, start_trainctl, wait_until
from trainctl.hosts import tmux as tm

pytestmark = pytest.mark.e2e


@pytest.fixture
def env(tmp_path):
    """Private runs, config and tmux: nothing of the user's is touched."""
    return {
        "TRAINCTL_RUNS_DIR": str(tmp_path / "runs"),
        "TRAINCTL_CONFIG_DIR": str(tmp_path / "config"),
        "TRAINCTL_TMUX_SOCKET": f"trainctl-hostile-{uuid.uuid4().hex[:8]}",
    }


def _refused(r, *words: str) -> None:
    """Exit 2 and one clear `trainctl...` line on stderr naming ``words``."""
    err = r.stderr.strip()
    assert r.returncode == 2, r.describe()
    assert "Traceback" not in r.stderr, r.stderr
    assert len(err.splitlines()) == 1 and err.startswith("trainctl"), err
    for w in words:
        assert w in err, (w, err)


def _cli(args: list[str], env: dict, timeout: float = 30, cwd: Path | None = None):
    return run_trainctl(args, timeout=timeout, env=env, cwd=cwd)


BAD_NAMES = ["..", "a/b", "-x", ".hidden", "a\x1b]0;t\x07", "x" * 65]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_run_names_are_refused_before_anything_is_written(name, env, tmp_path):
    run_dir = tmp_path / "rd"
    r = _cli(["run", "--detach", "--no-tmux", "--name", name, "--run-dir", run_dir, "--", "true"], env)
    _refused(r, "--name")
    assert not run_dir.exists() and not (tmp_path / "runs").exists()


def test_a_job_named_dotdot_is_refused_naming_the_key(env, tmp_path):
    job = tmp_path / "trainctl.toml"
    job.write_text('kind = "command"\nname = ".."\ncommand = ["true"]\n')
    r = _cli(["run", "--detach", "--no-tmux", job], env)
    _refused(r, "name", "'..'")


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_stall_timeout_must_be_finite_and_positive(value, env):
    _refused(
        _cli(["run", "--detach", "--no-tmux", "--stall-timeout", value, "--", "true"], env), "--stall-timeout"
    )


def test_run_dir_on_a_file_a_symlink_tmp_or_someone_elses(env, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    full = tmp_path / "full"
    full.mkdir(mode=0o700)
    (full / "notes.txt").write_text("mine")
    for target, why in (
        (afile, "not a directory"),
        (link, "symbolic link"),
        (Path("/tmp"), "writable by group or others"),
        (shared, "writable by group or others"),
        (full, "not empty and not a trainctl run"),
    ):
        r = _cli(["run", "--detach", "--no-tmux", "--run-dir", target, "--", "true"], env)
        _refused(r, "--run-dir", why)
    assert (shared.stat().st_mode & 0o777) == 0o777, "a directory trainctl did not make was chmodded"
    assert os.listdir(full) == ["notes.txt"] and os.stat("/tmp").st_mode & 0o1777 == 0o1777


def test_missing_or_unexecutable_commands_are_refused_before_an_agent_starts(env, tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n")  # not executable
    for cmd, words in (
        (["no-such-command-zz"], ["'no-such-command-zz'", "not found"]),
        (["./nope/train.py"], ["'./nope/train.py'", "not found"]),
        (["./train.sh"], ["'./train.sh'", "not an executable"]),
        ([""], ["empty command"]),
    ):
        rd = tmp_path / f"rd-{uuid.uuid4().hex[:6]}"
        r = _cli(["run", "--detach", "--no-tmux", "--run-dir", rd, "--", *cmd], env, cwd=tmp_path)
        _refused(r, *words)
        assert not rd.exists(), "a run directory was made for a command that cannot start"


def test_resume_arg_takes_a_value_that_looks_like_an_option(env, tmp_path):
    rd = tmp_path / "rd"
    r = _cli(
        [
            "run",
            "--json",
            "--run-dir",
            rd,
            "--resume-arg",
            "--resume",
            "--resume-arg",
            "{checkpoint}",
            "--",
            "true",
        ],
        env,
    )
    assert r.returncode == 0, r.describe()
    spec = json.loads((rd / "spec.json").read_text())
    assert spec["resume_args"] == ["--resume", "{checkpoint}"]


def test_argparse_errors_are_one_line(env):
    _refused(_cli(["run", "--bogus", "--", "true"], env), "--bogus")
    _refused(_cli(["ctl"], env), "required")


def test_scan_into_a_closed_pipe_ends_quietly(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join(f"epoch 1/2 {i} RuntimeError: CUDA out of memory {i}\n" for i in range(20000)))
    proc = subprocess.Popen(
        [PYTHON, "-m", "trainctl", "scan", str(log)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # `| head` that has read enough
    err = proc.stderr.read().decode()
    assert proc.wait(30) in (0, 141) and err == "", err


def test_editor_with_arguments_is_split_like_a_shell(env, tmp_path):
    preset = tmp_path / "P.toml"
    preset.write_text((ROOT / "src" / "trainctl" / "presets" / "A.toml").read_text())
    r = _cli(["presets", "edit", preset], {**env, "EDITOR": "true --wait", "VISUAL": ""})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.describe()
    _refused(
        _cli(["presets", "edit", preset], {**env, "EDITOR": "no-such-editor --wait", "VISUAL": ""}),
        "'no-such-editor'",
    )
    _refused(_cli(["presets", "edit", preset], {**env, "EDITOR": "'open", "VISUAL": ""}), "cannot split")


def test_detach_of_a_run_that_finishes_at_once_is_no_failure(env, tmp_path):
    servers = [None] + ([env["TRAINCTL_TMUX_SOCKET"]] if tm.tmux_available() else [])
    try:
        for i, server in enumerate(servers):
            rd = tmp_path / f"rd{i}"
            args = ["run", "--detach", "--name", f"fast{i}", "--run-dir", rd]
            # Not run_trainctl: its cleanup would kill the detached agent before it ends.
            r = subprocess.run(
                [
                    PYTHON,
                    "-m",
                    "trainctl",
                    *map(str, args),
                    *(["--no-tmux"] if server is None else []),
                    "--",
                    "true",
                ],
                cwd=ROOT,
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert r.returncode == 0 and "ended before" not in r.stderr, r.stderr
            wait_until(
                lambda rd=rd: any(
                    '"FINISHED"' in line for line in (rd / "events.jsonl").read_text().splitlines()
                ),
                20,
            )
    finally:
        if len(servers) > 1:
            tm.Tmux(servers[1]).kill_server(grace=1)


HOSTILE = "x\x1b]52;c;aGk=\x07\x1b[2J\x9b31m\x85\x0e\x1bc"


@pytest.mark.parametrize("mode", ["--json", "--headless"])
def test_trainer_text_reaches_stdout_without_controls(mode, env, tmp_path):
    r = _cli(
        [
            "run",
            mode,
            "--run-dir",
            tmp_path / "rd",
            "--",
            "sh",
            "-c",
            f"printf '%s\\n' '{HOSTILE}'; exit 0",
            HOSTILE,
        ],
        env,
    )
    assert r.returncode == 0, r.describe()
    bad = [c for c in r.stdout if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F]
    assert not bad, bad
    if mode == "--json":  # escaped, not lost
        starts = [json.loads(line) for line in r.stdout.splitlines() if '"start"' in line]
        assert starts and starts[0]["command"][-1] == HOSTILE


def test_remote_attach_hint_is_one_url_and_quoted():
    from trainctl.hosts.box import attach_hint, attach_url
    from trainctl.hosts.ssh_address import parse_attach_url

    assert attach_url("box", "/runs/a b") == "ssh://box/runs/a%20b"
    assert attach_url("ssh://me@box:2222", "/r") == "ssh://me@box:2222/r"
    assert attach_url("box", "trainctl/x/runs/r") == "ssh://box/~/trainctl/x/runs/r"
    assert parse_attach_url(attach_url("me@box", "/r/a;b$(x)")) == ("me@box", "/r/a;b$(x)")
    assert attach_hint("ssh://box/r;x") == "trainctl attach 'ssh://box/r;x'"


def test_remote_names_are_checked_before_ssh(env):
    r = _cli(["run", "--host", "no-such-host.invalid", "--name", "..", "--detach", "--", "true"], env)
    _refused(r, "--name", "'..'")


# ------------------------------------------------------------------------ the box
def test_a_job_named_dotdot_never_writes_the_boxs_home(tmp_path, monkeypatch):
    from tests.e2e.test_remote_run import Box

    if not tm.tmux_available():
        pytest.skip("tmux is not installed")
    monkeypatch.setenv("HOME", str(tmp_path))
    box = Box(tmp_path)
    try:
        env = {**box.client_env, "TRAINCTL_RUNS_DIR": str(tmp_path / "runs")}
        job = tmp_path / "trainctl.toml"
        job.write_text(
            f'kind = "command"\nname = ".."\ncommand = ["true"]\n[host]\ndestination = "{box.dest}"\n'
        )
        _refused(_cli(["run", "--detach", job], env, timeout=60), "name", "'..'")
        _refused(
            _cli(["run", "--detach", "--host", box.dest, "--name", "..", "--", "true"], env, timeout=60),
            "--name",
        )
        # A command the box does not have: refused there, before an agent starts.
        _refused(
            _cli(
                ["run", "--detach", "--host", box.dest, "--name", "ok", "--", "no-such-command-zz"],
                env,
                timeout=60,
            ),
            "'no-such-command-zz'",
            "not found on",
        )
        assert sorted(p.name for p in box.home.iterdir() if p.name != "canary") in ([], ["trainctl"])
        assert not (box.home / "trainctl.toml").exists() and not (box.home / "presets").exists()
        assert not list(box.root.glob("**/agent.json")), "an agent started"
    finally:
        box.stop()


# ------------------------------------------------------------------------ the socket
def _lines(sock: socket.socket):
    buf = b""
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield json.loads(line)
        try:
            data = sock.recv(65536)
        except ConnectionResetError:  # dropped by the agent: the end of the stream
            return
        if not data:
            return
        buf += data


def _connect(path: Path, hello: bytes) -> tuple[socket.socket, object]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(15)
    s.connect(str(path))
    s.sendall(hello)
    return s, _lines(s)


def _reply(lines, rid) -> dict:
    for msg in lines:
        if msg.get("op") == "reply" and msg.get("id") == rid:
            return msg
    raise AssertionError(f"no reply {rid}")


def test_malformed_socket_requests_get_error_replies(env, tmp_path):
    with start_trainctl(["run", "--json", "--run-dir", tmp_path / "rd", "--", "sleep", "60"], env=env) as tc:
        sock = tc.run_dir / "agent.sock"
        tc.wait_event("start", 30)
        s, lines = _connect(sock, b'{"op": "hello", "since": [1]}\n')
        try:
            hello = next(lines)
            assert hello["op"] == "hello" and hello["ok"] is True, hello
            before = hello["auto_recover"]
            s.sendall(b"[1, 2, 3]\n")  # a list: ignored
            s.sendall(b'{"op": "cmd", "id": 1, "cmd": ["status"], "args": {}}\n')
            s.sendall(b'{"op": "cmd", "id": 2, "cmd": "status", "args": [1]}\n')
            s.sendall(b'{"op": "cmd", "id": 3, "cmd": "auto_recover", "args": {"on": "false"}}\n')
            s.sendall(b"not json\n")
            s.sendall(b'{"op": "cmd", "id": 4, "cmd": "status", "args": {}}\n')
            for rid in (1, 2, 3):
                reply = _reply(lines, rid)
                assert reply["ok"] is False and reply["error"] and "\n" not in reply["error"], reply
            status = _reply(lines, 4)
            assert status["ok"] is True and status["result"]["auto_recover"] == before, status
        finally:
            s.close()
        big, big_lines = _connect(sock, b'{"op": "hello", "since": 0}\n')
        try:  # a 2 MiB request line: the connection is dropped, nothing is served
            with contextlib.suppress(OSError):
                big.sendall(
                    b'{"op": "cmd", "id": 9, "cmd": "status", "args": {"x": "' + b"a" * (2 << 20) + b'"}}\n'
                )
            assert all(m.get("id") != 9 for m in big_lines)  # to the end of the stream
        finally:
            big.close()
        s, lines = _connect(sock, b'{"op": "hello", "since": 0}\n')  # the agent goes on
        try:
            s.sendall(b'{"op": "cmd", "id": 5, "cmd": "stop", "args": {}}\n')
            assert _reply(lines, 5)["ok"] is True
        finally:
            s.close()
        r = tc.wait(30)
        assert r.returncode == 130 and "Traceback" not in r.stderr, r.describe()
