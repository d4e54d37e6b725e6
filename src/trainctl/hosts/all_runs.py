"""Every run of this user, as `trainctl ls` lists them and the dashboard's run picker offers
them: every host's (hosts/registry.py: this machine's run directories and Slurm jobs, the
boxes of ``<config>/hosts.toml`` over ssh); and how the dashboard reaches the one picked,
a queued Slurm job's status, and its cancel: each through the run's host."""

from __future__ import annotations

from pathlib import Path

from trainctl.core.usage import UsageError


def all_rows(
    here: bool = False, folds: dict | None = None, hosts: list[dict] | None = None, ended_slurm: bool = True
) -> list[dict]:
    """`trainctl ls`'s rows (``--here``: this machine's only), newest first; an unreachable
    host is a row with ``error``.  ``folds``: summarize's journal folds, kept by a caller that
    asks again; ``hosts``: the hosts' rows, already gathered; ``ended_slurm=False``: no
    scontrol for the Slurm runs that have ended."""
    from trainctl.hosts.registry import hosts_here

    rows = [row for host in hosts_here() for row in host.runs(folds=folds, ended_slurm=ended_slurm)]
    if not here:
        rows += host_rows() if hosts is None else hosts
    rows.sort(key=lambda r: r.get("started") or 0, reverse=True)
    return rows


def host_rows() -> list[dict]:
    """The runs of every other host: hosts.toml's boxes (over ssh; a row with ``error`` for
    one that cannot be reached, and for each entry of hosts.toml skipped)."""
    from trainctl.hosts.registry import hosts_elsewhere

    return [row for host in hosts_elsewhere() for row in host.runs()]


class RunsSource:
    """What the dashboard asks of the runs beyond the one it follows (its calls block:
    the dashboard makes them in threads).  Journals are folded once, then only their new
    lines (src/trainctl/store/listing.py JournalFold); the hosts' rows (an ssh round trip and a whole
    `ls` there each) are asked again for the header's count every HOSTS_EVERY_S only."""

    HOSTS_EVERY_S = 30.0

    def __init__(self) -> None:
        import threading

        self._folds: dict = {}
        self._hosts: tuple[float, list[dict]] | None = None
        self._lock = threading.Lock()

    def rows(self) -> list[dict]:
        """Every run, the hosts' asked now (the picker)."""
        return self._rows(fresh=True)

    def poll_rows(self) -> list[dict]:
        """Every run, the hosts' as of the last HOSTS_EVERY_S (the header's count)."""
        return self._rows(fresh=False)

    def _rows(self, fresh: bool) -> list[dict]:
        import time

        try:
            with self._lock:
                kept = self._hosts
            if fresh or kept is None or time.monotonic() - kept[0] > self.HOSTS_EVERY_S:
                hosts = host_rows()
                with self._lock:
                    self._hosts = (time.monotonic(), hosts)
            else:
                hosts = kept[1]
        except UsageError as e:  # a broken hosts.toml: this machine's runs, and why
            hosts = [{"where": "hosts.toml", "error": str(e), "started": None}]
        # the count every 5 s asks Slurm only of the runs still going (a user with a
        # hundred ended Slurm runs would cost slurmctld a hundred RPCs each time)
        return all_rows(folds=self._folds, hosts=hosts, ended_slurm=fresh)

    def client_factory(self, row: dict):
        """A fresh client for the run of ``row`` at each call."""
        from trainctl.hosts.registry import host_for_row

        return host_for_row(row).client_factory(row["run_dir"])

    def attach_hint(self, row: dict) -> str:
        from trainctl.hosts.registry import host_for_row

        return host_for_row(row).attach_hint(row["run_dir"])

    def slurm_status(self, run_dir: str) -> dict | None:
        """The Slurm run's current job ({job, state, reason, ...}); None for other runs."""
        from trainctl.hosts.slurm.jobs import slurm_status

        return slurm_status(Path(run_dir))

    def stop_queued(self, run_dir: str) -> str:
        """Cancel the run's queued job (scancel) and end the run STOPPED: its job id (UsageError)."""
        from trainctl.hosts.registry import host_for

        return host_for(run_dir).cancel_waiting(run_dir)
