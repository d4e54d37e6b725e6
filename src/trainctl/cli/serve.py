"""`trainctl serve [RUN_DIR | ssh://HOST[/RUN_DIR]]`: the dashboard in a browser.  Each browser
connection runs `trainctl attach RUN` (this Python's own trainctl) behind a token-guarded
web server (src/trainctl/tui/serve.py); the URL with its token is printed, nowhere else."""

from __future__ import annotations

import asyncio
import errno
import secrets
import shlex
import signal
import socket
import sys

from trainctl.cli.common import UsageError, note

ANY_ADDRESS = ("0.0.0.0", "::", "")


def cmd_serve(args) -> int:
    from trainctl.hosts.registry import locate

    host, run_dir = locate(args.target)  # UsageError: not a run directory (one line)
    target = shlex.split(host.attach_hint(run_dir))[-1]  # `... attach TARGET`: the run, as attach takes it
    argv = [sys.executable, "-m", "trainctl", "attach", target]
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: a port is 0 (any free one) to 65535")
    return asyncio.run(_serve(argv, target, args.host, args.port))


async def _serve(argv: list[str], target: str, address: str, port: int) -> int:
    from trainctl.tui.serve import DashboardServer

    server = DashboardServer(
        argv, title=f"trainctl: {target}", token=secrets.token_urlsafe(24), host=address, port=port
    )
    try:
        port = await server.start()
    except OSError as e:
        raise UsageError(_bind_error(e, address, port)) from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    try:
        _say_where(server.path, target, address, port)
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        await server.stop()
    note("serve stopped (the run goes on)")
    return 0


def _say_where(path: str, target: str, address: str, port: int) -> None:
    """The URL (stdout: the only place the token is written), how to reach it, and on an
    address other than the loopback, that the network can reach it."""
    here = socket.gethostname()
    shown = here if address in ANY_ADDRESS else (f"[{address}]" if ":" in address else address)
    print(f"trainctl serve: the dashboard of {target}, in a browser:\n\n    http://{shown}:{port}{path}\n")
    if address in ("127.0.0.1", "localhost", "::1"):
        print(
            f"Only this machine can reach it. From a laptop: `ssh -L {port}:127.0.0.1:{port} {here}`,\n"
            "then open that URL in the laptop's browser."
        )
    else:
        note(
            f"reachable from the network on {address or '*'}:{port}: anyone with the URL and token can "
            "control this run (plain http: the token crosses the network unencrypted; `ssh -L` is safer)"
        )
    print(
        "Each browser tab is one dashboard: one client of the agent. Ctrl-C stops serving; the run goes on.",
        flush=True,
    )


def _bind_error(e: OSError, address: str, port: int) -> str:
    if e.errno == errno.EADDRINUSE:
        return f"port {port} on {address} is in use (another trainctl serve?): choose one with --port N (0: any free port)"
    if e.errno in (errno.EADDRNOTAVAIL, errno.EACCES) or isinstance(e, socket.gaierror):
        return f"cannot listen on {address}:{port}: {e.strerror or e}"
    return f"cannot listen on {address}:{port}: {e}"
