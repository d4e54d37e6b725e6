"""The bridge: a client's transport to an agent on another machine is `ssh HOST trainctl
bridge RUN_DIR`, which relays its stdin/stdout to the agent's Unix socket (:func:`relay`);
a run whose agent is gone is answered from its journal."""

from __future__ import annotations

import asyncio
import json
import sys

from trainctl.client.connection import HELLO_TIMEOUT_S, UnixTransport
from trainctl.store.paths import RunFiles, UnsafePathError, trusted_run_dir


def relay(run_dir: str) -> int:
    """Relay stdin/stdout to the agent's socket (what `ssh HOST trainctl bridge DIR` runs:
    src/trainctl/cli/bridge.py).
    The agent's hello must come within HELLO_TIMEOUT_S: else the bridge answers the client
    with a failed hello (``"ok": false``, ``"error": "agent not responding (pid N, stopped)
    ..."``) and exits 4.  A run directory not the user's own: one line, exit 2, no relay."""
    try:
        trusted_run_dir(run_dir)
    except UnsafePathError as e:
        print(f"trainctl bridge: {e}; not relaying", file=sys.stderr)
        return 2
    sock = RunFiles(run_dir).sock

    def not_responding(what: str) -> int:
        error = str(UnixTransport(sock).not_responding(what))
        print(f"trainctl bridge: {error}", file=sys.stderr)
        sys.stdout.buffer.write((json.dumps({"op": "hello", "ok": False, "error": error}) + "\n").encode())
        sys.stdout.buffer.flush()
        return 4

    async def relay() -> int:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(str(sock), limit=1 << 22), HELLO_TIMEOUT_S
            )
        except TimeoutError:
            return not_responding(f"its socket did not accept within {HELLO_TIMEOUT_S:g} s")
        except OSError as e:
            if not RunFiles(run_dir).events.exists():
                print(
                    f"trainctl bridge: no agent at {sock} and no journal there: {e.strerror}", file=sys.stderr
                )
                return 1
            # The run is over (or its agent died): answer with its journal, then end.
            from trainctl.client.connection import offline_lines, parse_hello

            first = sys.stdin.buffer.readline()
            sys.stdout.buffer.write("".join(offline_lines(run_dir, parse_hello(first))).encode())
            sys.stdout.buffer.flush()
            return 0
        loop = asyncio.get_running_loop()
        stdin = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
        out = sys.stdout.buffer
        # The hello goes through first, and its answer must come in time (a stopped agent
        # accepts, as its kernel does, but never answers).
        hello = await stdin.readline()
        if not hello:
            return 0  # the client went before it said hello
        writer.write(hello)
        try:
            first = await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT_S)
        except TimeoutError:
            writer.close()
            return not_responding(f"no hello within {HELLO_TIMEOUT_S:g} s")
        out.write(first)
        out.flush()

        async def up():
            while data := await stdin.read(65536):
                writer.write(data)
                await writer.drain()
            writer.write_eof()

        async def down():
            while data := await reader.read(65536):
                out.write(data)
                out.flush()

        up_task = asyncio.create_task(up())
        await down()
        up_task.cancel()
        return 0

    try:
        return asyncio.run(relay())
    except (BrokenPipeError, ConnectionError):
        return 0
