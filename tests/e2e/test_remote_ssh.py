"""src/trainctl/hosts/ssh.py against a real sshd on a loopback port (tests/helpers/sshd.py).

The pure parts (quoting, URLs, error texts) run everywhere; the rest needs OpenSSH and
is skipped without it (a failure when TRAINCTL_REQUIRE_SSHD=1, as in CI).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import stat
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.helpers.sshd import LocalSshd, free_port, make_key
from trainctl import __version__
from trainctl.hosts import tmux as tm
from trainctl.hosts.ssh import RemoteError, SshHost, classify_ssh_error, quote_argv
from trainctl.hosts.ssh_address import parse_attach_url
from trainctl.hosts.ssh_transport import SshTransport

ARGV_JSON = "import sys, json; print(json.dumps(sys.argv[1:]))"


def remove_socket(name: str) -> None:
    """tmux -L leaves its socket file behind after kill-server."""
    base = Path(os.environ.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}"
    (base / name).unlink(missing_ok=True)


def hostile_values(marker: Path, canary: Path) -> list[str]:
    m = str(marker)
    return [
        f"$(touch {m})",
        f"`touch {m}`",
        f"; touch {m}",
        f"&& touch {m} &",
        f"| touch {m}",
        f"> {m}",
        f"; rm -rf {canary}",
        f"'; touch {m}; '",
        f'"; touch {m}; "',
        f"line1\nline2; touch {m}",
        "a'b",
        'a"b',
        'it\'s "x" $HOME ${PATH}',
        "\\",
        "\\'",
        "*",
        "~",
        "",
        "-n",
        "--",
        " leading and trailing ",
        "tab\there",
        "cr\rhere",
        "héllo ✓ 日本",
        "!!",
        "#not a comment",
        "%C %h",
        "{a,b}",
        "\x01\x1b[31m",
    ]


# --------------------------------------------------------------------------- pure parts


def test_quote_argv_round_trips_hostile_values(tmp_path):
    values = hostile_values(tmp_path / "m", tmp_path / "c")
    assert shlex.split(quote_argv(["prog", *values])) == ["prog", *values]
    with pytest.raises(ValueError, match="NUL"):
        quote_argv(["a\0b"])
    with pytest.raises(ValueError):
        quote_argv([])


@pytest.mark.parametrize(
    "url, expected",
    [
        ("ssh://box", ("box", None)),
        ("ssh://box/", ("box", None)),
        ("ssh://me@box/data/runs/x", ("me@box", "/data/runs/x")),
        ("ssh://me@box:2222/~/runs/x", ("ssh://me@box:2222", "runs/x")),
        ("ssh://box/~", ("box", ".")),
        ("ssh://[::1]:22/r", ("ssh://[::1]:22", "/r")),
        ("ssh://box/run%20dir", ("box", "/run dir")),
    ],
)
def test_parse_attach_url(url, expected):
    assert parse_attach_url(url) == expected


@pytest.mark.parametrize(
    "url, message",
    [
        ("http://box/x", "not an ssh:// URL"),
        ("ssh://", "no host"),
        ("ssh://box:99999/x", "port must be a number"),
        ("ssh://box:abc", "port must be a number"),
        ("ssh://-oProxyCommand=x/r", "bad SSH destination"),
        ("ssh://box/x?y=1", "not allowed"),
    ],
)
def test_parse_attach_url_rejects(url, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_attach_url(url)
    assert url in str(err.value)


def test_host_argv_maps_url_port_and_ends_options(tmp_path):
    host = SshHost("ssh://me@box:2222", control_dir=tmp_path / "cm")
    assert (host.destination, host.port) == ("me@box", 2222)
    argv = host.ssh_argv(["echo", "a b"])
    assert argv[argv.index("-p") + 1] == "2222"
    assert argv[-3:] == ["--", "me@box", "echo 'a b'"]
    assert "BatchMode=yes" in argv and "StrictHostKeyChecking=no" not in " ".join(argv)
    with pytest.raises(ValueError, match="bad SSH destination"):
        SshHost("-oProxyCommand=touch /tmp/x")


@pytest.mark.parametrize(
    "stderr, kind",
    [
        ("ssh: Could not resolve hostname nosuch.invalid: Name or service not known", "unreachable"),
        ("ssh: connect to host 10.255.255.1 port 22: Connection timed out", "unreachable"),
        ("ssh: connect to host 192.168.9.9 port 22: No route to host", "unreachable"),
        (
            "No ED25519 host key is known for box and you have requested strict checking.\n"
            "Host key verification failed.",
            "host_key",
        ),
        ("user@box: Permission denied (publickey,password).", "auth"),
        ("/x/config: line 3: Bad configuration option: frobnicate", "config"),
        ("bash: line 1: foo: command not found", None),
    ],
)
def test_classify_ssh_error(stderr, kind):
    err = classify_ssh_error(stderr, "box")
    assert (err.kind if err else None) == kind
    if err:
        assert "box" in str(err)


def test_control_dir_too_long_is_refused(tmp_path):
    host = SshHost("box", control_dir=tmp_path / ("d" * 80))
    with pytest.raises(RemoteError, match="too long") as err:
        host.connect()
    assert err.value.kind == "config"


# --------------------------------------------------------------------------- real sshd


@pytest.fixture
def sshd(tmp_path):
    server = LocalSshd(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def fake_trainctl(tmp_path: Path, version: str) -> Path:
    """A stand-in for `trainctl --version` printing `version`."""
    path = tmp_path / f"fake-trainctl-{version}"
    path.write_text(f"#!/bin/sh\necho 'trainctl {version}'\n")
    path.chmod(0o755)
    return path


def login_count_stays(sshd: LocalSshd, n: int) -> None:
    time.sleep(0.2)  # let sshd flush its log
    assert sshd.accepted_logins() == n, sshd.log()


@pytest.mark.e2e
@pytest.mark.ssh
@pytest.mark.timeout(60)
def test_check_passes_and_commands_share_one_connection(sshd, tmp_path):
    host = sshd.make_host(remote_trainctl=[str(fake_trainctl(tmp_path, __version__))])
    host.check()
    times = []
    for _ in range(4):
        t0 = time.monotonic()
        assert host.run(["true"]).returncode == 0
        times.append(time.monotonic() - t0)
    print("command times over the shared connection:", [f"{t:.3f}" for t in times])
    pid = host.master_pid()
    assert pid is not None and psutil.pid_exists(pid)
    login_count_stays(sshd, 1)  # check + 4 commands: one login
    r = host.run(["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (r.returncode, r.stdout, r.stderr) == (7, "out\n", "err\n")
    host.close()
    assert host.master_pid() is None
    assert host.run(["true"]).returncode == 0  # reconnects
    login_count_stays(sshd, 2)


@pytest.mark.e2e
@pytest.mark.ssh
@pytest.mark.timeout(60)
def test_check_with_the_installed_trainctl(sshd):
    trainctl = Path(sys.executable).parent / "trainctl"
    host = sshd.make_host(remote_trainctl=[str(trainctl)])
    assert host.remote_version() == __version__
    host.check()


@pytest.mark.e2e
@pytest.mark.ssh
@pytest.mark.timeout(60)
def test_hostile_arguments_arrive_literally(sshd, tmp_path):
    marker = Path("/tmp") / f"pwned-{uuid.uuid4().hex}"
    canary = tmp_path / "canary"
    canary.mkdir()
    values = hostile_values(marker, canary)
    host = sshd.make_host()
    try:
        r = host.run([sys.executable, "-c", ARGV_JSON, *values])
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == values
        assert not marker.exists()
        assert canary.is_dir()
    finally:
        marker.unlink(missing_ok=True)


@pytest.mark.e2e
@pytest.mark.ssh
@pytest.mark.timeout(60)
def test_master_gone_falls_back_to_a_direct_connection(sshd):
    host = sshd.make_host()
    assert host.run(["true"]).returncode == 0
    pid = host.master_pid()
    psutil.Process(pid).kill()
    psutil.wait_procs([psutil.Process(pid)] if psutil.pid_exists(pid) else [], timeout=5)
    assert host.run(["echo", "still"]).stdout == "still\n"
    login_count_stays(sshd, 2)


@pytest.mark.e2e
@pytest.mark.ssh
@pytest.mark.timeout(60)
def test_url_port_is_used(sshd, tmp_path):
    # The config's Port is a closed one: only `-p` from the URL can reach the server.
    cfg = sshd.write_client_config(tmp_path / "cfg", alias="127.0.0.1", port=free_port())
    host = sshd.make_host(ssh_config=cfg, alias=f"ssh://{sshd.user}@127.0.0.1:{sshd.port}")
    assert host.run(["echo", "via url"]).stdout == "via url\n"


@pytest.mark.e2e
@pytest.mark.ssh
@pytest.mark.timeout(60)
def test_unreachable_host(sshd, tmp_path):
    cfg = sshd.write_client_config(tmp_path / "cfg", port=free_port())
    host = sshd.make_host(ssh_config=cfg)
    with pytest.raises(RemoteError) as err:
        host.check()
    assert err.value.kind == "unreachable"
    assert "Cannot reach trainbox" in str(err.value) and "Connection refused" in str(err.value)


@pytest.mark.e2e
@pytest.mark.ssh
@pytest.mark.timeout(60)
def test_wrong_key_is_permission_denied(sshd, tmp_path):
    other = make_key(tmp_path / "other_key")
    host = sshd.make_host(ssh_config=sshd.write_client_config(tmp_path / "cfg", identity=other))
    with pytest.raises(RemoteError) as err:
        host.check()
    assert err.value.kind == "auth"
    assert "Permission denied (publickey)" in str(err.value)
    assert "authorized_keys" in str(err.value)
    login_count_stays(sshd, 0)


@pytest.mark.e2e
@pytest.mark.ssh
@pytest.mark.timeout(60)
def test_unknown_host_key_never_connects(sshd, tmp_path):
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    host = sshd.make_host(ssh_config=sshd.write_client_config(tmp_path / "cfg", known_hosts=empty))
    marker = tmp_path / "ran"
    with pytest.raises(RemoteError) as err:
        host.run(["touch", str(marker)])
    assert err.value.kind == "host_key"
    assert "known_hosts" in str(err.value) and "never turns host key checking off" in str(err.value)
    assert not marker.exists() and host.master_pid() is None
    assert empty.read_text() == ""  # nothing was added behind the user's back
    login_count_stays(sshd, 0)


@pytest.mark.e2e
@pytest.mark.ssh
@pytest.mark.timeout(60)
def test_changed_host_key_is_reported(sshd, tmp_path):
    impostor = make_key(tmp_path / "impostor")
    kind, key = Path(f"{impostor}.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {kind} {key}\n")
    host = sshd.make_host(ssh_config=sshd.write_client_config(tmp_path / "cfg", known_hosts=known))
    with pytest.raises(RemoteError) as err:
        host.check()
    assert err.value.kind == "host_key_changed" and "CHANGED" in str(err.value)
    login_count_stays(sshd, 0)


@pytest.mark.e2e
@pytest.mark.ssh
@pytest.mark.timeout(60)
def test_missing_trainctl_says_what_to_install(sshd):
    host = sshd.make_host(remote_trainctl=["/nonexistent/bin/trainctl"])
    with pytest.raises(RemoteError) as err:
        host.check()
    assert err.value.kind == "missing_trainctl"
    assert f"pip install trainctl=={__version__}" in str(err.value)
    assert '[host] trainctl = "' in str(err.value)


@pytest.mark.e2e
@pytest.mark.ssh
@pytest.mark.timeout(60)
def test_version_mismatch(sshd, tmp_path):
    host = sshd.make_host(remote_trainctl=[str(fake_trainctl(tmp_path, "0.0.1"))])
    with pytest.raises(RemoteError) as err:
        host.check()
    assert err.value.kind == "version"
    assert "0.0.1" in str(err.value) and __version__ in str(err.value)


@pytest.mark.e2e
@pytest.mark.ssh
@pytest.mark.timeout(60)
def test_missing_tmux(sshd, tmp_path):
    host = sshd.make_host(
        remote_trainctl=[str(fake_trainctl(tmp_path, __version__))], remote_tmux=["/nonexistent/tmux"]
    )
    with pytest.raises(RemoteError) as err:
        host.check()
    assert err.value.kind == "missing_tmux" and "apt-get install tmux" in str(err.value)
    host.check(require_tmux=False)


@pytest.mark.e2e
@pytest.mark.ssh
@pytest.mark.timeout(60)
def test_send_text_and_bytes_arrive_byte_for_byte(sshd, tmp_path):
    host = sshd.make_host()
    marker = tmp_path / "pwned"
    text = f"line1\n$(touch {marker})\n`touch {marker}`\n'\"\\ \r\n\ttab ✓\x01no newline at the end"
    target = tmp_path / "new dir 'q' $(x)" / "f;ile name"
    host.send_text(text, str(target))
    assert target.read_bytes() == text.encode()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    assert not marker.exists()
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temp left

    blob = bytes(range(256)) * 100
    host.send_bytes(blob, str(target), mode=0o640)  # replaces it
    assert target.read_bytes() == blob
    assert stat.S_IMODE(target.stat().st_mode) == 0o640

    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o755)
    host.send_file(script, str(tmp_path / "copy" / "job.sh"))
    copy = tmp_path / "copy" / "job.sh"
    assert copy.read_bytes() == script.read_bytes()
    assert stat.S_IMODE(copy.stat().st_mode) == 0o700


@pytest.mark.e2e
@pytest.mark.ssh
@pytest.mark.timeout(60)
def test_tmux_on_the_box_through_ssh(sshd, tmp_path):
    if not tm.tmux_available():
        pytest.skip("tmux is not installed")
    host = sshd.make_host()
    remote = host.tmux(socket=f"trainctl-test-{uuid.uuid4().hex[:10]}")
    try:
        name = tm.session_name("remote job")
        remote.start_session(
            name,
            [sys.executable, "-c", "print('on the box', flush=True); import time; time.sleep(300)"],
            cwd=str(tmp_path),
            env={"X": "$(y)"},
        )
        deadline = time.monotonic() + 15
        while "on the box" not in remote.capture(name):
            assert time.monotonic() < deadline, remote.capture(name)
            time.sleep(0.1)
        with pytest.raises(tm.SessionRunning, match=re.escape(name)):
            remote.ensure_not_running(name)
        pid = next(iter(remote.pane_pids(name)))
        remote.kill_session(name)
        assert not remote.session_exists(name)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    finally:
        remote.kill_server()
        remove_socket(remote.socket)


# --------------------------------------------------------------------------- transport

RELAY = """
import json, sys
print(json.dumps({"argv": sys.argv[1:]}), flush=True)
for line in sys.stdin:
    sys.stdout.write("echo:" + line)
    sys.stdout.flush()
"""


def relay_processes(sshd: LocalSshd) -> list[psutil.Process]:
    out = []
    for p in sshd.session_processes():
        try:
            if "bridge" in p.cmdline():
                out.append(p)
        except psutil.Error:
            pass
    return out


@pytest.mark.e2e
@pytest.mark.ssh
@pytest.mark.timeout(60)
async def test_transport_relays_lines_both_ways(sshd):
    host = sshd.make_host(remote_trainctl=[sys.executable, "-c", RELAY])
    run_dir = "/tmp/run dir/$(touch x)"
    transport = SshTransport(host, run_dir)
    reader, writer = await transport.open()
    try:
        first = json.loads(await asyncio.wait_for(reader.readline(), 20))
        assert first == {"argv": ["bridge", run_dir]}
        for i in range(3):
            msg = json.dumps({"op": "cmd", "id": i, "text": "ünïcode 'q' $(x)"})
            writer.write(msg.encode() + b"\n")
            await writer.drain()
            assert await asyncio.wait_for(reader.readline(), 10) == f"echo:{msg}\n".encode()
        big = "x" * 300_000  # longer than asyncio's default 64 KiB line
        writer.write(big.encode() + b"\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.readline(), 10) == f"echo:{big}\n".encode()
    finally:
        writer.close()
        await writer.wait_closed()
        await transport.close()
    assert await asyncio.wait_for(reader.read(), 10) == b""


@pytest.mark.e2e
@pytest.mark.ssh
@pytest.mark.timeout(60)
async def test_killing_ssh_mid_stream_gives_eof_and_ends_the_remote_side(sshd):
    host = sshd.make_host(remote_trainctl=[sys.executable, "-c", RELAY])
    transport = SshTransport(host, "/r")
    reader, writer = await transport.open()
    try:
        await asyncio.wait_for(reader.readline(), 20)
        assert len(relay_processes(sshd)) == 1
        transport.proc.kill()  # the local ssh dies (laptop closed, ^C)
        assert await asyncio.wait_for(reader.read(), 15) == b""
        deadline = time.monotonic() + 15
        while relay_processes(sshd):  # the remote bridge does not linger
            assert time.monotonic() < deadline, "remote relay still running"
            await asyncio.sleep(0.1)
    finally:
        await transport.close()


@pytest.mark.e2e
@pytest.mark.ssh
@pytest.mark.timeout(60)
async def test_connection_drop_gives_eof(sshd):
    host = sshd.make_host(remote_trainctl=[sys.executable, "-c", RELAY])
    transport = SshTransport(host, "/r")
    reader, _ = await transport.open()
    try:
        await asyncio.wait_for(reader.readline(), 20)
        sshd.drop_connections()  # the server side goes away
        assert await asyncio.wait_for(reader.read(), 15) == b""
        await asyncio.wait_for(transport.proc.wait(), 15)
        assert transport.proc.returncode != 0
    finally:
        await transport.close()


@pytest.mark.e2e
@pytest.mark.ssh
@pytest.mark.timeout(60)
async def test_transport_open_reports_ssh_failure(sshd, tmp_path):
    other = make_key(tmp_path / "other_key")
    host = sshd.make_host(ssh_config=sshd.write_client_config(tmp_path / "cfg", identity=other))
    with pytest.raises(RemoteError) as err:
        await SshTransport(host, "/r").open()
    assert err.value.kind == "auth"
