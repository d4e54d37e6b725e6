"""The holder's watch on its agent (``--alert-file F``, the run's 0600 alerts.json).

Every :data:`AGENT_CHECK_S` while the trainer lives, the holder looks whether the agent named
in agent.json still lives (pid and start time; an adopting agent rewrites the file).  Gone
twice in a row after it was seen alive: it starts ``python -m trainctl.alerts.send
--unsupervised`` once (again only after an agent was seen alive meanwhile).  The holder
itself never imports apprise.  Like the rest of the holder: stdlib + psutil only.
"""

from __future__ import annotations

import json
import os
import sys
import time

import psutil

AGENT_CHECK_S = 2.0  # with --alert-file: how often the holder looks for its agent


class AgentWatch:
    """Is the agent of this run alive?  Says "unsupervised" once when it is gone."""

    def __init__(self, run_dir: str, alert_file: str) -> None:
        self.run_dir, self.alert_file = run_dir, alert_file
        self.next_check = time.monotonic() + AGENT_CHECK_S
        self.seen_alive = True  # an agent started us (it wrote agent.json first)
        self.sent = False
        self.gone = 0

    def agent_alive(self) -> bool | None:
        """True / False, None when agent.json cannot say (not written yet)."""
        try:
            with open(os.path.join(self.run_dir, "agent.json")) as f:
                info = json.load(f)
            pid, started = int(info["pid"]), float(info.get("started") or 0)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        try:
            p = psutil.Process(pid)
            return p.status() != psutil.STATUS_ZOMBIE and (not started or p.create_time() <= started + 1)
        except psutil.Error:
            return False

    def check(self, trainer_pid: int | None) -> None:
        now = time.monotonic()
        if now < self.next_check:
            return
        self.next_check = now + AGENT_CHECK_S
        alive = self.agent_alive()
        if alive:
            self.seen_alive, self.sent, self.gone = True, False, 0
            return
        if alive is None or not self.seen_alive or self.sent:
            return
        self.gone += 1
        if self.gone < 2:
            return
        self.sent = True
        argv = [
            sys.executable,
            "-I",
            "-m",
            "trainctl.alerts.send",
            "--unsupervised",
            "--alert-file",
            self.alert_file,
            "--run-dir",
            self.run_dir,
            "--pid",
            str(trainer_pid),
        ]
        print(
            f"holder: the agent is gone while the trainer (pid {trainer_pid}) runs: "
            "sending the unsupervised alert",
            file=sys.stderr,
            flush=True,
        )
        try:  # our child: reaped with the others; its stderr goes to holder.out
            os.posix_spawn(
                sys.executable,
                argv,
                dict(os.environ),
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                ],
            )
        except (OSError, ValueError) as e:
            print(f"holder: cannot start the alert sender: {e}", file=sys.stderr, flush=True)
