"""`trainctl serve` (issue 32): the dashboard of a real run in a real headless Chromium.

One run of the PyTorch loop (preset A, fallback B): the page served at the printed URL draws the
dashboard (the header's state and preset reach the browser's terminal), `f` then `y` typed in the
browser fall back to preset B and the journal says so; the page asks for nothing off the machine;
without the token every URL is refused (403); the token is in no file of the run directory and in
no process's argv or environment; Ctrl-C ends serve and every dashboard process it started.
On a finished run's directory: a closed tab ends its dashboard, and so does serve's SIGKILL; a
dashboard that cannot start (the directory turned writable by others) says why in the page.
Without a browser: a run directory that is not one, a port in use, and `--host 0.0.0.0`'s warning.
"""

from __future__ import annotations

import re
import signal
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import ROOT, read_journal, run_trainctl, start_trainctl, wait_until
from trainctl.core import events as E
from trainctl.store.spec import RunSpec

pytestmark = pytest.mark.e2e

TRAIN_LOOP = ROOT / "tests" / "helpers" / "scripts" / "train_loop.py"
URL = re.compile(r"http://(\S+?):(\d+)/([A-Za-z0-9_-]+)/")
ESCAPES = re.compile(
    r"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78]"
)


def served_url(tc, timeout: float = 30) -> re.Match:
    wait_until(lambda: URL.search(tc.stdout) or tc.poll() is not None, timeout, what="serve's URL")
    found = URL.search(tc.stdout)
    assert found, f"no URL printed; rc={tc.poll()}\nstdout: {tc.stdout}\nstderr: {tc.stderr}"
    return found


def status_of(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


class Terminal:
    """What the served dashboard sent the browser's terminal (its websocket's frames), as text."""

    def __init__(self, page) -> None:
        self.frames: list[bytes] = []
        page.on("websocket", lambda ws: ws.on("framereceived", self._add))

    def _add(self, payload) -> None:
        self.frames.append(payload if isinstance(payload, bytes) else payload.encode())

    def text(self) -> str:
        return ESCAPES.sub("", b"".join(self.frames).decode("utf-8", "replace"))


def own_files_text(run_dir: Path) -> str:
    return "\n".join(
        p.read_bytes().decode("utf-8", "replace")
        for p in run_dir.rglob("*")
        if p.is_file() and p.stat().st_size < 50e6
    )


def process_texts(procs: list[psutil.Process]) -> list[str]:
    """The argv and environment of each process (what `ps e` and /proc show others or root)."""
    out = []
    for p in procs:
        try:
            out.append(" ".join(p.cmdline()) + "\n" + "\n".join(f"{k}={v}" for k, v in p.environ().items()))
        except psutil.Error:
            continue
    return out


@pytest.mark.timeout(180)
def test_served_dashboard_in_a_real_browser(browser_page, tmp_path):
    run_dir = tmp_path / "run"
    loop = ["--epochs", "3", "--batches", "400", "--batch-time", "0.03"]
    run = start_trainctl(
        ["run", "--headless", "--no-tmux", "--preset", "A", "--fallback", "B", "--run-dir", run_dir, "--"]
        + [sys.executable, str(TRAIN_LOOP), *loop]
    )
    wait_until(lambda: (run_dir / "agent.sock").exists(), 60, what="the agent's socket")
    serve = start_trainctl(["serve", str(run_dir), "--port", "0"])
    found = served_url(serve)
    host, port, token = found.group(1), found.group(2), found.group(3)
    assert host == "127.0.0.1" and f"ssh -L {port}:127.0.0.1:{port}" in serve.stdout

    # Without the token (or with a wrong one) every URL is refused.
    base, wrong = f"http://127.0.0.1:{port}", token[:-1] + ("A" if token[-1] != "A" else "B")
    upgrade = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13"}
    upgrade["Sec-WebSocket-Key"] = "dGhlIHNhbXBsZSBub25jZQ=="
    for path in ("/", f"/{wrong}/", "/static/js/textual.js", f"/{wrong}/static/js/textual.js", "/ws"):
        assert status_of(base + path) == 403, path
    assert status_of(f"{base}/{wrong}/ws", upgrade) == 403
    assert status_of(f"{base}/{token}/static/js/textual.js") == 200

    page, terminal = browser_page.page, Terminal(browser_page.page)
    page.goto(found.group(0))
    page.wait_for_function("document.body.classList.contains('-first-byte')", timeout=60_000)
    browser_page.wait_until(
        lambda: "RUNNING" in terminal.text() and "preset A" in terminal.text(), 60, what="the header"
    )
    canvas = page.locator(".xterm-screen").bounding_box()
    assert canvas is not None and canvas["width"] > 600 and canvas["height"] > 300
    dashboards = [p for p in serve.tree() if p.pid != serve.pid]
    assert dashboards, "no dashboard process under serve"

    # f (fallback), confirmed with y, typed in the browser: the agent restarts the trainer on B.
    page.locator(".xterm-screen").click()
    page.keyboard.press("f")
    browser_page.wait_until(lambda: "Fall back to preset B?" in terminal.text(), 30, what="the confirmation")
    page.keyboard.press("y")
    wait_until(
        lambda: any(e.type == "start" and e.preset == "B" for e in read_journal(run_dir)),
        90,
        what="B's start",
    )
    events = read_journal(run_dir)
    assert [e.preset for e in events if isinstance(e, E.Restart)] == ["B"]
    assert browser_page.external == [], browser_page.external  # nothing off the machine (no CDN)

    # The token: printed once, on serve's stdout; nowhere in the run's files or any process's argv/env.
    assert token not in own_files_text(run_dir)
    seen = serve.tree() + run.tree(scan_env=True)
    assert all(token not in text for text in process_texts(seen))
    assert token not in serve.stderr

    # Ctrl-C: serve ends, and so does every dashboard process it started (own sessions).
    pids = serve.tree_pids()
    serve.signal(signal.SIGINT)
    result = serve.wait(30)
    assert result.returncode == 0, result.describe()
    wait_until(lambda: not [p for p in pids if psutil.pid_exists(p)], 10, what="serve's processes to end")
    assert run.poll() is None  # the run goes on


def fake_run(run_dir: Path) -> None:
    """A finished run's directory (a journal, no agent): serve needs no live agent to start."""
    run_dir.mkdir(mode=0o700)
    RunSpec(job_name="served", kind="command", command=["x"]).save(run_dir / "spec.json")
    events = [E.Start(1.0, 1, 4242, None, ("x",)), E.Exit(2.0, 0, None), E.State(2.1, "SUCCEEDED", "")]
    (run_dir / "events.jsonl").write_text("".join(E.encode(e) + "\n" for e in events))


@pytest.mark.timeout(90)
def test_serve_says_what_is_wrong(tmp_path):
    missing = run_trainctl(["serve", str(tmp_path / "nowhere")], timeout=30)
    assert missing.returncode == 2 and "no such directory" in missing.stderr, missing.describe()

    run_dir = tmp_path / "run"
    fake_run(run_dir)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = run_trainctl(["serve", str(run_dir), "--port", str(port)], timeout=30)
    assert busy.returncode == 2 and f"port {port} on 127.0.0.1 is in use" in busy.stderr, busy.describe()

    # --host 0.0.0.0: reachable from the network, says so, and still refuses a request without the token.
    wide = start_trainctl(["serve", str(run_dir), "--host", "0.0.0.0", "--port", "0"])
    found = served_url(wide)
    assert found.group(1) == socket.gethostname()
    wait_until(
        lambda: "anyone with the URL and token can control this run" in wide.stderr, 10, what="warning"
    )
    outside = next(
        (
            a.address
            for addrs in psutil.net_if_addrs().values()
            for a in addrs
            if a.family == socket.AF_INET and not a.address.startswith("127.")
        ),
        "127.0.0.1",
    )
    assert status_of(f"http://{outside}:{found.group(2)}/") == 403
    assert status_of(f"http://{outside}:{found.group(2)}/{found.group(3)}/") == 200
    wide.signal(signal.SIGTERM)
    assert wide.wait(30).returncode == 0


@pytest.mark.timeout(120)
def test_a_closed_tab_or_a_killed_serve_leaves_no_dashboard(browser_page, tmp_path):
    """Closing a tab ends its dashboard process while serve goes on; serve killed without a word
    (SIGKILL) takes a connected tab's dashboard, in a session of its own, with it (the kernel's
    parent-death signal)."""
    run_dir = tmp_path / "run"
    fake_run(run_dir)
    serve = start_trainctl(["serve", str(run_dir), "--port", "0"])
    url = served_url(serve).group(0)

    def open_tab():
        page = browser_page.page.context.new_page()
        page.goto(url)
        page.wait_for_function("document.body.classList.contains('-first-byte')", timeout=60_000)
        dashboards = [p for p in serve.tree() if p.pid != serve.pid]
        assert dashboards and all("attach" in p.cmdline() for p in dashboards)
        return page, dashboards

    page, dashboards = open_tab()
    page.close()
    gone, alive = psutil.wait_procs(dashboards, timeout=15)
    assert not alive and serve.poll() is None, [p.cmdline() for p in alive]

    page, dashboards = open_tab()
    serve.signal(signal.SIGKILL)
    gone, alive = psutil.wait_procs(dashboards, timeout=15)
    assert not alive, [p.cmdline() for p in alive]


@pytest.mark.timeout(90)
def test_a_dashboard_that_cannot_start_says_why_in_the_page(browser_page, tmp_path):
    """The run directory turned writable by others after serve started: each tab's `attach`
    refuses it; the page shows attach's own line and offers to open it again (no endless
    "connecting…")."""
    run_dir = tmp_path / "run"
    fake_run(run_dir)
    serve = start_trainctl(["serve", str(run_dir), "--port", "0"])
    url = served_url(serve).group(0)
    run_dir.chmod(0o777)
    page, terminal = browser_page.page, Terminal(browser_page.page)
    page.goto(url)
    page.wait_for_function("document.body.classList.contains('-closed')", timeout=60_000)
    browser_page.wait_until(
        lambda: "writable by group or others" in terminal.text(), 10, what="attach's line"
    )
    assert page.locator(".closed-dialog button").is_visible()
