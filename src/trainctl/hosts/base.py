"""What a place where runs live can do: the ``Host`` protocol, and the refusal every host
raises.

A host launches a run, makes clients of a run's agent, lists its runs, cancels a run that
waits (no agent yet), and says how to come back to a run (its URL, the attach command).
Today's hosts: this machine (src/trainctl/hosts/local.py), a box over ssh and tmux
(hosts/box.py), a Slurm cluster from its login node (hosts/slurm/host.py).  Which host a
target means (a run directory, ``ssh://HOST/RUN``, ``--host HOST``, ``--slurm``, a row of
`ls`) is decided in one place, hosts/registry.py: a new host is one file and one line there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trainctl.client.connection import AgentClient


ClientFactory = Callable[[], "AgentClient"]


@dataclass
class LaunchRequest:
    """What `trainctl run` asks of a host, resolved by the CLI (its options parsed, its job
    file loaded).  ``prepare`` builds the run directory and its spec on this machine (the
    CLI's spec builder): a host whose agent starts here calls it; a box builds its own."""

    name: str  # the run's name (run_name)
    job: Any = None  # the loaded job file, or None: a command
    command: list[str] = field(default_factory=list)  # the command after `--` (no job)
    run_dir: str | None = None  # --run-dir
    preset: str | None = None
    fallback: str | None = None
    setup: str = ""  # --setup
    options: list[str] = field(default_factory=list)  # `trainctl run` options to forward
    alerts: tuple[list, dict] = ((), {})  # the resolved alert URLs and their `on`
    prepare: Callable[[], tuple[Path, Any, bool]] | None = None  # -> run_dir, spec, created


@dataclass(frozen=True)
class Launched:
    """A run a host started (or queued): its run directory there, the line that says so."""

    run_dir: str
    said: str


class Host(Protocol):
    """A place where runs live."""

    #: what `ls` rows of its runs say in ``where``: "local" (this machine, its Slurm jobs
    #: too: their run directories are here), or the ssh destination of a box
    where: str

    def launch(self, request: LaunchRequest) -> Launched:
        """Start the run (its agent, or its first queued job); UsageError when it cannot."""
        ...

    def client_factory(self, run_dir: str) -> ClientFactory:
        """A fresh client of the run's agent at each call, however it is reached."""
        ...

    def runs(self, folds: dict | None = None, ended_slurm: bool = True) -> list[dict]:
        """Its runs as `ls` rows (``where`` set); one row with ``error`` when it cannot
        be asked.  ``folds``, ``ended_slurm``: as hosts/local.py's summarize takes them
        (a caller that asks again every few seconds)."""
        ...

    def waits_in_queue(self, run_dir: str) -> bool:
        """The run may be waiting with no agent to ask (a queued job)."""
        ...

    def cancel_waiting(self, run_dir: str) -> str:
        """Cancel a run that waits (no agent to ask): what was cancelled (a job id);
        UsageError when nothing of the run waits."""
        ...

    def between_agents(self, run_dir: str, say: Callable[[str], None]):
        """What a follow does when no agent answers and the journal does not end the run
        (``async (hello) -> bool``: True to wait for the next agent; ``say``: a line for the
        user), or None: the follow ends.  A Slurm run waits for its next job."""
        ...

    def url(self, run_dir: str) -> str:
        """What `trainctl attach` takes to come back to the run."""
        ...

    def attach_hint(self, run_dir: str) -> str:
        """The command that comes back to the run, quoted for a shell."""
        ...
