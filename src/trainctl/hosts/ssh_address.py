"""SSH destinations and `ssh://` URLs as trainctl reads them (src/trainctl/hosts/ssh.py
connects): `[user@]host`, `ssh://[user@]host[:port][/RUN_DIR]`, and remote paths (`~/x` is
`x` under the remote home).  A bad one is a ValueError of one line."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit


def _split_hostport(netloc: str, url: str) -> tuple[str, int | None]:
    if netloc.startswith("["):  # [v6addr] or [v6addr]:port
        end = netloc.find("]")
        if end < 0:
            raise ValueError(f"{url}: unbalanced '[' in the host")
        host, rest = netloc[1:end], netloc[end + 1 :]
        if rest and not rest.startswith(":"):
            raise ValueError(f"{url}: unexpected {rest!r} after the host")
        port_text = rest[1:] if rest else ""
    else:
        host, _, port_text = netloc.partition(":")
    if not port_text:
        return host, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{url}: the port must be a number from 1 to 65535, not {port_text!r}")
    return host, int(port_text)


def _check_destination(dest: str, where: str) -> None:
    if not dest or dest.startswith("-") or any(c.isspace() or ord(c) < 32 for c in dest):
        raise ValueError(
            f"{where}: bad SSH destination {dest!r}: use an ssh_config alias, host or "
            "user@host (no spaces, not starting with '-')"
        )


def parse_attach_url(url: str) -> tuple[str, str | None]:
    """`ssh://[user@]host[:port][/RUN_DIR]` -> (destination, run_dir or None).

    The destination is `[user@]host`, or `ssh://[user@]host:port` when a port is given
    (SshHost turns that into `ssh -p`). The path is absolute (`ssh://box/data/runs/x` ->
    `/data/runs/x`); `ssh://box/~/runs/x` means `runs/x` under the remote home.
    """
    parts = urlsplit(url)
    if parts.scheme != "ssh":
        raise ValueError(f"{url}: not an ssh:// URL (expected ssh://[user@]host[:port][/run_dir])")
    if parts.query or parts.fragment:
        raise ValueError(f"{url}: '?' and '#' are not allowed in an ssh:// URL")
    user, at, hostport = parts.netloc.rpartition("@")
    host, port = _split_hostport(hostport, url)
    if not host:
        raise ValueError(f"{url}: no host (expected ssh://[user@]host[:port][/run_dir])")
    dest = f"{unquote(user)}@{host}" if at else host
    _check_destination(dest, url)
    path = unquote(parts.path)
    if path in ("", "/"):
        run_dir = None
    elif path == "/~" or path.startswith("/~/"):
        run_dir = path[3:].strip("/") or "."
    else:
        run_dir = path
    if port is not None:
        user_part = f"{unquote(user)}@" if at else ""
        host_part = f"[{host}]" if ":" in host else host
        dest = f"ssh://{user_part}{host_part}:{port}"
    return dest, run_dir


def _parse_destination(destination: str) -> tuple[str, int | None]:
    """`ssh://[user@]host[:port]` or a plain destination -> (destination, port)."""
    if destination.startswith("ssh://"):
        parts = urlsplit(destination)
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"{destination}: an SSH host has no path (use parse_attach_url)")
        user, at, hostport = parts.netloc.rpartition("@")
        host, port = _split_hostport(hostport, destination)
        dest = f"{unquote(user)}@{host}" if at else host
    else:
        dest, port = destination, None
    _check_destination(dest, destination)
    return dest, port


def _remote_path(path: str) -> str:
    """`~/x` -> `x` (ssh commands start in the remote home); others unchanged."""
    if path.startswith("~/"):
        path = path[2:].lstrip("/")
    if not path or path.startswith("~"):
        raise ValueError(f"remote path {path!r}: use an absolute path or one under ~/")
    return path
