"""What `trainctl serve` costs the agent and the machine (prints figures; asserts nothing).

Usage: .venv/bin/python bench/bench_serve.py [--window 15]

A real run of the PyTorch loop (tests/helpers/scripts/train_loop.py, one worker) under a
headless agent; then, each for ``--window`` seconds: no serve, serve with no browser, serve
with one headless Chromium tab, with two tabs.  For each: the agent's connected clients (its
Unix socket connections, less the listening one and the holder's), the agent's CPU, serve's
CPU and memory, the dashboard processes' (one per tab) CPU and memory.  Needs Chromium and
playwright (the `test` extra; .ci/install-chromium.sh).  Everything it started is killed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_tables import Recorder, add_docs_flag

DOC_TABLES = {
    "serve": (
        "",
        "agent sockets",
        "agent CPU %",
        "serve CPU %",
        "serve MiB",
        "tabs",
        "dashboards CPU %",
        "dashboards MiB",
    )
}

ROOT = Path(__file__).resolve().parents[1]
LOOP = ROOT / "tests" / "helpers" / "scripts" / "train_loop.py"


def trainctl(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trainctl", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def wait_for(predicate, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit(f"bench_serve: no {what} within {timeout} s")


def cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def rss_mib(procs: list[psutil.Process]) -> float:
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def connections(agent: psutil.Process) -> int:
    """The agent's Unix sockets: its listening socket, its own, one per connected client."""
    return len(agent.net_connections(kind="unix"))


def measure(
    name: str, window: float, agent: psutil.Process, serve: psutil.Process | None, page=None
) -> list[object]:
    serve_tree = [serve] if serve else []
    tabs = serve.children(recursive=True) if serve else []
    a0, s0, d0 = cpu_s([agent]), cpu_s(serve_tree), cpu_s(tabs)
    if page is not None:
        page.wait_for_timeout(window * 1000)  # the page runs (and draws) meanwhile
    else:
        time.sleep(window)
    a1, s1, d1 = cpu_s([agent]), cpu_s(serve_tree), cpu_s(tabs)
    row: list[object] = [
        name,
        connections(agent),
        f"{100 * (a1 - a0) / window:.1f}",
        f"{100 * (s1 - s0) / window:.1f}",
        f"{rss_mib(serve_tree):.0f}",
        len(tabs),
        f"{100 * (d1 - d0) / window:.1f}",
        f"{rss_mib(tabs):.0f}",
    ]
    print(" | ".join(map(str, row)), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--window", type=float, default=15.0)
    add_docs_flag(ap)
    args = ap.parse_args()
    window = args.window
    rec = Recorder(DOC_TABLES, args.docs)
    rows: list[list[object]] = []
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        raise SystemExit("bench_serve: no chromium (.ci/install-chromium.sh)")
    base = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    env = dict(os.environ, TRAINCTL_CONFIG_DIR=str(base / "config"), TRAINCTL_RUNS_DIR=str(base / "runs"))
    run_dir = base / "run"
    loop = [sys.executable, str(LOOP), "--epochs", "100", "--batches", "400", "--batch-time", "0.03"]
    run = trainctl(["run", "--headless", "--no-tmux", "--run-dir", str(run_dir), "--", *loop], env)
    serve = None
    try:
        wait_for(lambda: (run_dir / "agent.sock").exists(), 60, "agent socket")
        agent = psutil.Process(json.loads((run_dir / "agent.json").read_text())["pid"])
        time.sleep(3)
        print(f"window {window:.0f} s; CPU in % of one core")
        idle = connections(agent)
        rows.append(measure("no serve", window, agent, None))
        serve = trainctl(["serve", str(run_dir), "--port", "0"], env)
        url = wait_for(lambda: re.search(r"http://\S+/", serve.stdout.readline()), 30, "URL").group(0)
        serve_p = psutil.Process(serve.pid)
        rows.append(measure("serve, no browser", window, agent, serve_p))
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
            try:
                for tabs in (1, 2):
                    page = browser.new_page(viewport={"width": 1280, "height": 800})
                    page.goto(url)
                    page.wait_for_function("document.body.classList.contains('-first-byte')", timeout=60_000)
                    page.wait_for_timeout(3000)
                    rows.append(measure(f"serve, {tabs} tab{'s' * (tabs > 1)}", window, agent, serve_p, page))
            finally:
                browser.close()
        print(
            f"(sockets: the agent's Unix sockets; {idle} before serve: its listening one and its own links)"
        )
        rec.publish("serve", rows)
    finally:
        if serve is not None:
            serve.send_signal(signal.SIGINT)  # serve ends its dashboards itself
            serve.wait(30)
        subprocess.run(
            [sys.executable, "-m", "trainctl", "ctl", str(run_dir), "stop"], env=env, capture_output=True
        )
        try:
            run.wait(60)
        finally:
            for p in psutil.process_iter():
                try:
                    if p.pid == run.pid or p.environ().get("TRAINCTL_RUN_DIR") == str(run_dir):
                        p.kill()
                except (psutil.Error, OSError):
                    continue
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
