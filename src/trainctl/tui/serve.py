"""The dashboard in a browser (`trainctl serve`, src/trainctl/cli/serve.py): an HTTP server
(aiohttp, through textual-serve) whose page is a terminal (xterm.js) in which each browser
connection runs its own dashboard process, the command it is given (`trainctl attach RUN`),
with Textual's web driver.  Every key of the dashboard works as in a terminal; each
connection is one dashboard, one client of the agent.

Every URL lives under a secret token: ``/TOKEN/`` (the page), ``/TOKEN/ws`` (the session's
websocket), ``/TOKEN/static/...`` (textual-serve's own script, stylesheet and fonts); any
other request is refused with 403, so a guess, a port scan or another user of the machine
gets nothing.  The token is held in this process's memory only: never in the argv or the
environment of the dashboard processes (they do not need it), never logged (no access log).
The page asks for nothing off this server (textual-serve's page takes its font from
fonts.googleapis.com; serve_page.html takes it from the package's static files).

Each dashboard process runs in a session of its own: when its connection closes it is
asked to quit, then killed with its group if it has not within ``QUIT_WAIT``; ``stop()``
does the same to all of them before the server closes, and the kernel sends each SIGTERM
when serve dies without a word (SIGKILL), so nothing is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import html
import json
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from string import Template

from aiohttp import WSMsgType, web
from textual_serve.app_service import AppService
from textual_serve.download_manager import DownloadManager

from trainctl.system.process import die_with_parent

PAGE = Template((Path(__file__).with_name("serve_page.html")).read_text(encoding="utf-8"))
QUIT_WAIT = 3.0
"""Seconds a dashboard process has to quit after its connection closed, before it is killed."""
KILL_WAIT = 2.0
"""Seconds after SIGTERM before SIGKILL."""
NO_STORE = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}
log = logging.getLogger("trainctl.serve")


def static_dir() -> Path:
    """textual-serve's static files: its xterm.js bundle (textual.js), xterm.css, fonts."""
    import textual_serve

    return Path(textual_serve.__file__).parent / "static"


class StderrTail:
    """A dashboard process's stderr as AppService reads it (``read(n)``), its last 4 KiB kept."""

    def __init__(self) -> None:
        self.stream: asyncio.StreamReader | None = None
        self.tail = b""

    async def read(self, n: int = -1) -> bytes:
        assert self.stream is not None
        data = await self.stream.read(n)
        self.tail = (self.tail + data)[-4096:]
        return data


class DashboardSession(AppService):
    """One browser connection's dashboard process (textual-serve's AppService), started from
    an argv (no shell) in a session of its own, so that it and its children can be ended."""

    def __init__(self, argv: Sequence[str], **kwargs) -> None:
        super().__init__(" ".join(argv), **kwargs)
        self.argv = list(argv)
        self.stderr = StderrTail()
        self.exited = False  # the app said "exit" (q): it ended as a dashboard does

    async def _open_app_process(self, width: int = 80, height: int = 24) -> asyncio.subprocess.Process:
        self._process = process = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._build_environment(width=width, height=height),
            start_new_session=True,
            preexec_fn=die_with_parent,  # SIGTERM when serve dies, even by SIGKILL
        )
        assert process.stdin is not None and process.stderr is not None
        self._stdin = process.stdin
        self.stderr.stream = process.stderr
        process.stderr = self.stderr  # type: ignore[assignment]  # AppService.run only calls read(n)
        return process

    async def on_meta(self, data: bytes) -> None:
        with contextlib.suppress(ValueError):
            self.exited = self.exited or json.loads(data).get("type") == "exit"
        await super().on_meta(data)

    async def run(self) -> None:
        """AppService's, then for a dashboard that ended without saying "exit" (it could not
        start: the run directory refused, trainctl broken): its last stderr lines in the
        browser's terminal, and the connection closed (the page offers to open it again)."""
        await super().run()
        if self.exited:
            return
        said = self.stderr.tail.decode("utf-8", "replace").strip() or "the dashboard ended"
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.remote_write_bytes(("\x1b[0m\r\n" + said.replace("\n", "\r\n") + "\r\n").encode())
            await self.remote_close()

    async def end(self) -> None:
        """Ask the dashboard to quit; kill its process group if it has not within QUIT_WAIT."""
        process = self._process
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stop(), QUIT_WAIT)
        if process is None or process.returncode is not None:
            return
        for sig, wait in ((signal.SIGTERM, KILL_WAIT), (signal.SIGKILL, None)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                await asyncio.wait_for(process.wait(), wait)
                return
            except TimeoutError:
                continue


class DashboardServer:
    """The server of `trainctl serve`: ``start()`` binds (OSError when it cannot: the port is
    in use, the address is not this machine's), ``stop()`` ends every dashboard, then the server."""

    def __init__(self, argv: Sequence[str], *, title: str, token: str, host: str, port: int) -> None:
        self.argv = list(argv)
        self.title = title
        self.host = host
        self.port = port
        self._token = token
        self._sessions: set[DashboardSession] = set()
        self._downloads = DownloadManager()
        self._runner: web.AppRunner | None = None

    @property
    def path(self) -> str:
        """The page's path: ``/TOKEN/``."""
        return f"/{self._token}/"

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        prefix = f"/{self._token}"
        app.add_routes(
            [
                web.get(prefix, self._to_page),
                web.get(prefix + "/", self._page),
                web.get(prefix + "/ws", self._websocket),
                web.static(prefix + "/static", static_dir(), show_index=False),
            ]
        )
        return app

    async def start(self) -> int:
        """Listen; returns the port (the one the system chose for port 0)."""
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except BaseException:
            await self._runner.cleanup()
            self._runner = None
            raise
        if self._runner.addresses:
            self.port = self._runner.addresses[0][1]
        return self.port

    async def stop(self) -> None:
        """End every dashboard process (asked to quit, then killed), then the server."""
        await asyncio.gather(*(s.end() for s in list(self._sessions)), return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """403 for every request whose path does not start with the token; the rest uncached."""
        first = request.path.split("/", 2)[1] if request.path.startswith("/") else ""
        if not hmac.compare_digest(first.encode(), self._token.encode()):
            return web.Response(
                status=403,
                text="403: this trainctl serve needs the URL it printed when it started (with its token)\n",
                headers=NO_STORE,
            )
        response = await handler(request)
        if not response.prepared:
            response.headers.update(NO_STORE)
        return response

    async def _to_page(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(self.path, headers=NO_STORE)

    async def _page(self, request: web.Request) -> web.Response:
        scheme = "wss" if request.secure else "ws"
        text = PAGE.substitute(
            title=html.escape(self.title),
            websocket_url=html.escape(f"{scheme}://{request.host}{self.path}ws"),
            font_size=_int(request.query.get("fontsize", ""), 16),
        )
        return web.Response(text=text, content_type="text/html", headers=NO_STORE)

    async def _websocket(self, request: web.Request) -> web.WebSocketResponse:
        """One dashboard process for this connection, its terminal's bytes both ways."""
        websocket = web.WebSocketResponse(heartbeat=15)
        await websocket.prepare(request)
        session = DashboardSession(
            self.argv,
            write_bytes=websocket.send_bytes,
            write_str=websocket.send_str,
            close=websocket.close,
            download_manager=self._downloads,
        )
        self._sessions.add(session)
        try:
            await session.start(
                _int(request.query.get("width", ""), 80), _int(request.query.get("height", ""), 24)
            )
            await _relay(websocket, session)
        finally:
            await session.end()
            self._sessions.discard(session)
            await websocket.close()
        return websocket


async def _relay(websocket: web.WebSocketResponse, session: DashboardSession) -> None:
    """The browser's messages to the dashboard process: keys and mouse (stdin), the
    terminal's size, focus; until the browser goes."""
    async for message in websocket:
        if message.type != WSMsgType.TEXT:
            continue
        try:
            kind, *rest = message.json()
        except (ValueError, TypeError):
            continue  # not a list: not textual.js's
        if kind == "stdin" and rest and isinstance(rest[0], str):
            await session.send_bytes(rest[0].encode("utf-8"))
        elif kind == "resize" and rest and isinstance(rest[0], dict):
            await session.set_terminal_size(_int(rest[0].get("width"), 80), _int(rest[0].get("height"), 24))
        elif kind == "ping" and rest:
            await websocket.send_json(["pong", rest[0]])
        elif kind == "blur":
            await session.blur()
        elif kind == "focus":
            await session.focus()


def _int(value: object, default: int) -> int:
    try:
        return max(1, min(int(str(value)), 1000))
    except (TypeError, ValueError):
        return default
