"""`trainctl alerts test [NAME|URL ...]`: a test message to each alert."""

from __future__ import annotations

import os

from trainctl.cli.common import UsageError, note


def cmd_alerts(args) -> int:
    """`trainctl alerts test [NAME|URL ...]`: a test message to each; says which accepted it."""
    from trainctl.alerts.settings import AlertConfigError, is_url, load_user_alerts, redact, resolve
    from trainctl.alerts.sink import send_with_helper

    try:
        user = load_user_alerts()
        for text in user.skipped:
            note(text)
        refs = args.refs or sorted(user.named)
        if not refs:
            raise UsageError(
                f'no alerts configured: add [alert.NAME] url = "..." to '
                f"{user.path} (0600), or give an apprise URL"
            )
        if any(is_url(r) for r in args.refs):
            note("a URL on the command line is visible in the process list; prefer a name")
        pairs = [(ref, resolve([ref], user)) for ref in refs]
    except AlertConfigError as e:
        raise UsageError(str(e)) from None
    host = os.uname().nodename
    ok_all = True
    for ref, urls in pairs:
        label = redact(ref) if is_url(ref) else ref
        results = send_with_helper(
            urls,
            f"trainctl: test alert ({label})",
            f"A test message from trainctl on {host}. Alerts to {label} reach you.",
        )
        for r in results:
            ok_all &= bool(r["ok"])
            # a URL given is its own label (redacted alike): said once
            who = r["url"] if r["url"] == label else f"{label}: {r['url']}"
            print(f"{who}: " + ("accepted" if r["ok"] else f"NOT accepted: {r['error']}"))
    return 0 if ok_all else 1
