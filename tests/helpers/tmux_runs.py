"""Runs whose agent lives in tmux, for e2e tests: private tmux servers, and a teardown
that leaves nothing behind.

``TmuxRuns(tmp_path)`` gives ``env`` for `trainctl` (a private tmux socket for the agent's
session, private runs/config dirs), ``ui`` (a second private tmux server, 160x48, where a
test can run the dashboard and type into it), ``run_dirs()`` and ``kill()``: SIGTERM then
SIGKILL to every agent (its pid is in ``agent.json``) and to every process whose
environment names one of the run directories (trainers and their workers), then both tmux
servers are killed and their socket files removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import uuid
from pathlib import Path

import psutil

from trainctl.hosts import tmux as tm


class TmuxRuns:
    def __init__(self, root: Path, *, width: int = 160, height: int = 48) -> None:
        tag = uuid.uuid4().hex[:10]
        self.root = Path(root)
        self.runs = self.root / "runs"
        self.agent_socket = f"trainctl-test-agent-{tag}"
        self.ui = tm.Tmux(socket=f"trainctl-test-ui-{tag}")
        self.agents = tm.Tmux(socket=self.agent_socket)
        self.width, self.height = width, height
        self.env = {
            "TRAINCTL_TMUX_SOCKET": self.agent_socket,
            "TRAINCTL_RUNS_DIR": str(self.runs),
            "TRAINCTL_CONFIG_DIR": str(self.root / "config"),
        }

    def run_dirs(self) -> list[Path]:
        if not self.runs.is_dir():
            return []
        return sorted(
            p for p in self.runs.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
        )

    def agent_pid(self, run_dir: Path) -> int | None:
        with contextlib.suppress(OSError, ValueError, KeyError):
            return int(json.loads((Path(run_dir) / "agent.json").read_text())["pid"])
        return None

    def _procs(self) -> list[psutil.Process]:
        dirs = {str(d.resolve()) for d in self.run_dirs()}
        pids = {self.agent_pid(d) for d in self.run_dirs()} - {None}
        out = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if p.pid == os.getpid():
                    continue
                if p.status() == psutil.STATUS_ZOMBIE:
                    continue
                if p.pid in pids or p.environ().get("TRAINCTL_RUN_DIR") in dirs:
                    out.append(p)
        return out

    def kill(self) -> None:
        procs = self._procs()
        for p in procs:  # the agent stops its trainer's tree on SIGTERM
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGTERM)
        _gone, alive = psutil.wait_procs(procs, timeout=8)
        for p in alive + self._procs():
            with contextlib.suppress(psutil.Error, OSError):
                os.killpg(os.getpgid(p.pid), signal.SIGKILL)
            with contextlib.suppress(psutil.Error):
                p.kill()
        for server in (self.ui, self.agents):
            server.kill_server()
            base = Path(os.environ.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}"
            (base / server.socket).unlink(missing_ok=True)
