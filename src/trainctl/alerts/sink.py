"""The agent's alert sink: an EventBus sink that returns at once.

``AlertSink(ev)`` only puts the event on a queue.  A daemon thread feeds the pure
:class:`~.policy.AlertPolicy` and sends what it says is due through a short-lived helper
process (``python -m trainctl.alerts.send``, URLs on its stdin, never in argv) that
is killed after ``send_timeout_s``.  So the agent never imports apprise, and a receiver that
hangs or refuses costs a helper process and a thread's wait, never the event loop: detection
and recovery go on.  The first failure to send to each service is journaled once, as a
warning (through ``on_warning``, which the agent hands to its loop thread-safely).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from trainctl.alerts.policy import Alert, AlertPolicy
from trainctl.alerts.settings import redact, redact_text
from trainctl.core import events as E
from trainctl.system.process import ends_with_us

SEND_TIMEOUT_S = 20.0  # one message, all its services; the helper is killed past it
CLOSE_WAIT_S = 25.0  # at the agent's end: the last message, at most this long
_STOP = object()


def send_with_helper(urls: list[str], title: str, body: str, timeout: float = SEND_TIMEOUT_S) -> list[dict]:
    """Send one message to each URL from a helper process: ``[{"url": redacted, "ok",
    "error"}]`` (every URL failed, "timed out", when the helper runs past ``timeout``)."""
    payload = json.dumps({"urls": urls, "title": title, "body": body})
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    try:
        r = subprocess.run(
            [sys.executable, "-m", "trainctl.alerts.send", "--stdin"],
            input=payload,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            start_new_session=True,
            preexec_fn=ends_with_us(),  # never outlives the agent (killed -9)
        )
    except subprocess.TimeoutExpired as e:  # what it said before it was killed still counts
        done = _results(e.stdout)
        return done + [
            {"url": redact(u), "ok": False, "error": f"timed out after {timeout:.0f} s"}
            for u in urls[len(done) :]
        ]
    except OSError as e:
        return [{"url": redact(u), "ok": False, "error": f"cannot start the sender: {e}"} for u in urls]
    done = _results(r.stdout)
    if len(done) == len(urls):
        return done
    err = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1][:200]
    return done + [
        {"url": redact(u), "ok": False, "error": f"the sender failed: {redact_text(err)}"}
        for u in urls[len(done) :]
    ]


def _results(out: str | bytes | None) -> list[dict]:
    """The helper's ``R {...}`` lines: one per service, in order."""
    if isinstance(out, bytes):
        out = out.decode(errors="replace")
    found = []
    for line in (out or "").splitlines():
        if line.startswith("R "):
            try:
                found.append(json.loads(line[2:]))
            except ValueError:
                break
    return found


class AlertSink:
    """``sender(urls, title, body) -> results`` (the helper by default; tests may pass
    another), ``clock`` the time the policy sees, ``on_sent(alert, results)`` for the curious."""

    def __init__(
        self,
        urls: list[str],
        policy: AlertPolicy,
        *,
        on_warning: Callable[[E.Warning], None] | None = None,
        sender: Callable[[list[str], str, str], list[dict]] | None = None,
        clock: Callable[[], float] = time.time,
        on_sent: Callable[[Alert, list[dict]], None] | None = None,
    ) -> None:
        self.urls = list(urls)
        self.policy = policy
        self.on_warning = on_warning
        self.sender = sender or send_with_helper
        self.clock = clock
        self.on_sent = on_sent
        self.about = [redact(u) for u in self.urls]  # what may be shown of them
        self.on = sorted(policy.on)
        self.sent: list[tuple[Alert, list[dict]]] = []
        self._warned: set[str] = set()
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="trainctl-alerts", daemon=True)
        self._thread.start()

    def __call__(self, ev: E.Event) -> None:
        if ev.type not in E.EPHEMERAL:
            self._q.put(ev)  # never blocks: the policy and the sending are the thread's

    def close(self, timeout: float = CLOSE_WAIT_S) -> None:
        """Send what is held (the run ended), waiting at most ``timeout``."""
        self._q.put(_STOP)
        self._thread.join(timeout)

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        policy = self.policy
        while True:
            wake = policy.next_wake()
            wait = 1.0 if wake is None else min(1.0, max(0.0, wake - self.clock()))
            try:
                ev = self._q.get(timeout=wait)
            except queue.Empty:
                ev = None
            if ev is _STOP:
                break
            try:
                if ev is not None:
                    policy.feed(ev, self.clock())
                    while True:  # take what else is queued before deciding
                        try:
                            more = self._q.get_nowait()
                        except queue.Empty:
                            break
                        if more is _STOP:
                            self._q.put(_STOP)
                            break
                        policy.feed(more, self.clock())
                for alert in policy.due(self.clock()):
                    self._send(alert)
            except Exception as e:  # noqa: BLE001 - a bug here must not end the alerts thread
                self._warn("policy", f"alerts: {type(e).__name__}: {e}")
        try:
            for alert in policy.flush(self.clock()):
                self._send(alert)
        except Exception as e:  # noqa: BLE001 - nor may one in the final flush
            self._warn("policy", f"alerts: {type(e).__name__}: {e}")

    def _send(self, alert: Alert) -> None:
        results = self.sender(self.urls, alert.title, alert.body)
        self.sent.append((alert, results))
        if self.on_sent is not None:
            self.on_sent(alert, results)
        for r in results:
            if not r.get("ok"):
                self._warn(r.get("url", "?"), f"alert to {r.get('url')} not sent: {r.get('error')}")

    def _warn(self, key: str, text: str) -> None:
        if key in self._warned or self.on_warning is None:
            return
        self._warned.add(key)
        self.on_warning(
            E.Warning(
                self.clock(),
                "trainctl.alert_failed",
                "warning",
                text,
                "Check the alert URL (trainctl alerts test NAME); supervision "
                "goes on. Further failures to this service are not journaled.",
                source="trainctl",
            )
        )
