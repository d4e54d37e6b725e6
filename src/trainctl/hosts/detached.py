"""How this machine's host starts an agent that outlives the terminal (in tmux when there,
else as a detached process: `trainctl run`, and `attach`/`ctl` adopting a run whose agent
died), runs one in this process (`run --json/--headless`), and waits for a run's agent
between two of them (an attach that adopts): starting a run here is this machine's host's
``launch`` (src/trainctl/hosts/local.py); `trainctl agent` runs one in its own process (cli/agent.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from trainctl.agent.prepare import agent_alive
from trainctl.core.usage import UsageError


def run_agent(
    run_dir: Path,
    spec,
    printer: Callable,
    on_locked: Callable[[], None] | None = None,
    adopt: bool = False,
    plug=None,
) -> int:
    """The run's agent in this process, its events printed by ``printer``; its exit code."""
    import asyncio

    from trainctl.agent import Agent

    agent = Agent(run_dir, spec, printer=printer, on_locked=on_locked, adopt=adopt, plug=plug)
    return asyncio.run(agent.run())


def agent_answers(run_dir: Path) -> bool:
    """Whether the run's agent still answers on its socket."""
    from trainctl.store.paths import RunFiles

    return RunFiles(run_dir).sock.exists() and agent_alive(run_dir)


def start_detached_agent(
    run_dir: Path,
    spec,
    use_tmux: bool,
    adopt: bool = False,
    say: Callable[[str], None] | None = None,
    tmux_socket: str | None = None,
) -> str:
    """Start `trainctl agent RUN_DIR` so it outlives this terminal: in a tmux session named
    after the job when tmux is there (``tmux_socket``: that server's socket path, else
    $TRAINCTL_TMUX_SOCKET's or the default one), else as a detached process.  It gets this
    process's environment either way (tmux: handed over, src/trainctl/hosts/env_handover.py).
    Returns where it runs, in words, for the caller to say (an adopting agent's is said here,
    through ``say``: the CLI's note, on stderr)."""
    from trainctl.store.paths import RunFiles

    files = RunFiles(run_dir)
    argv = [sys.executable, "-m", "trainctl", "agent", str(run_dir)] + (["--adopt"] if adopt else [])
    from trainctl.hosts import env_handover, tmux

    if use_tmux and tmux.tmux_available():
        server = tmux.Tmux(os.environ.get("TRAINCTL_TMUX_SOCKET") or None, socket_path=tmux_socket)
        session = tmux.session_name(spec.job_name)
        fifo = env_handover.make_fifo(files.dir)  # the pane gets the server's env, not ours
        try:
            server.start_session(
                session,
                [*argv, "--env-from", str(fifo)],
                cwd=str(run_dir),
                env={"TRAINCTL_TMUX_SESSION": session},
            )
        except tmux.TmuxError as e:
            fifo.unlink(missing_ok=True)
            raise UsageError(str(e)) from e
        where = (
            f"the agent runs in tmux session {session} (`{' '.join(server.attach_argv(session))}` shows it)"
        )

        def gone() -> bool:  # remain-on-exit keeps a dead pane: look at its command
            return not server.session_alive(session)

        try:
            env_handover.send(fifo, os.environb, gone)
        except env_handover.HandoverError as e:
            fifo.unlink(missing_ok=True)
            if not gone():  # one that ended says why below
                raise UsageError(str(e)) from None

        def said() -> str:  # what its pane shows, then the dead session goes
            try:
                return _last_lines(server.capture(session, lines=50))
            except tmux.TmuxError:
                return ""
            finally:
                with contextlib.suppress(tmux.TmuxError):
                    server.ensure_not_running(session)  # clears a dead session
    else:
        with open(files.dir / "agent.out", "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=str(run_dir),
            )
        why = "tmux not found" if use_tmux else "--no-tmux"
        where = f"the agent runs detached ({why}); its output: {files.dir / 'agent.out'}"
        if adopt and say is not None:  # attach (--json too): stdout is the caller's
            say(where)

        def gone() -> bool:
            return proc.poll() is not None

        def said() -> str:
            try:
                return _last_lines((files.dir / "agent.out").read_text(errors="replace"))
            except OSError:
                return ""

    deadline = time.monotonic() + 30
    next_check = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        if files.sock.exists() and agent_alive(run_dir):
            return where
        if time.monotonic() >= next_check:
            next_check += 0.5
            if gone() and not (files.sock.exists() and agent_alive(run_dir)):
                if not never_began(run_dir):
                    return where  # it ran, and ended already (`-- true`): not a failure
                raise UsageError(
                    "the agent ended before it started the run: " + (said() or "it printed nothing")
                )
        time.sleep(0.1)
    raise UsageError(f"the agent did not start within 30 s; see {files.dir / 'agent.out'}")


def never_began(run_dir: Path) -> bool:
    """No event in the run's journal: the agent refused (or never ran) before its start."""
    from trainctl.store.paths import RunFiles

    events = RunFiles(run_dir).events
    try:
        return events.stat().st_size == 0
    except FileNotFoundError:
        return True


def _last_lines(text: str) -> str:
    """Why the agent ended: its `trainctl:` lines (a refusal), else its last lines
    (sanitised: a tmux pane or agent.out holds what the trainer printed)."""
    from trainctl.core.sanitize import sanitize_text

    lines = [ln for ln in sanitize_text(text).strip().splitlines() if ln.strip()]
    refusals = [ln for ln in lines if ln.startswith("trainctl: ")]
    return "\n".join(refusals[-2:] or lines[-5:])


def adopt_if_orphaned(run_dir: Path, say: Callable[[str], None]) -> bool:
    """A run whose agent died while its trainer lives on (or between attempts) gets a new
    agent that takes over supervision; attach (or ctl) then talks to that agent.  True when
    one was started."""
    from trainctl.agent.adopt import needs_adoption
    from trainctl.store.spec import RunSpec

    if not needs_adoption(run_dir):
        return False
    try:
        spec = RunSpec.load(run_dir / "spec.json")
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot adopt the run: {e}") from None
    say(f"the agent of {run_dir} is gone while its run goes on: starting a new agent to adopt it")
    socket = _dead_agent_tmux(run_dir)  # the new one runs where the first ran
    start_detached_agent(run_dir, spec, use_tmux=socket is not None, adopt=True, say=say, tmux_socket=socket)
    return True


def _dead_agent_tmux(run_dir: Path) -> str | None:
    """The tmux server's socket path the run's last agent ran in (its agent.json), when it
    ran in tmux and that server is still there; else None."""
    from trainctl.hosts.where import agent_info

    info = agent_info(run_dir)
    socket = info.get("tmux_socket") if info.get("tmux_session") else None
    return socket if isinstance(socket, str) and socket and os.path.exists(socket) else None


class Adopting:
    """No agent answered, and the journal does not end the run: wait while an agent holds
    the run without listening yet (another `attach` beside this one won the race to adopt
    it, and starts), or the run still needs adopting (this attach's own agent lost that race
    and ended), up to ADOPT_WAIT_S; then end (3, the agent is gone)."""

    ADOPT_WAIT_S = 30.0

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.since: float | None = None

    async def __call__(self, hello: dict) -> bool:
        from trainctl.agent.adopt import agent_running, needs_adoption

        now = time.monotonic()
        since = self.since = self.since or now
        if now - since > self.ADOPT_WAIT_S:
            return False
        if agent_running(self.run_dir):
            return True
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(None, needs_adoption, self.run_dir)
