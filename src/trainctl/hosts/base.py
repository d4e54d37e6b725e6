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

    naming: Callable[[], str] = lambda: "run"  # the run's name (run_name), asked by a host
    job: Any = None  # the loaded job file, or None: a command
    command: list[str] = field(default_factory=list)  # the command after `--` (no job)
    run_dir: str | None = None  # --run-dir
    preset: str | None = None
    fallback: str | None = None
    setup: str = ""  # --setup
    options: list[str] = field(default_factory=list)  # `trainctl run` options to forward
    # the alert URLs and their `on`, resolved when a host asks (its notes said then)
    alerts: Callable[[], tuple[list, Any]] = lambda: ([], {})
    prepare: Callable[[], tuple[Path, Any, bool]] | None = None  # -> run_dir, spec, created
    foreground: bool = False  # --json/--headless: followed in this process
    use_tmux: bool = True  # not --no-tmux (an agent detached here)

    @property
    def name(self) -> str:
        """The run's name: a host that names the run asks (this machine's spec builder
        names it itself, its refusals in their order)."""
        return self.naming()


@dataclass(frozen=True)
class Launched:
    """A run a host started (or queued): its run directory there, the line that says so
    (printed at once; "" for none), the lines `--detach` prints after it, and a line to
    print after the dashboard (asked then: "" for none).  ``run_here``: the run's agent to
    run in this process (a foreground run here), given the event printer: its exit code;
    the CLI runs it instead of following the run."""

    run_dir: str
    said: str
    detached: str = ""
    after: Callable[[], str] = lambda: ""
    run_here: Callable[[Callable], int] | None = None


class Host(Protocol):
    """A place where runs live."""

    #: what `ls` rows of its runs say in ``where``: "local" (this machine, its Slurm jobs
    #: too: their run directories are here), or the ssh destination of a box
    where: str

    def launch(self, request: LaunchRequest) -> Launched:
        """Start the run (its agent, or its first queued job); UsageError when it cannot."""
        ...

    def locate(self, target: str | None) -> str:
        """The run directory a command's target names on this host (None: the latest run),
        checked (a run directory the user owns; a box that answers); UsageError when not."""
        ...

    def adopt(self, run_dir: str, say: Callable[[str], None]) -> bool:
        """A run whose agent died while its trainer lives on gets a new agent (attach, ctl):
        True when one was started."""
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

    def queue_status(self, run_dir: str) -> dict | None:
        """What `status` says of the run's queued job when no agent answers (a Slurm job:
        its id, state, reason), or None."""
        ...

    def node_status(self, run_dir: str) -> list[dict]:
        """The run's other nodes as `status` shows them (a Slurm job of several nodes:
        their agents and ranks), or []."""
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
