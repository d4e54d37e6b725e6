"""A client's transport to an agent on a box: `ssh HOST trainctl bridge RUN_DIR`, whose
stdin/stdout are the agent socket's JSON lines, over the box's multiplexed connection
(src/trainctl/hosts/ssh.py)."""

from __future__ import annotations

import asyncio
import collections

from trainctl.hosts.ssh import RemoteError, SshHost, classify_ssh_error

_STREAM_LIMIT = 1 << 24  # longest line a transport reader accepts (16 MiB)


class ProcessWriter:
    """The write half of a transport over a subprocess's stdin, StreamWriter-like.
    Closing it ends the subprocess."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self._closing = False

    def write(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(data)

    async def drain(self) -> None:
        assert self._proc.stdin is not None
        await self._proc.stdin.drain()

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        if self._proc.returncode is None:
            try:
                self._proc.kill()
            except ProcessLookupError:
                pass

    async def wait_closed(self) -> None:
        await self._proc.wait()


class SshTransport:
    """Reach the agent of `run_dir` on a box: `ssh HOST trainctl bridge RUN_DIR`, whose
    stdin/stdout are the agent socket's JSON lines."""

    def __init__(self, host: SshHost, run_dir: str) -> None:
        self.host = host
        self.run_dir = run_dir
        self.proc: asyncio.subprocess.Process | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=50)
        self._stderr_task: asyncio.Task | None = None

    def remote_argv(self) -> list[str]:
        return [*self.host.remote_trainctl, "bridge", self.run_dir]

    def describe(self) -> str:
        return f"{self.host.name}:{self.run_dir}"

    async def open(self) -> tuple[asyncio.StreamReader, ProcessWriter]:
        await asyncio.to_thread(self.host.connect)
        self.proc = await asyncio.create_subprocess_exec(
            *self.host.ssh_argv(self.remote_argv()),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=_STREAM_LIMIT,
        )
        self._stderr_task = asyncio.ensure_future(self._read_stderr())
        assert self.proc.stdout is not None
        return self.proc.stdout, ProcessWriter(self.proc)

    async def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self._stderr.append(line.decode(errors="replace").rstrip("\n"))

    async def wait_ended(self) -> None:
        """Until ssh has exited and its stderr is read (after its stdout ended)."""
        if self.proc is not None:
            await self.proc.wait()
        if self._stderr_task is not None:
            await asyncio.shield(self._stderr_task)

    def stderr_text(self) -> str:
        """What the remote bridge (or ssh) printed on stderr: why a stream ended."""
        return "\n".join(self._stderr)

    def error(self) -> RemoteError | None:
        """A RemoteError describing why the stream ended, when ssh itself failed."""
        return classify_ssh_error(self.stderr_text(), self.host.name)

    async def close(self) -> None:
        """Kill the ssh process and wait for it (the agent keeps running)."""
        if self.proc is None:
            return
        if self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
        await self.proc.wait()
        if self._stderr_task is not None:
            try:
                await asyncio.wait_for(self._stderr_task, 5)
            except (TimeoutError, asyncio.CancelledError):
                self._stderr_task.cancel()
