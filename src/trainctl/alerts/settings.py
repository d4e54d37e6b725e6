"""Where alert URLs come from, and how they are kept out of sight.

``alerts.toml`` in trainctl's config dir (0600; a looser file is refused)::

    bell = true                    # the dashboard rings the terminal bell on a stall or failure
    default = ["phone"]            # for runs that name no alerts
    [alert.phone]
    url = "ntfys://ntfy.sh/my-secret-topic"
    [alert.team]
    urls = ["slack://T000/B000/XXXX", "json://hooks.example.org/trainctl"]

A run's resolved URLs live in ``<run_dir>/alerts.json`` (0600): the agent sends to them, the
holder hands the file to the helper that says "unsupervised".  Everywhere else (journal,
spec, logs, status) a URL appears only :func:`redact`\\ ed: scheme and host, token elided.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from trainctl.config import ALERT_KINDS
from trainctl.config.validation import show
from trainctl.core.statefile import check_state_dir, write_atomic
from trainctl.store.paths import config_dir, open_private

ALERTS_TOML = "alerts.toml"
RUN_FILE = "alerts.json"


class AlertConfigError(ValueError):
    """alerts.toml or an --alert is wrong; the message says what to do (never the URL)."""


def redact(url: str) -> str:
    """``scheme://host/…``: the scheme and the host (port kept) when it is a host name or
    address; everything else elided (user, password, path, query, and the "host" of
    services that put a token there, ``tgram://BOTTOKEN/…``)."""
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)(.*)$", url.strip(), re.S)
    if not m:
        return "<not a URL>"
    scheme, netloc, rest = m.groups()
    host = netloc.rsplit("@", 1)[-1]
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host
    if not (
        re.fullmatch(r"[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+(:\d+)?", host)
        and "." in name
        or re.fullmatch(r"(localhost|\[[0-9A-Fa-f:.]+\])(:\d+)?", host)
    ):
        return f"{scheme}://…"
    return f"{scheme}://{host}" + ("/…" if rest.strip("/") or "@" in netloc else "")


def redact_text(text: str) -> str:
    """Every URL in ``text`` redacted (for messages from apprise or the helper)."""
    return re.sub(r"[A-Za-z][A-Za-z0-9+.-]*://\S+", lambda m: redact(m.group(0)), text)


def is_url(ref: str) -> bool:
    return "://" in ref


@dataclass
class UserAlerts:
    """alerts.toml: named entries, the default names, the bell."""

    named: dict[str, tuple[str, ...]] = field(default_factory=dict)
    default: tuple[str, ...] = ()
    bell: bool = True
    path: Path | None = None
    skipped: list[str] = field(default_factory=list)  # the bad entries, one line each (never moved)


def user_alerts_path() -> Path:
    return config_dir() / ALERTS_TOML


def load_user_alerts(path: Path | None = None) -> UserAlerts:
    """alerts.toml (none: no alerts, bell on).  AlertConfigError when it cannot be used at
    all: unreadable (a FIFO or a device is refused, never waited on), not TOML, readable by
    others (it holds tokens), in a config directory others could write.  The user's file is
    never moved nor changed: a bad entry is skipped and named in ``skipped``, the rest used."""
    path = path or user_alerts_path()
    try:
        check_state_dir(path.parent)
        fd = open_private(path, os.O_RDONLY)
    except FileNotFoundError:
        return UserAlerts(path=path)
    except OSError as e:
        raise AlertConfigError(f"{path}: {e}") from None
    with os.fdopen(fd, "rb") as f:
        if stat.S_IMODE(os.fstat(f.fileno()).st_mode) & 0o077:
            raise AlertConfigError(f"{path}: readable by others (it holds alert tokens): chmod 600 {path}")
        try:
            data = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise AlertConfigError(f"{path}: not valid TOML: {e}") from None
    return _user_alerts(path, data)


def _user_alerts(path: Path, data: dict) -> UserAlerts:
    out = UserAlerts(path=path)
    skip = out.skipped.append
    for key in sorted(set(data) - {"bell", "default", "alert"}):
        skip(f"{path}: unknown key {key!r} skipped: allowed are bell, default and [alert.NAME] tables")
    if "bell" in data:
        if isinstance(data["bell"], bool):
            out.bell = data["bell"]
        else:
            skip(f"{path}: bell skipped: must be true or false")
    entries = data.get("alert", {})
    if not isinstance(entries, dict):
        skip(f"{path}: alert skipped: write each entry as an [alert.NAME] table")
        entries = {}
    for name, entry in entries.items():
        if not isinstance(entry, dict) or set(entry) - {"url", "urls"} or not entry:
            skip(f'{path}: [alert.{name}] skipped: give url = "..." or urls = [...]')
            continue
        more = entry.get("urls", [])
        urls = ([entry["url"]] if "url" in entry else []) + (more if isinstance(more, list) else [None])
        if not all(isinstance(u, str) and is_url(u) for u in urls):
            skip(
                f"{path}: [alert.{name}] skipped: every url must be a string SCHEME://... (apprise's syntax)"
            )
            continue
        out.named[name] = tuple(urls)
    default = data.get("default", [])
    if isinstance(default, str):
        default = [default]
    if not isinstance(default, list):
        skip(f"{path}: default skipped: must be a list of alert names")
        default = []
    for n in default:
        if isinstance(n, str) and n in out.named:
            out.default += (n,)
        else:
            skip(f"{path}: default {show(n)} skipped: no such [alert.NAME] usable in this file")
    return out


def resolve(refs: list[str] | tuple[str, ...], user: UserAlerts) -> list[str]:
    """Names (from alerts.toml) and raw URLs → URLs, in order, without repeats."""
    urls: list[str] = []
    for ref in refs:
        if is_url(ref):
            found: tuple[str, ...] = (ref,)
        elif ref in user.named:
            found = user.named[ref]
        else:
            where = user.path or user_alerts_path()
            known = ", ".join(sorted(user.named)) or "none"
            raise AlertConfigError(
                f"no alert named {ref!r} in {where} (known: {known}); give a "
                "name from there or an apprise URL"
            )
        urls += [u for u in found if u not in urls]
    return urls


def run_alerts(job_alerts: dict | None, cli_refs: list[str], user: UserAlerts) -> tuple[list[str], list[str]]:
    """The run's (urls, on): the job's urls and names plus --alert; alerts.toml's default
    when neither names any."""
    job_alerts = job_alerts or {}
    refs = [*job_alerts.get("urls", ()), *job_alerts.get("use", ()), *cli_refs]
    if not refs and "use" not in job_alerts and "urls" not in job_alerts:
        refs = list(user.default)
    on = list(job_alerts.get("on") or ALERT_KINDS)
    return resolve(refs, user), on


def write_private(path: Path, data: dict) -> None:
    """``data`` as JSON in a new 0600 file (replacing one there)."""
    write_atomic(path, json.dumps(data), durable=False)


def write_run_alerts(run_dir: Path, urls: list[str], on: list[str], **about) -> Path:
    path = Path(run_dir) / RUN_FILE
    write_private(path, {"urls": urls, "on": on, **about})
    return path


def read_private_json(path: Path | str) -> dict:
    """A 0600 JSON file of this user (alerts.json, or one sent from the client)."""
    fd = open_private(path, os.O_RDONLY)
    with os.fdopen(fd, "r") as f:
        if stat.S_IMODE(os.fstat(f.fileno()).st_mode) & 0o077:
            raise AlertConfigError(f"{path}: readable by others; alert files must be 0600")
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("urls", []), list):
        raise AlertConfigError(f"{path}: not an alerts file")
    return data


def read_run_alerts(run_dir: Path) -> dict | None:
    """The run's alerts.json, or None when it has none (or no URLs)."""
    try:
        data = read_private_json(Path(run_dir) / RUN_FILE)
    except FileNotFoundError:
        return None
    return data if data.get("urls") else None
