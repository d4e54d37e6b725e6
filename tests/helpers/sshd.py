"""A real OpenSSH server on a loopback port, with keys made for the test.

    server = LocalSshd(tmp_path)      # skips the test when sshd is missing (fails in CI)
    host = server.make_host()         # an SshHost for the `trainbox` alias
    ...
    server.stop()                     # kills sshd, its sessions, and closes the hosts

Nothing outside `tmp_path` (and a short private ControlPath dir in /tmp) is touched: the
client config sets its own identity, known_hosts (holding the test's host key; host key
checking stays on) and BatchMode; the server reads its authorized_keys from `tmp_path`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest

SSHD = "/usr/sbin/sshd"


def require_sshd() -> None:
    """Skip when sshd is missing, unless TRAINCTL_REQUIRE_SSHD=1 (CI) makes that a failure."""
    if os.path.exists(SSHD) and shutil.which("ssh") and shutil.which("ssh-keygen"):
        return
    reason = (
        "OpenSSH server/client not installed (run .ci/install-sshd.sh, or "
        "`apt-get install openssh-server openssh-client`)"
    )
    if os.environ.get("TRAINCTL_REQUIRE_SSHD") == "1":
        pytest.fail(reason + " and TRAINCTL_REQUIRE_SSHD=1", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_key(path: Path) -> Path:
    """An ed25519 key pair without passphrase at `path` / `path`.pub."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "trainctl-test", "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return path


def _kill_all(procs: list[psutil.Process], timeout: float = 3.0) -> None:
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=timeout)


class LocalSshd:
    """sshd on 127.0.0.1:<free port> accepting one ed25519 key for the current user."""

    alias = "trainbox"

    def __init__(self, tmp_path: Path, *, start_timeout: float = 15.0) -> None:
        require_sshd()
        self.dir = Path(tmp_path) / "sshd"
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.host_key = make_key(self.dir / "ssh_host_ed25519_key")
        self.user_key = make_key(self.dir / "id_ed25519")
        self.authorized_keys = self.dir / "authorized_keys"
        self.authorized_keys.write_text(Path(f"{self.user_key}.pub").read_text())
        os.chmod(self.authorized_keys, 0o600)
        self.known_hosts = self.dir / "known_hosts"
        self.log_path = self.dir / "sshd.log"
        # ControlPath sockets must stay short: pytest's tmp_path can be too long.
        self.control_dir = Path(tempfile.mkdtemp(prefix="tcm-", dir="/tmp"))
        self.proc: subprocess.Popen | None = None
        self._hosts: list = []
        self._log = None
        try:
            self._start(start_timeout)
            host_pub = Path(f"{self.host_key}.pub").read_text().split()
            self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {host_pub[0]} {host_pub[1]}\n")
            self.ssh_config_path = self.write_client_config(self.dir / "ssh_config")
        except BaseException:
            self.stop()
            raise

    # ---- server
    def _config_text(self) -> str:
        return "\n".join(
            [
                f"Port {self.port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {self.host_key}",
                f"PidFile {self.dir / 'sshd.pid'}",
                f"AuthorizedKeysFile {self.authorized_keys}",
                "AuthenticationMethods publickey",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                f"AllowUsers {self.user}",
                "StrictModes no",
                "UsePAM no",
                "PermitUserEnvironment no",
                "PermitUserRC no",
                "X11Forwarding no",
                "AllowTcpForwarding no",
                "AllowAgentForwarding no",
                "PermitTunnel no",
                "PrintMotd no",
                "PrintLastLog no",
                "UseDNS no",
                "MaxSessions 32",
                "LogLevel VERBOSE",
                "",
            ]
        )

    def _start(self, timeout: float) -> None:
        if os.getuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privsep dir
        for _ in range(3):  # a free port can be taken in between
            self.port = free_port()
            self.config_path = self.dir / "sshd_config"
            self.config_path.write_text(self._config_text())
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - sshd logs to it until stop() closes it
            self.proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=self._log,
                start_new_session=True,
            )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if "Server listening on" in self.log():
                    return
                if self.proc.poll() is not None:
                    break
                time.sleep(0.02)
            if self.proc.poll() is None:
                raise RuntimeError(f"sshd did not listen within {timeout} s:\n{self.log()}")
            if "Address already in use" not in self.log():
                raise RuntimeError(f"sshd exited with {self.proc.returncode}:\n{self.log()}")
        raise RuntimeError(f"sshd found no free port:\n{self.log()}")

    def log(self) -> str:
        """Everything sshd logged so far (LogLevel VERBOSE)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def accepted_logins(self) -> int:
        """How many connections authenticated (one per ssh connection, not per command)."""
        return self.log().count("Accepted publickey")

    def session_processes(self) -> list[psutil.Process]:
        """The per-connection sshd processes and everything they started."""
        if self.proc is None:
            return []
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return []

    def drop_connections(self) -> None:
        """Kill every live connection server-side (a network drop), keep listening."""
        _kill_all(self.session_processes())

    def stop(self) -> None:
        """Close the hosts made here, kill sshd and every session process, clean up."""
        for host in self._hosts:
            try:
                host.close()
            except Exception:  # noqa: BLE001 - teardown must reach sshd and the sessions
                pass
        self._hosts.clear()
        if self.proc is not None:
            procs = self.session_processes()
            try:
                procs.insert(0, psutil.Process(self.proc.pid))
            except psutil.Error:
                pass
            _kill_all(procs)
            self.proc.wait(timeout=5)
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        shutil.rmtree(self.control_dir, ignore_errors=True)

    def __enter__(self) -> LocalSshd:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- client
    def write_client_config(
        self,
        path: Path,
        *,
        alias: str | None = None,
        port: int | None = None,
        identity: Path | None = None,
        known_hosts: Path | None = None,
    ) -> Path:
        """A client ssh_config for `alias` (defaults: this server, its key, its host key)."""
        text = "\n".join(
            [
                f"Host {alias or self.alias}",
                "  HostName 127.0.0.1",
                f"  Port {port or self.port}",
                f"  User {self.user}",
                f"  IdentityFile {identity or self.user_key}",
                "  IdentitiesOnly yes",
                "  IdentityAgent none",
                f"  UserKnownHostsFile {known_hosts or self.known_hosts}",
                "  GlobalKnownHostsFile /dev/null",
                "  StrictHostKeyChecking yes",
                "  BatchMode yes",
                "  ConnectTimeout 10",
                "",
            ]
        )
        path.write_text(text)
        os.chmod(path, 0o600)
        return path

    def make_host(self, *, ssh_config: Path | None = None, alias: str | None = None, **kw):
        """An SshHost for this server, closed again by stop()."""
        from trainctl.hosts.ssh import SshHost

        host = SshHost(
            alias or self.alias,
            ssh_config=ssh_config or self.ssh_config_path,
            control_dir=self.control_dir,
            **kw,
        )
        self._hosts.append(host)
        return host
