"""Follow the kernel log (amdgpu resets, NVIDIA Xid, OOM killer, hung tasks) from now on.

:class:`KernelLogFollower` runs ``dmesg --follow-new`` (older util-linux: ``dmesg --follow``
with the backlog skipped; no dmesg: ``journalctl -k -f``) in its own session and hands
each new line to ``on_line`` from a daemon reader thread.  When none of them can read the
kernel log (common in containers: "dmesg: read kernel buffer failed: Operation not
permitted") it calls ``on_info`` once with the reasons and stops; training goes on
without kernel lines.  ``stop()`` kills the whole process group.

Feed the lines to ``WarningMatcher.feed(line, now, source="kernel")``; the callbacks run
on the reader thread, so hand them to your own loop if that matters.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trainctl.system.process import ends_with_us

# stderr text of a follower that runs but can never show kernel lines
_UNREADABLE_MARKERS = (
    "Operation not permitted",
    "Permission denied",
    "No journal files",
    "not seeing messages",
    "insufficient permissions",
)
_SNAPSHOT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class KernelLogCommand:
    """One way to follow the kernel log.

    ``snapshot`` runs first: its output lines are the backlog the follower skips (for
    followers that print the whole buffer before following); with ``needs_output`` an
    empty snapshot means the log is not readable (journalctl without a journal prints
    nothing at all).
    """

    argv: tuple[str, ...]
    snapshot: tuple[str, ...] | None = None
    needs_output: bool = False


DEFAULT_COMMANDS: tuple[KernelLogCommand, ...] = (
    KernelLogCommand(("dmesg", "--follow-new")),
    KernelLogCommand(("dmesg", "--follow"), snapshot=("dmesg",)),
    KernelLogCommand(
        ("journalctl", "-k", "-f", "-n", "0", "-o", "cat"),
        snapshot=("journalctl", "-k", "-n", "1", "-o", "cat", "-q"),
        needs_output=True,
    ),
)


class KernelLogFollower:
    """Follows the first readable kernel log source in a subprocess + daemon thread."""

    def __init__(
        self,
        on_line: Callable[[str], None],
        on_info: Callable[[str], None],
        argv_candidates: Sequence[Sequence[str] | KernelLogCommand] | None = None,
        *,
        probe_s: float = 0.5,
    ):
        self._on_line = on_line
        self._on_info = on_info
        self._commands = tuple(
            c if isinstance(c, KernelLogCommand) else KernelLogCommand(tuple(c))
            for c in (DEFAULT_COMMANDS if argv_candidates is None else argv_candidates)
        )
        self._probe_s = probe_s
        self._lock = threading.Lock()
        self._stopping = False
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None
        self.command: tuple[str, ...] | None = None  # the follower command in use

    @property
    def pid(self) -> int | None:
        """The follower process's pid while it runs."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("KernelLogFollower.start() called twice")
        self._thread = threading.Thread(target=self._run, name="kernel-log", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the reader thread to end (it ends after on_info or stop()); True if it has."""
        if self._thread is None:
            return False
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        """Kill the follower (its whole process group) and wait for the reader thread."""
        with self._lock:
            self._stopping = True
            proc = self._proc
        if proc is not None:
            _kill_group(proc)
        if self._thread is not None:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ reader thread
    def _run(self) -> None:
        reasons: list[str] = []
        for cmd in self._commands:
            if self._stopping:
                return
            outcome = self._try(cmd)
            if outcome is None:  # it ran and was stopped, or ended after delivering lines
                return
            if outcome not in reasons:
                reasons.append(outcome)
        if not self._stopping:
            self._on_info(
                "kernel log not readable: " + "; ".join(reasons) + "; amdgpu/Xid lines will not be seen"
            )

    def _try(self, cmd: KernelLogCommand) -> str | None:
        """Follow with ``cmd``; a reason string if it could not read the kernel log."""
        name = cmd.argv[0]
        if shutil.which(name) is None:
            return f"{name}: not installed"
        skip: set[str] | None = None
        if cmd.snapshot is not None:
            try:
                snap = subprocess.run(
                    cmd.snapshot,
                    capture_output=True,
                    text=True,
                    errors="replace",
                    stdin=subprocess.DEVNULL,
                    timeout=_SNAPSHOT_TIMEOUT_S,
                    preexec_fn=ends_with_us(),
                )
            except (OSError, subprocess.TimeoutExpired) as e:
                return f"{' '.join(cmd.snapshot)}: {e}"
            if snap.returncode != 0:
                return (
                    _first_line(snap.stderr) or f"{' '.join(cmd.snapshot)} exited with code {snap.returncode}"
                )
            skip = set(snap.stdout.splitlines())
            if cmd.needs_output and not skip:
                return f"{' '.join(cmd.snapshot)}: no kernel messages readable"
        with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as err:
            with self._lock:
                if self._stopping:
                    return None
                try:
                    proc = subprocess.Popen(
                        cmd.argv,
                        stdout=subprocess.PIPE,
                        stderr=err,
                        stdin=subprocess.DEVNULL,
                        text=True,
                        errors="replace",
                        bufsize=1,
                        start_new_session=True,
                        preexec_fn=ends_with_us(),  # never outlives the agent (killed -9)
                    )
                except OSError as e:
                    return f"{name}: {e.strerror or e}"
                self._proc = proc
                self.command = cmd.argv
            probe = threading.Timer(self._probe_s, self._probe, (proc, err))
            probe.daemon = True
            probe.start()
            try:
                delivered = self._pump(proc, skip)
            except BaseException:  # on_line raised: never leave the follower running
                _kill_group(proc)
                with self._lock:
                    self._proc = None
                raise
            finally:
                probe.cancel()
            rc = proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
            with self._lock:
                self._proc = None
                stopping = self._stopping
            err.seek(0)
            message = _first_line(err.read())
        if stopping:
            return None
        if not delivered:
            self.command = None
            return message or f"{' '.join(cmd.argv)} exited with code {rc}"
        self._on_info(
            f"kernel log follower stopped: {' '.join(cmd.argv)} exited with code {rc}"
            + (f": {message}" if message else "")
        )
        return None

    def _pump(self, proc: subprocess.Popen[str], skip: set[str] | None) -> bool:
        """Deliver lines until EOF; True if any line was delivered."""
        delivered = False
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\r\n")
            if skip is not None:
                if line in skip:
                    continue  # backlog printed before following
                skip = None
            if not line:
                continue
            delivered = True
            self._on_line(line)
        return delivered

    def _probe(self, proc: subprocess.Popen[str], err) -> None:
        """A follower that runs but says it cannot see the log is killed, so the next is tried."""
        try:
            text = os.pread(err.fileno(), 65536, 0).decode("utf-8", "replace")
        except (OSError, ValueError):
            return
        if any(marker in text for marker in _UNREADABLE_MARKERS):
            _kill_group(proc)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the process group the follower leads, then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
