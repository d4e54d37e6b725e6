"""Which host a target means: the one place that chooses where a run lives.

What a user typed maps to a host here, and only here: a run directory (a Slurm run's is the
Slurm host's, any other this machine's), ``ssh://HOST/RUN`` (a box), ``--host HOST`` and a
destination of hosts.toml (a box: DEFAULT_REMOTE), ``--slurm`` / a job's ``[slurm]``
(``slurm:``), a row of `ls` (its ``where``).  Each kind of host registers how it claims a
target, and which of its hosts `ls` asks; a new host is one file and one ``register`` line
(a test registers its own: tests/e2e/test_fake_host.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainctl.core.usage import UsageError
from trainctl.hosts import box, local
from trainctl.hosts.base import Host
from trainctl.hosts.slurm import host as slurm_host


@dataclass(frozen=True)
class Kind:
    """A kind of host: ``claim`` maps a target (a URL, ``slurm:``, a run directory's path)
    to its host, None when it is not its; ``named`` makes one from a bare name (an ssh
    destination); ``listed``: the hosts of this kind whose runs `ls` lists (``here``: this
    machine's, `ls --here`)."""

    name: str
    claim: Callable[[str], Host | None]
    listed: Callable[[], list] = field(default=lambda: [])
    named: Callable[..., Host] | None = None
    here: bool = False


KINDS: list[Kind] = []
DEFAULT_REMOTE = "ssh"  # a bare destination (`--host gpu-box`, hosts.toml) is a box's


def register(kind: Kind) -> Kind:
    """Add a kind of host, asked before those registered earlier (this machine's, which
    claims any path, is registered first: asked last).  Returns it (``unregister``)."""
    KINDS.insert(0, kind)
    return kind


def unregister(kind: Kind) -> None:
    KINDS.remove(kind)


def host_for(target: str | Path) -> Host:
    """The host of what the user typed: a URL (``ssh://HOST[/RUN]``), ``slurm:``, a run
    directory.  UsageError when no host claims it."""
    text = str(target)
    for kind in KINDS:
        found = kind.claim(text)
        if found is not None:
            return found
    raise UsageError(f"{text}: no host knows it (a run directory, ssh://HOST/RUN_DIR)")


def host_for_destination(destination: str, trainctl_cmd: str | None = None) -> Host:
    """`--host DEST` (or a job's ``[host] destination``): a URL of a registered kind (but
    the default remote's own, ``ssh://[user@]host:port``, a destination as ssh takes it) is
    its kind's host; anything else the default remote kind's."""
    if "://" in destination and not destination.startswith(f"{DEFAULT_REMOTE}://"):
        return host_for(destination)
    kind = next(k for k in KINDS if k.name == DEFAULT_REMOTE)
    assert kind.named is not None
    return kind.named(destination, trainctl_cmd)


def host_for_launch(
    destination: str | None = None, slurm: bool = False, trainctl_cmd: str | None = None
) -> Host:
    """Where `trainctl run` starts a run: ``--host DEST`` (or a job's ``[host]``; its
    ``trainctl``: trainctl's path there), else ``--slurm`` (or a job's ``[slurm]``), else
    this machine."""
    if destination:
        return host_for_destination(destination, trainctl_cmd)
    return host_for("slurm:" if slurm else "local:")


def locate(target: str | None) -> tuple[Host, str]:
    """The host and run directory a command's target names (`attach`, `ctl`, `status`): a
    URL is its host's, a run directory (none: the latest run here) this machine's or its
    Slurm host's; the run directory checked by that host (UsageError when it is not one)."""
    from trainctl.store.paths import latest_link

    host = host_for(target or str(latest_link()))
    return host, host.locate(target)


def host_for_row(row: dict) -> Host:
    """The host of a row of `ls` (the dashboard's run picker): "local" is a run directory
    here; a URL is its kind's; a bare destination (hosts.toml's) the default remote's."""
    where, run_dir = row.get("where", "local"), str(row["run_dir"])
    if where == "local":
        return host_for(run_dir)
    if "://" in where:
        return host_for(where)
    return host_for_destination(where)


def hosts_here() -> list:
    """The hosts of this machine whose runs `ls --here` lists."""
    return [h for kind in KINDS if kind.here for h in kind.listed()]


def hosts_elsewhere() -> list:
    """The other hosts `ls` asks (hosts.toml's boxes, and a row for each entry skipped)."""
    return [h for kind in KINDS if not kind.here for h in kind.listed()]


def transport_for(run_dir: Path | str):
    """How a client reaches the run's agent, through the run's host."""
    return host_for(str(run_dir)).client_factory(str(run_dir))().transport


def client_for(run_dir: Path | str):
    """A client of the run's agent, wherever it runs (decided at each connection: a Slurm
    run's next job may run on another node)."""
    return host_for(str(run_dir)).client_factory(str(run_dir))()


register(Kind("local", local.claim, lambda: [local.LocalHost()], here=True))
register(Kind("ssh", box.claim, box.listed, named=box.named))
register(Kind("slurm", slurm_host.claim))
