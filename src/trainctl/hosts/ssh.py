"""Reaching a GPU box with the user's own OpenSSH client.

Every remote command is an argv, quoted once for the remote (POSIX) login shell with
`quote_argv` (from src/trainctl/hosts/shell.py, which tmux uses too). One multiplexed connection per
host (ControlMaster, a private 0700 control directory, ControlPersist): later commands skip
the TCP, key exchange and login (they still pay the remote login shell's start-up).
Host keys are always checked against the user's known_hosts: trainctl never turns that off.
A client reaches an agent on the box through src/trainctl/hosts/ssh_transport.py; the
destinations and `ssh://` URLs are read in hosts/ssh_address.py.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from trainctl import __version__
from trainctl.hosts.shell import quote_argv
from trainctl.hosts.ssh_address import _parse_destination, _remote_path
from trainctl.hosts.tmux import Tmux

CONTROL_PERSIST_S = 600
_SOCKET_PATH_MAX = 104  # sun_path is 104 bytes on macOS/BSD, 108 on Linux
_CONTROL_NAME_LEN = 41 + 17  # "/%C" expands to 40 hex digits; ssh adds ".XXXXXXXXXXXXXXXX"


class RemoteError(Exception):
    """An SSH or remote-box problem, with a message that says what to do about it.

    `kind`: unreachable, host_key, host_key_changed, auth, config, missing_trainctl,
    version, missing_tmux, timeout, failed.
    """

    def __init__(self, message: str, *, kind: str = "failed") -> None:
        super().__init__(message)
        self.kind = kind


# --------------------------------------------------------------------------- errors

_UNREACHABLE = (
    "could not resolve hostname",
    "name or service not known",
    "connection refused",
    "no route to host",
    "network is unreachable",
    "connection timed out",
    "operation timed out",
    "timed out during banner exchange",
    "connection reset",
    "kex_exchange_identification",
    "connection closed by remote host",
)


def classify_ssh_error(stderr: str, host: str) -> RemoteError | None:
    """Turn what `ssh` printed when it failed into a RemoteError that says what to do, or
    None when the text is not a known connection failure."""
    low = stderr.lower()
    tail = " ".join(line.strip() for line in stderr.strip().splitlines()[-3:])
    never = "trainctl never turns host key checking off."
    if "remote host identification has changed" in low:
        return RemoteError(
            f"The host key of {host} has CHANGED since you last connected (the box was "
            f"reinstalled, or someone is in the middle). If you know why, remove the old key "
            f"with `ssh-keygen -R <hostname>`, then connect once by hand (`ssh {host}`), check "
            f"the fingerprint and accept it. {never}",
            kind="host_key_changed",
        )
    if "host key verification failed" in low or "host key is known" in low:
        return RemoteError(
            f"The host key of {host} is not in your known_hosts, so ssh refuses to connect "
            f"(BatchMode). Connect once by hand (`ssh {host}`) and check the fingerprint, or "
            f"add it with `ssh-keyscan [-p PORT] <hostname> >> ~/.ssh/known_hosts` after "
            f"checking it. {never}",
            kind="host_key",
        )
    if "permission denied" in low or "too many authentication failures" in low:
        return RemoteError(
            f"{host} refused the login: {tail} Check the user name, that your public key "
            f"is in ~/.ssh/authorized_keys on the box, and that your key is offered "
            f"(IdentityFile in ~/.ssh/config, or `ssh-add`). trainctl runs ssh in BatchMode: "
            f"it never asks for a password or passphrase.",
            kind="auth",
        )
    if any(p in low for p in _UNREACHABLE):
        return RemoteError(
            f"Cannot reach {host}: {tail} Check the host name, port and network "
            f"(`ssh {host} true` should work).",
            kind="unreachable",
        )
    if "bad configuration option" in low or "bad owner or permissions" in low:
        return RemoteError(f"ssh configuration problem for {host}: {tail}", kind="config")
    return None


# --------------------------------------------------------------------------- control dir


def _private_dir(path: Path) -> Path:
    """Create or check a directory only we can use (it holds the ControlMaster socket)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.lstat()
    except OSError as e:
        raise RemoteError(f"cannot create the SSH control directory {path}: {e}", kind="config") from e
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise RemoteError(
            f"SSH control directory {path} is not a directory owned by you; remove it or "
            "choose another control_dir",
            kind="config",
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)
    if len(os.fsencode(path)) + _CONTROL_NAME_LEN >= _SOCKET_PATH_MAX:
        raise RemoteError(
            f"SSH control directory {path} is too long for a Unix socket path "
            f"(at most {_SOCKET_PATH_MAX - _CONTROL_NAME_LEN - 1} bytes)",
            kind="config",
        )
    return path


def default_control_dir() -> Path:
    """$XDG_RUNTIME_DIR/trainctl-ssh when short enough, else /tmp/trainctl-ssh-<uid>."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        cand = Path(runtime) / "trainctl-ssh"
        if len(os.fsencode(cand)) + _CONTROL_NAME_LEN < _SOCKET_PATH_MAX:
            return cand
    base = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
    return Path(base) / f"trainctl-ssh-{os.getuid()}"


def _version_in(text: str) -> str | None:
    m = re.search(r"\b(\d+\.\d+(?:\.\d+)?(?:[.+-]?[0-9A-Za-z.+-]*)?)", text)
    return m.group(1) if m else None


# --------------------------------------------------------------------------- host


class SshHost:
    """One box reached with the user's OpenSSH client over one multiplexed connection.

    `destination`: an ssh_config alias, `[user@]host`, or `ssh://[user@]host[:port]`.
    `ssh_config`: passed as `ssh -F` (otherwise ssh reads ~/.ssh/config as usual).
    `remote_trainctl` / `remote_tmux`: argv prefixes for those programs on the box (a
    virtualenv is not on PATH in a non-interactive ssh session: give its absolute path).
    The remote login shell must be POSIX-like (sh, bash, dash, zsh, ksh).
    """

    def __init__(
        self,
        destination: str,
        *,
        ssh_config: Path | None = None,
        control_dir: Path | None = None,
        remote_trainctl: Sequence[str] = ("trainctl",),
        remote_tmux: Sequence[str] = ("tmux",),
        connect_timeout: float = 10,
        port: int | None = None,
    ) -> None:
        dest, url_port = _parse_destination(destination)
        self.destination = dest
        self.port = port if port is not None else url_port
        self.ssh_config = Path(ssh_config) if ssh_config is not None else None
        self.control_dir = Path(control_dir) if control_dir is not None else default_control_dir()
        self.remote_trainctl = tuple(remote_trainctl)
        self.remote_tmux = tuple(remote_tmux)
        self.connect_timeout = connect_timeout
        self._connected = False

    def __repr__(self) -> str:
        return f"SshHost({self.name!r})"

    @property
    def name(self) -> str:
        """How messages name the box."""
        return f"{self.destination}:{self.port}" if self.port else self.destination

    @property
    def control_path(self) -> str:
        return str(self.control_dir).replace("%", "%%") + "/%C"

    # ---- argv building
    def _base(self) -> list[str]:
        argv = ["ssh"]
        if self.ssh_config is not None:
            argv += ["-F", str(self.ssh_config)]
        if self.port is not None:
            argv += ["-p", str(self.port)]
        argv += [
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={max(1, round(self.connect_timeout))}",
            "-o",
            f"ControlPath={self.control_path}",
        ]
        return argv

    def ssh_argv(self, argv: Sequence[str], *, tty: bool = False) -> list[str]:
        """The local command line that runs `argv` on the box over the shared connection
        (or a direct one when the master is gone). `tty=True` for interactive programs
        such as `tmux attach`."""
        return [
            *self._base(),
            "-o",
            "ControlMaster=no",
            "-t" if tty else "-T",
            "--",
            self.destination,
            quote_argv(argv),
        ]

    def _control(self, op: str, timeout: float = 10) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self._base(), "-O", op, "--", self.destination],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    # ---- connection
    def master_pid(self) -> int | None:
        """The pid of the running ControlMaster for this host, or None."""
        try:
            r = self._control("check")
        except (subprocess.TimeoutExpired, FileNotFoundError):
            return None
        m = re.search(r"pid=(\d+)", r.stdout + r.stderr)
        return int(m.group(1)) if r.returncode == 0 and m else None

    def connect(self) -> None:
        """Open (or find) the shared connection; RemoteError says why it cannot."""
        if self._connected:
            return
        _private_dir(self.control_dir)
        if self.master_pid() is not None:
            self._connected = True
            return
        argv = [
            *self._base(),
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPersist={CONTROL_PERSIST_S}",
            "-o",
            "ServerAliveInterval=15",
            "-o",
            "ServerAliveCountMax=4",
            "-N",
            "-f",
            "--",
            self.destination,
        ]
        # stderr goes to a file: a backgrounded master may keep a pipe open for 10 minutes.
        with tempfile.TemporaryFile() as err:
            try:
                r = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    timeout=self.connect_timeout + 30,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise RemoteError(
                    f"ssh to {self.name} did not finish connecting within {self.connect_timeout + 30:.0f} s",
                    kind="timeout",
                ) from None
            except FileNotFoundError:
                raise RemoteError(
                    "the OpenSSH client `ssh` is not installed (e.g. `apt-get install openssh-client`)",
                    kind="config",
                ) from None
            err.seek(0)
            text = err.read().decode(errors="replace")
        if r.returncode != 0:
            raise classify_ssh_error(text, self.name) or RemoteError(
                f"ssh to {self.name} failed (exit {r.returncode}): {text.strip() or 'no message'}"
            )
        self._connected = True

    def close(self) -> None:
        """Stop the shared connection (`ssh -O exit`); later calls reconnect."""
        self._connected = False
        pid = self.master_pid()
        if pid is None:
            return
        try:
            self._control("exit")
        except subprocess.TimeoutExpired:
            pass
        if self.master_pid() is not None:
            try:
                os.kill(pid, 15)
            except OSError:
                pass

    def __enter__(self) -> SshHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- commands
    def run(
        self, argv: Sequence[str], input: bytes | str | None = None, *, timeout: float = 60, text: bool = True
    ) -> subprocess.CompletedProcess:
        """Run `argv` on the box and wait. The remote exit status is returned as is; a
        connection failure raises RemoteError."""
        self.connect()
        data = input.encode() if isinstance(input, str) else input
        try:
            r = subprocess.run(
                self.ssh_argv(argv),
                input=data,
                stdin=subprocess.DEVNULL if data is None else None,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise RemoteError(
                f"`{quote_argv(argv)}` on {self.name} did not finish within {timeout:g} s", kind="timeout"
            ) from None
        if r.returncode == 255:
            err = classify_ssh_error(r.stderr.decode(errors="replace"), self.name)
            if err is not None:
                self._connected = False
                raise err
        if text:
            return subprocess.CompletedProcess(
                r.args, r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
            )
        return r

    def popen(self, argv: Sequence[str], *, tty: bool = False, **kw) -> subprocess.Popen:
        """Start `argv` on the box; the caller owns the returned process (kill it to stop)."""
        self.connect()
        return subprocess.Popen(self.ssh_argv(argv, tty=tty), **kw)

    def send_bytes(self, data: bytes, remote_path: str, mode: int = 0o600) -> None:
        """Write `data` to `remote_path` on the box (parent created 0700, file `mode`),
        atomically (temporary file, then rename)."""
        path = _remote_path(remote_path)
        script = (
            'umask 077 && mkdir -p -- "$1" && t=$(mktemp -- "$2.XXXXXXXXXX") && cat > "$t" && '
            'chmod "$3" -- "$t" && mv -f -- "$t" "$2"'
        )
        argv = ["sh", "-c", script, "sh", posixpath.dirname(path) or ".", path, f"{mode:o}"]
        r = self.run(argv, input=data, text=True)
        if r.returncode != 0:
            raise RemoteError(
                f"could not write {remote_path} on {self.name}: {r.stderr.strip() or f'exit {r.returncode}'}"
            )

    def send_text(self, text: str, remote_path: str, mode: int = 0o600) -> None:
        self.send_bytes(text.encode(), remote_path, mode)

    def send_file(self, local_path: Path | str, remote_path: str, mode: int | None = None) -> None:
        """Copy a local file; by default keeps the owner's permission bits only."""
        p = Path(local_path)
        if mode is None:
            mode = stat.S_IMODE(p.stat().st_mode) & 0o700 or 0o600
        self.send_bytes(p.read_bytes(), remote_path, mode)

    def tmux(self, socket: str | None = None):
        """A `Tmux` that drives the tmux server on this box."""
        return Tmux(socket, runner=self.run, tmux=self.remote_tmux, where=self.name)

    # ---- checks
    def remote_version(self) -> str:
        """`trainctl --version` on the box (RemoteError when it is missing)."""
        cmd = [*self.remote_trainctl, "--version"]
        r = self.run(cmd, timeout=60)
        if r.returncode in (126, 127):
            how = "cannot be executed" if r.returncode == 126 else "was not found"
            raise RemoteError(
                f"trainctl {how} on {self.name} (`{quote_argv(cmd)}`: "
                f"{r.stderr.strip() or f'exit {r.returncode}'}). Install the same version "
                f"there: `pip install trainctl=={__version__}` (or `pip install "
                f"/path/to/trainctl-checkout` at version {__version__}). A virtualenv is not "
                "on PATH in a non-interactive ssh session: set its absolute path in the job "
                'file, `[host] trainctl = "/path/to/venv/bin/trainctl"`.',
                kind="missing_trainctl",
            )
        version = _version_in(r.stdout) if r.returncode == 0 else None
        if version is None:
            raise RemoteError(
                f"`{quote_argv(cmd)}` on {self.name} did not print a version (exit "
                f"{r.returncode}): {(r.stdout + r.stderr).strip()[:300]!r}",
                kind="missing_trainctl",
            )
        return version

    def check(self, *, require_tmux: bool = True) -> None:
        """Connect and verify the box can run trainctl: same version, tmux present."""
        self.connect()
        remote = self.remote_version()
        if remote != __version__:
            raise RemoteError(
                f"trainctl on {self.name} is version {remote}, this one is {__version__}: "
                f"install the same version on both (`pip install trainctl=={__version__}`).",
                kind="version",
            )
        if require_tmux:
            cmd = [*self.remote_tmux, "-V"]
            r = self.run(cmd, timeout=30)
            if r.returncode != 0:
                raise RemoteError(
                    f"tmux is not available on {self.name} (`{quote_argv(cmd)}`: "
                    f"{r.stderr.strip() or f'exit {r.returncode}'}). Install it there, e.g. "
                    "`sudo apt-get install tmux` (Debian/Ubuntu) or `sudo dnf install tmux`.",
                    kind="missing_tmux",
                )
