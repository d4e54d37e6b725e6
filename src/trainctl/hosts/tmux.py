"""Run the agent inside tmux, here or on a box over SSH, so it outlives the terminal.

Every tmux call goes through a runner, `argv -> CompletedProcess[str]`: a local
subprocess by default, or `SshHost.run` for a box. `socket` is tmux's `-L` server name
(tests use a private one so they never touch the user's sessions). Session targets are
given as `=NAME` so tmux matches the exact name, never a prefix.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

from trainctl.hosts.shell import quote_argv

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]

SESSION_PREFIX = "trainctl-"
_NAME_MAX = 60
_CLEAN_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?\Z")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class TmuxError(Exception):
    """A tmux command failed; the message says which and why."""


class SessionRunning(TmuxError):
    """The job already runs in a tmux session (two runs of one job are refused)."""

    def __init__(self, message: str, session: str) -> None:
        super().__init__(message)
        self.session = session


def tmux_available() -> bool:
    """Is a tmux binary on PATH here?"""
    return shutil.which("tmux") is not None


def session_name(job_name: str) -> str:
    """`trainctl-<job>`, a valid tmux name that a shell need not quote, one per job name.

    A name of letters, digits, '_' and '-' that fits is kept as is; any other (`a.b`, a
    long one) has what tmux or a shell could trip on replaced by '-', is cut, and gets
    `+` and a hash of the whole name: `a.b` and `a-b`, or two long names that share their
    beginning, never share a session ('+' is in no kept name, so no kept name collides)."""
    room = _NAME_MAX - len(SESSION_PREFIX)
    if _CLEAN_NAME.match(job_name) and len(job_name) <= room:
        return SESSION_PREFIX + job_name
    digest = hashlib.sha256(job_name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    clean = re.sub(r"[^A-Za-z0-9_]+", "-", job_name).strip("-") or "job"
    return f"{SESSION_PREFIX}{clean[: room - len(digest) - 1]}+{digest}"


def _local_run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30, check=False
        )
    except FileNotFoundError:
        raise TmuxError("tmux is not installed (e.g. `sudo apt-get install tmux`)") from None


def session_command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """The pane's shell command: `exec env K=V ... ARGV`, quoted for the POSIX shell tmux
    runs it with (works with any tmux version)."""
    pairs = []
    for key, value in (env or {}).items():
        if not _ENV_NAME.match(key):
            raise ValueError(
                f"environment variable name {key!r} is not allowed "
                "(letters, digits and '_', not starting with a digit)"
            )
        pairs.append(f"{key}={value}")
    if not argv:
        raise ValueError("empty command for the tmux session")
    if "=" in argv[0] and pairs:
        raise ValueError(f"command {argv[0]!r}: a program name with '=' cannot follow `env`")
    full = ["env", *pairs, *argv] if pairs else list(argv)
    return "exec " + quote_argv(full)


def _panes(text: str) -> dict[int, bool]:
    """Parse `#{pane_pid} #{pane_dead}` lines."""
    panes = {}
    for line in text.split("\n"):
        pid, _, dead = line.strip().partition(" ")
        if pid.isdigit():
            panes[int(pid)] = dead == "1"
    return panes


class Tmux:
    """tmux commands against one server (`socket`, i.e. `tmux -L`), local or remote."""

    def __init__(
        self,
        socket: str | None = None,
        runner: Runner | None = None,
        tmux: Sequence[str] = ("tmux",),
        where: str = "this machine",
        socket_path: str | None = None,
    ) -> None:
        self.socket = socket
        self.socket_path = socket_path  # `tmux -S`: a server known by its socket's path
        self.local = runner is None
        self.runner = runner or _local_run
        self.tmux = tuple(tmux)
        self.where = where

    def argv(self, *args: str) -> list[str]:
        if self.socket_path:
            return [*self.tmux, "-S", self.socket_path, *args]
        return [*self.tmux, *(("-L", self.socket) if self.socket else ()), *args]

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.runner(self.argv(*args))

    def attach_argv(self, name: str) -> list[str]:
        """The command a person runs to look at the session."""
        return self.argv("attach-session", "-t", f"={name}")

    # ---- queries
    def session_exists(self, name: str) -> bool:
        return self._run("has-session", "-t", f"={name}").returncode == 0

    def pane_pids(self, name: str) -> dict[int, bool]:
        """{pane pid: pane is dead} for every pane of the session ({} when it is gone)."""
        r = self._run("list-panes", "-s", "-t", f"={name}", "-F", "#{pane_pid} #{pane_dead}")
        if r.returncode != 0:
            return {}
        return _panes(r.stdout)

    def session_alive(self, name: str) -> bool:
        """The session exists and its command is still running (not a dead pane kept
        for reading with remain-on-exit)."""
        return any(not dead for dead in self.pane_pids(name).values())

    def capture(self, name: str, lines: int = 2000) -> str:
        """The pane's text: the last `lines` lines of history plus the screen."""
        r = self._run("capture-pane", "-p", "-J", "-S", f"-{lines}", "-t", f"={name}:")
        if r.returncode != 0:
            raise TmuxError(f"cannot read tmux session {name!r} on {self.where}: {r.stderr.strip()}")
        return r.stdout

    # ---- actions
    def ensure_not_running(self, name: str) -> None:
        """Refuse a second run of a job; clear a finished (dead) session of the same name."""
        if self.session_alive(name):
            attach = quote_argv(self.attach_argv(name))
            kill = quote_argv(self.argv("kill-session", "-t", f"={name}"))
            raise SessionRunning(
                f"this job is already running in tmux session {name!r} on {self.where}: "
                f"look at it with `{attach}` (or `trainctl attach`); to start it again, "
                f"stop it first (from `trainctl attach`, or `{kill}`)",
                name,
            )
        if self.session_exists(name):
            self._run("kill-session", "-t", f"={name}")

    def start_session(
        self,
        name: str,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str] | None = None,
        width: int = 220,
        height: int = 50,
    ) -> None:
        """Start `argv` in a new detached session `name` (refused if one is running).
        The pane stays after the command ends (remain-on-exit) so attach shows the end."""
        if self.local and not os.path.isdir(cwd):
            raise TmuxError(f"cannot start tmux session {name!r}: working directory {cwd} does not exist")
        self.ensure_not_running(name)
        # One tmux invocation: the option is set before the server can see the child exit.
        r = self._run(
            "new-session",
            "-d",
            "-s",
            name,
            "-c",
            cwd,
            "-x",
            str(width),
            "-y",
            str(height),
            session_command(argv, env),
            ";",
            "set-option",
            "-w",
            "-t",
            f"={name}:",
            "remain-on-exit",
            "on",
        )
        if r.returncode != 0:
            if "duplicate session" in r.stderr:
                self.ensure_not_running(name)
            raise TmuxError(
                f"cannot start tmux session {name!r} on {self.where}: "
                f"{r.stderr.strip() or f'exit {r.returncode}'}"
            )

    def kill_session(self, name: str, *, grace: float = 5.0) -> None:
        """Kill the session and make sure its commands are gone: tmux sends SIGHUP; a
        process group still there after `grace` seconds gets SIGKILL. Processes that
        moved to their own session (the agent's trainer) are the agent's to stop."""
        pids = [pid for pid, dead in self.pane_pids(name).items() if not dead]
        self._run("kill-session", "-t", f"={name}")
        self._finish_groups(pids, grace)

    def kill_server(self, *, grace: float = 2.0) -> None:
        """Stop this tmux server, every session in it and their commands (tests' private
        servers; never call it on the user's default server)."""
        r = self._run("list-panes", "-a", "-F", "#{pane_pid} #{pane_dead}")
        panes = _panes(r.stdout) if r.returncode == 0 else {}
        pids = [pid for pid, dead in panes.items() if not dead]
        self._run("kill-server")
        self._finish_groups(pids, grace)

    def _finish_groups(self, pids: list[int], grace: float) -> None:
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if self._group_alive(p)]
            if pids:
                time.sleep(0.1)
        for pgid in pids:
            self._signal_group(pgid, "KILL")

    def _signal_group(self, pgid: int, sig: str) -> bool:
        """Signal a process group (a pane's command leads its own); True if it exists."""
        if self.local:
            try:
                os.killpg(pgid, 0 if sig == "0" else getattr(signal, f"SIG{sig}"))
                return True
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
        # `kill -SIG -PGID` (no `--`): the form dash, bash and procps all accept.
        return self.runner(["kill", f"-{sig}", f"-{pgid}"]).returncode == 0

    def _group_alive(self, pgid: int) -> bool:
        return self._signal_group(pgid, "0")


# Module-level shortcuts for the local machine.
def session_exists(name: str, *, socket: str | None = None) -> bool:
    return Tmux(socket).session_exists(name)


def start_session(
    name: str,
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str] | None = None,
    socket: str | None = None,
) -> None:
    Tmux(socket).start_session(name, argv, cwd=cwd, env=env)


def kill_session(name: str, *, socket: str | None = None, grace: float = 5.0) -> None:
    Tmux(socket).kill_session(name, grace=grace)


def capture(name: str, *, socket: str | None = None, lines: int = 2000) -> str:
    return Tmux(socket).capture(name, lines)


def ensure_not_running(name: str, *, socket: str | None = None) -> None:
    Tmux(socket).ensure_not_running(name)
