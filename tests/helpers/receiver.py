"""A real alert receiver for tests: a threaded HTTP server on 127.0.0.1 taking apprise
``json://`` posts (``{"title", "message", "type", ...}``), and one that never answers."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self) -> None:
        self.posts: list[dict] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                try:
                    data = json.loads(body)
                except ValueError:
                    data = {"raw": body.decode(errors="replace")}
                data["_received"] = time.time()
                data["_path"] = self.path
                with outer.lock:
                    outer.posts.append(data)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"json://127.0.0.1:{self.port}/hook-secret-token"

    def wait(self, n: int, timeout: float = 30.0) -> list[dict]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if len(self.posts) >= n:
                    return list(self.posts)
            time.sleep(0.05)
        raise TimeoutError(f"{len(self.posts)} posts, wanted {n}: {self.posts}")

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def silent_receiver():
    """A listening socket that accepts and never answers: ``json://`` URL to it."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    try:
        yield f"json://127.0.0.1:{s.getsockname()[1]}/never-answers"
    finally:
        s.close()
