"""Where a run's agent runs, and how a client reaches it from here.

The agent records in agent.json where it runs (``where_i_run``, in system/machine.py): its
Slurm node name, its hostname and the kernel's boot id (what says "this machine": a Unix socket
can be connected from the same kernel only).  A client (attach, status, ctl, `run --slurm`'s
follow, the dashboard: all through hosts/registry.py's ``client_for``, the run's host) connects to the run
directory's agent.sock when the agent is on this machine, and goes over ssh to the agent's
node (``ssh NODE trainctl bridge RUN_DIR``, the transport of `--host` runs) when it runs on
another one: the run directory is on shared storage, its socket is not reachable from here.

Nothing read from a run directory is ever run: the trainctl that ssh starts on the node is
this installation's own (``TRAINCTL_REMOTE_TRAINCTL``, the user's setting, else this very
Python's ``-m trainctl``: a cluster's nodes share its software), and a run directory is
used only when it and the directories above it are the user's (:func:`trusted_run_dir`).

``TRAINCTL_NODE_SSH``: ``auto`` (the default: ssh when the agent's machine is not this one),
``always`` (ssh whenever the agent has a node name: a cluster whose nodes share this kernel's
view, or the tests, where the nodes are this machine), ``never`` (the socket only).
``TRAINCTL_SSH_CONFIG`` (an ``ssh -F`` file) as for `--host`; else ~/.ssh/config.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from trainctl.client.connection import AgentUnavailable, UnixTransport
from trainctl.store.paths import RunFiles, UnsafePathError, read_private, trusted_run_dir
from trainctl.system.machine import BOOT_ID as BOOT_ID  # moved down, re-exported
from trainctl.system.machine import boot_id as boot_id
from trainctl.system.machine import where_i_run

MODES = ("auto", "always", "never")


class AgentUnreachable(AgentUnavailable):
    """The agent runs on another node and ssh cannot reach it; ``str()`` is one line."""

    exit_code = 4


class UntrustedRun(AgentUnavailable):
    """The run directory (or a directory above it) is not the user's own: nothing in it is
    read or acted on; ``str()`` says which and why."""

    exit_code = 2


def own_trainctl() -> tuple[str, ...]:
    """The trainctl command ssh runs on an agent's node: the user's setting
    (``TRAINCTL_REMOTE_TRAINCTL``), else this installation's; never one read from a run
    directory (another user may have written it)."""
    setting = os.environ.get("TRAINCTL_REMOTE_TRAINCTL", "").strip()
    return (setting,) if setting else (sys.executable, "-m", "trainctl")


def ssh_destination(agent: dict, here: dict, mode: str = "auto") -> str | None:
    """The node to reach an agent at over ssh, or None for its socket here.  ``agent``: its
    agent.json; ``here``: this machine's ``where_i_run()``.  Only an agent with a node name
    (a Slurm job's) is reached over ssh: the node name is what the cluster's ssh knows."""
    node = agent.get("node") or ""
    if mode == "never" or not node:
        return None
    if mode == "always":
        return node
    theirs, ours = agent.get("boot_id"), here.get("boot_id")
    if theirs and ours:
        return None if theirs == ours else node
    return None if agent.get("hostname") == here.get("hostname") else node


def mode() -> str:
    value = os.environ.get("TRAINCTL_NODE_SSH", "auto").strip().lower() or "auto"
    if value not in MODES:
        raise AgentUnavailable(f"TRAINCTL_NODE_SSH={value!r}: use one of {', '.join(MODES)}")
    return value


def agent_info(run_dir: Path | str) -> dict:
    """The run's agent.json ({} when it cannot be read, or is not the user's own file)."""
    try:
        info = json.loads(read_private(RunFiles(run_dir).info))
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


class NodeTransport:
    """``ssh NODE trainctl bridge RUN_DIR`` (SshTransport), whose failures to reach the node
    are AgentUnreachable (one line), a ConnectionError as a missing socket is."""

    def __init__(
        self, node: str, run_dir: Path, job: str = "", job_gone: Callable[[str], bool] | None = None
    ) -> None:
        from trainctl.hosts.ssh import SshHost
        from trainctl.hosts.ssh_transport import SshTransport

        config = os.environ.get("TRAINCTL_SSH_CONFIG")
        try:
            host = SshHost(node, ssh_config=Path(config) if config else None, remote_trainctl=own_trainctl())
        except ValueError as e:
            raise AgentUnreachable(f"the agent's node {node!r}: {e}") from None
        self.node, self.inner = node, SshTransport(host, str(run_dir))
        self.run_dir, self.job = Path(run_dir), job  # the Slurm job its agent ran in
        self.job_gone = job_gone  # its host's answer: has that job left its node (blocks)?

    def describe(self) -> str:
        return f"{self.inner.run_dir} on node {self.node} (over ssh)"

    def _unreachable(self, why: str) -> AgentUnreachable:
        return AgentUnreachable(
            f"cannot reach the agent on node {self.node} over ssh: {why} "
            "(see the README, Slurm: reaching the agent on its node)"
        )

    async def open(self):
        from trainctl.hosts.ssh import RemoteError

        try:
            reader, writer = await self.inner.open()
        except RemoteError as e:
            if await self._agent_gone():  # its node died under it, or its job ended
                from trainctl.client.connection import _offline_streams

                return _offline_streams(self.run_dir)
            raise self._unreachable(" ".join(str(e).split())) from None
        return _Watched(reader, self), writer

    async def _agent_gone(self) -> bool:
        """ssh failed: is the agent gone with its job (a node failure leaves its socket
        file on the shared storage; the job is requeued, PENDING, or ended)?  Then the
        journal is all there is, read here.  Asked of the run's host (Slurm) off the
        caller's loop."""
        if not self.job or self.job_gone is None or not RunFiles(self.run_dir).events.exists():
            return False
        return await asyncio.get_running_loop().run_in_executor(None, self.job_gone, self.job)

    def failed(self) -> AgentUnreachable | None:
        """Why ssh ended the stream, when ssh itself (or the remote trainctl) failed."""
        err = self.inner.error()
        if err is not None:
            return self._unreachable(" ".join(str(err).split()))
        text = self.inner.stderr_text().strip()
        return self._unreachable(text.splitlines()[-1]) if text else None

    async def close(self) -> None:
        await self.inner.close()


class _Watched:
    """The ssh stream's reader: an end before any line says why ssh ended (its stderr)."""

    def __init__(self, reader, transport: NodeTransport) -> None:
        self.reader, self.transport, self.said = reader, transport, False

    async def readline(self) -> bytes:
        line = await self.reader.readline()
        if not line and not self.said:
            await self.transport.inner.wait_ended()
            err = self.transport.failed()
            if err is not None:
                raise err
        self.said = True
        return line

    def __getattr__(self, name):
        return getattr(self.reader, name)


def transport_for(run_dir: Path | str, job_gone: Callable[[str], bool] | None = None):
    """The run's agent socket here, or ssh to its node when it runs on another machine
    (its socket still there: an agent that ended removed it, and the journal is read here).
    A run directory that is not the user's own is refused: nothing in it is followed.
    ``job_gone``: the run's host says whether the agent's job has left its node (a Slurm
    run's, hosts/slurm/host.py); the seam that picks it is hosts/registry.py's transport_for."""
    try:
        trusted_run_dir(run_dir)
    except UnsafePathError as e:
        return _Refused(UntrustedRun(str(e)))
    files = RunFiles(run_dir)
    info = agent_info(files.dir)
    try:
        node = ssh_destination(info, where_i_run(), mode()) if files.sock.exists() else None
    except AgentUnavailable as e:
        return _Refused(e)
    if node is None:
        return UnixTransport(files.sock, journal_fallback=True)
    return NodeTransport(node, files.dir, str(info.get("slurm_job") or ""), job_gone)


class _Refused:
    """A transport that cannot be made (a bad setting): connecting says why."""

    def __init__(self, error: AgentUnavailable) -> None:
        self.error = error

    def describe(self) -> str:
        return str(self.error)

    async def open(self):
        raise self.error
