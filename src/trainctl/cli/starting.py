"""Starting an agent in this process from the command line (`agent`).  Starting one
detached, and adopting a run, is this machine's host's (src/trainctl/hosts/detached.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trainctl.cli.common import printer


def run_agent(
    run_dir: Path,
    spec,
    as_json: bool,
    on_locked: Callable[[], None] | None = None,
    adopt: bool = False,
    plug=None,
) -> int:
    from trainctl.hosts.detached import run_agent as run_here

    return run_here(run_dir, spec, printer(as_json), on_locked=on_locked, adopt=adopt, plug=plug)
