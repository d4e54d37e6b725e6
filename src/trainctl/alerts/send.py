"""The one place apprise is imported: a short-lived helper process.

``python -m trainctl.alerts.send --stdin``
    reads ``{"urls", "title", "body"}`` on stdin (URLs never in argv), sends the message to
    each URL, prints one JSON line: ``[{"url": redacted, "ok": bool, "error": str}]``.
``python -m trainctl.alerts.send --unsupervised --alert-file F --run-dir D [--pid P]``
    the holder's: its agent is gone while the trainer (pid P) runs; says so to the URLs in F.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys

from trainctl.alerts.settings import read_private_json, redact, redact_text

TIMEOUT_S = 5.0  # connect and read, each, per service


class _Last(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.text = ""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.text = redact_text(record.getMessage())[:300]
        except Exception:  # noqa: BLE001 - a log record that cannot be redacted is dropped
            pass


def send(urls: list[str], title: str, body: str, progress=None) -> list[dict]:
    """Each URL in turn; ``progress(result)`` after each (the helper prints it at once, so
    a caller that kills a helper stuck on a later service still knows the earlier ones)."""
    import apprise  # ~26 MB: only here, in this helper

    socket.setdefaulttimeout(TIMEOUT_S)
    last = _Last()
    logging.getLogger("apprise").addHandler(last)
    logging.getLogger("apprise").setLevel(logging.WARNING)
    out = []
    for url in urls:
        last.text = ""
        ap = apprise.Apprise()
        if not ap.add(url):
            out.append(
                {
                    "url": redact(url),
                    "ok": False,
                    "error": "apprise does not understand this URL (scheme or form)",
                }
            )
            continue
        for server in ap:  # bounded waits on the services that take them
            for attr in ("socket_connect_timeout", "socket_read_timeout"):
                if hasattr(server, attr):
                    setattr(server, attr, TIMEOUT_S)
        try:
            ok = bool(ap.notify(body=body, title=title))
        except Exception as e:  # noqa: BLE001 - a service plugin's bug is that URL's failure
            ok, last.text = False, redact_text(f"{type(e).__name__}: {e}")[:300]
        out.append({"url": redact(url), "ok": ok, "error": "" if ok else (last.text or "not accepted")})
        if progress is not None:
            progress(out[-1])
    return out


def _print_one(result: dict) -> None:
    print("R " + json.dumps(result), flush=True)


def unsupervised_message(about: dict, run_dir: str, pid: str | None) -> tuple[str, str]:
    job = about.get("job") or os.path.basename(run_dir.rstrip("/"))
    host = about.get("host") or socket.gethostname()
    title = f"trainctl {job}: UNSUPERVISED, its agent died"
    body = "\n".join(
        [
            f"job {job} on {host}",
            f"the agent supervising this run is gone (killed, or out of memory); the trainer"
            f"{f' (pid {pid})' if pid else ''} runs on, but nobody detects or recovers a stall now",
            f"look (and adopt it): {about.get('attach') or f'trainctl attach {run_dir}'}",
        ]
    )
    return title, body


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="trainctl.alerts.send")
    ap.add_argument("--stdin", action="store_true")
    ap.add_argument("--unsupervised", action="store_true")
    ap.add_argument("--alert-file")
    ap.add_argument("--run-dir")
    ap.add_argument("--pid")
    opts = ap.parse_args(argv)
    if opts.stdin:
        req = json.loads(sys.stdin.read())
        results = send(list(req["urls"]), str(req["title"]), str(req["body"]), _print_one)
    elif opts.unsupervised and opts.alert_file and opts.run_dir:
        about = read_private_json(opts.alert_file)
        title, body = unsupervised_message(about, opts.run_dir, opts.pid)
        results = send(list(about.get("urls", [])), title, body)
        for r in results:  # into holder.out: redacted
            print(
                f"trainctl alerts: unsupervised alert to {r['url']}: "
                f"{'sent' if r['ok'] else 'NOT sent: ' + r['error']}",
                file=sys.stderr,
                flush=True,
            )
    else:
        ap.error("give --stdin, or --unsupervised --alert-file F --run-dir D")
    print(json.dumps(results), flush=True)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
