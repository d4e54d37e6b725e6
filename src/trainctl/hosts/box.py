"""A box over ssh (the agent inside tmux there): `trainctl run --host HOST`, a job's
``[host]``, `trainctl attach ssh://HOST[/RUN_DIR]`, the hosts of ``<config>/hosts.toml`` that
`ls` and the dashboard's run picker ask.  The dashboard runs wherever the user is, joined to
the box's agent by the user's own ssh (src/trainctl/hosts/ssh.py: the connection, the
transport)."""

from __future__ import annotations

import json
import os
import posixpath
import shlex
import time
from pathlib import Path

from trainctl.config.validation import show
from trainctl.core.usage import UsageError
from trainctl.hosts.base import Launched, LaunchRequest


def connect_box(destination: str, trainctl_cmd: str | None = None):
    """The box, reached with the user's OpenSSH setup. TRAINCTL_SSH_CONFIG (an `ssh -F`
    file) and TRAINCTL_REMOTE_TRAINCTL (trainctl's path on the box) are for setups where
    ~/.ssh/config is not the place, e.g. tests."""
    from trainctl.hosts.ssh import SshHost

    config = os.environ.get("TRAINCTL_SSH_CONFIG")
    remote = trainctl_cmd or os.environ.get("TRAINCTL_REMOTE_TRAINCTL") or "trainctl"
    try:
        return SshHost(destination, ssh_config=Path(config) if config else None, remote_trainctl=(remote,))
    except ValueError as e:
        raise UsageError(str(e)) from e


def attach_url(destination: str, run_dir: str) -> str:
    """`ssh://DEST/RUN_DIR`, read back by `parse_attach_url`: a destination that is already
    an `ssh://[user@]host:port` URL is not prefixed twice; a path under the remote home is
    `/~/PATH`; characters a URL reserves are %-escaped."""
    from urllib.parse import quote

    base = destination if destination.startswith("ssh://") else f"ssh://{destination}"
    path = run_dir if run_dir.startswith("/") else "/~/" + run_dir.removeprefix("~/")
    return base.rstrip("/") + quote(path, safe="/~")


def attach_hint(url: str) -> str:
    """The command that comes back to a run, quoted for a shell."""
    return f"trainctl attach {shlex.quote(url)}"


HOSTS_FILE_MAX = 1 << 20


def ls_hosts() -> tuple[list[str], list[str]]:
    """The ssh destinations of ``<config>/hosts.toml`` (``hosts = ["gpu-box", ...]``), and
    what was skipped, one line each naming the file and the entry.  The user's file: never
    moved nor changed; a bad entry is skipped, the rest used; a file that cannot be read at
    all (not a regular file of the user's, in a config directory others cannot write; too
    big; not TOML) is one line and no host."""
    import tomllib

    from trainctl.core.statefile import check_state_dir, read_text
    from trainctl.store.paths import config_dir

    path = config_dir() / "hosts.toml"
    try:
        check_state_dir(path.parent)
        data = tomllib.loads(read_text(path, HOSTS_FILE_MAX))
    except FileNotFoundError:
        return [], []
    except (OSError, ValueError) as e:
        return [], [f"{path}: not read: {e}"]
    hosts = data.get("hosts", [])
    if not isinstance(hosts, list):
        return [], [f'{path}: hosts: must be a list of ssh destinations, e.g. hosts = ["gpu-box"]']
    good: list[str] = []
    skipped: list[str] = []
    for i, h in enumerate(hosts):
        if isinstance(h, str) and h.strip() and not h.startswith("-") and "\n" not in h:
            good.append(h)
        else:
            skipped.append(f"{path}: hosts[{i}] = {show(h)} skipped: not an ssh destination")
    return good, skipped


def host_runs(destination: str) -> list[dict]:
    """The runs on a box (its `trainctl ls --here --json`), each with ``where`` = the
    destination; one row with ``error`` when the box cannot be reached or answer."""
    from trainctl.hosts.ssh import RemoteError

    try:
        host = connect_box(destination)
        r = host.run([*host.remote_trainctl, "ls", "--here", "--json"], timeout=30)
        if r.returncode != 0:
            raise RemoteError((r.stderr or r.stdout).strip()[:200] or f"exit {r.returncode}")
        rows = json.loads(r.stdout)
    except (RemoteError, UsageError, ValueError, OSError) as e:
        return [{"where": destination, "error": f"cannot list its runs: {e}", "started": None}]
    return [dict(row, where=destination) for row in rows if isinstance(row, dict)]


class SshBox:
    """A box over ssh: the Host of `--host`, `ssh://` and hosts.toml's destinations.  Its
    connection (``link``, an SshHost: UsageError for a bad destination); ``trainctl_cmd``: the
    job's ``[host] trainctl``, trainctl's path on the box."""

    def __init__(self, destination: str, trainctl_cmd: str | None = None) -> None:
        self.where = destination
        self.link = connect_box(destination, trainctl_cmd)

    def queue_status(self, run_dir: str) -> dict | None:
        return None  # a box's runs wait in no queue

    def node_status(self, run_dir: str) -> list[dict]:
        return []

    def between_agents(self, run_dir: str, say):
        return None

    def url(self, run_dir: str) -> str:
        return attach_url(self.where, run_dir)

    def attach_hint(self, run_dir: str) -> str:
        return attach_hint(self.url(run_dir))

    def client_factory(self, run_dir: str):
        from trainctl.client.connection import AgentClient
        from trainctl.hosts.ssh_transport import SshTransport

        # ProcessWriter is StreamWriter-like (write, drain, close): all a client uses of it
        return lambda: AgentClient(SshTransport(self.link, run_dir))  # type: ignore[arg-type]

    def runs(self, folds: dict | None = None, ended_slurm: bool = True) -> list[dict]:
        return host_runs(self.where)

    def waits_in_queue(self, run_dir: str) -> bool:
        return False  # a box's runs start at once: their agent answers, or they ended

    def cancel_waiting(self, run_dir: str) -> str:
        raise UsageError(f"{self.url(run_dir)}: no run of a box waits in a queue")

    def latest_run(self) -> str:
        """The run directory of the box's latest run (its `trainctl status --json`)."""
        host = self.link
        r = host.run([*host.remote_trainctl, "status", "--json"], timeout=60)
        try:
            return json.loads(r.stdout)["run_dir"]
        except (ValueError, KeyError):
            raise UsageError(f"no run found on {host.name}: {(r.stderr or r.stdout).strip()[:300]}") from None

    def check(self) -> None:
        """The box answers over ssh (trainctl there; tmux not needed to attach)."""
        from trainctl.hosts.ssh import RemoteError

        try:
            self.link.check(require_tmux=False)
        except RemoteError as e:
            raise UsageError(str(e)) from e

    def launch(self, request: LaunchRequest) -> Launched:
        """Send the job and presets to the box, start the agent there in tmux (`trainctl run
        --detach` there): its run directory there, absolute."""
        from trainctl.config import ConfigError
        from trainctl.hosts.ssh import RemoteError

        job, host = request.job, self.link
        host_cfg = dict(job.host or {}) if job else {}
        workdir = host_cfg.get("workdir") or "~/trainctl"
        # Named as `trainctl run` names it on the box (`python train.py` -> train, not python).
        name = request.name
        stamp = time.strftime("%Y%m%d-%H%M%S")
        base = posixpath.join(workdir, name)
        run_dir = request.run_dir or posixpath.join(base, "runs", f"{name}-{stamp}")
        try:
            host.check()
            opts = self._send_presets(request, base)
            argv = [*host.remote_trainctl, "run", "--detach", "--run-dir", run_dir, *opts]
            alert_file = self._send_alerts(request.alerts(), base, stamp, run_dir)
            if alert_file:
                argv += ["--alert-file", alert_file]
            setup = request.setup or host_cfg.get("setup") or ""
            self._send_job(request, base, argv, setup)
            r = host.run(argv, timeout=120)
            if r.returncode != 0:
                raise UsageError(f"could not start the run on {host.name}: {(r.stderr or r.stdout).strip()}")
        except RemoteError as e:
            raise UsageError(str(e)) from e
        except ConfigError as e:
            raise UsageError(str(e)) from e
        if not run_dir.startswith("/"):
            run_dir = self._remote_abs(run_dir)
        return Launched(
            run_dir,
            f"trainctl: started on {host.name}: {run_dir}",
            detached=f"trainctl: dashboard: {self.attach_hint(run_dir)}",
        )

    def locate(self, target: str | None) -> str:
        """`ssh://HOST[/RUN_DIR]`'s run directory on the box (none: its latest run), once the
        box answers."""
        from trainctl.hosts.ssh_address import parse_attach_url

        run_dir = None
        try:
            if target:
                _, run_dir = parse_attach_url(target)
        except ValueError as e:
            raise UsageError(str(e)) from e
        self.check()
        run_dir = run_dir or "latest"
        return self.latest_run() if run_dir == "latest" else run_dir

    def adopt(self, run_dir: str, say) -> bool:
        return False  # the box's own trainctl adopts its runs

    def _send_presets(self, request: LaunchRequest, base: str) -> list[str]:
        """The job and every preset it may use travel to the box, next to each other: the
        options forwarded to `trainctl run` there, with --preset/--fallback naming the copies."""
        from trainctl.config import list_presets, load_preset
        from trainctl.hosts.ssh_address import _remote_path

        job, host = request.job, self.link
        host_cfg = dict(job.host or {}) if job else {}
        search = [job.path.parent / "presets"] if job else [Path.cwd() / "presets"]
        sent: dict[str, str] = {}  # preset name -> its copy on the box
        for path in list_presets(search):
            sent[path.stem] = posixpath.join(base, "presets", path.name)
            host.send_file(path, sent[path.stem])
        for ref in (request.preset, request.fallback):
            if ref and ("/" in ref or ref.endswith(".toml")):
                p = load_preset(ref, search)
                sent[p.name] = posixpath.join(base, "presets", f"{p.name}.toml")
                host.send_file(p.path, sent[p.name])
        opts = list(request.options)
        setup = request.setup or host_cfg.get("setup") or ""
        if setup:
            opts += ["--setup", setup]
        for flag in ("--preset", "--fallback"):
            if flag in opts:
                # Names and paths on this machine mean the copies sent to the box, named by
                # their path there: the box looks names up under its own working directory
                # (the remote home for a command), not in the directory they were sent to.
                i = opts.index(flag) + 1
                ref = Path(opts[i]).stem if "/" in opts[i] or opts[i].endswith(".toml") else opts[i]
                opts[i] = _remote_path(sent[ref]) if ref in sent else ref
        return opts

    def _send_job(self, request: LaunchRequest, base: str, argv: list[str], setup: str) -> None:
        """The job file (or the command) on `trainctl run`'s argv, checked on the box first."""
        from trainctl.hosts.ssh_address import _remote_path

        job, host = request.job, self.link
        if job is not None:
            remote_job = posixpath.join(base, "trainctl.toml")
            host.send_text(_job_for_box(job.path), remote_job)
            # `~/...` would reach the box quoted, never expanded: name it from the remote home.
            argv.insert(len(host.remote_trainctl) + 1, _remote_path(remote_job))
        else:
            argv += ["--", *request.command]
        if job is None or job.kind in ("command", "torchrun"):
            # Checked on the box, where it will run (a job's in WORKDIR/JOB, a command's in
            # the remote home), before an agent starts there.
            _check_remote_command(
                host,
                list(job.command) if job else list(request.command),
                _remote_path(base) if job else ".",
                setup,
            )

    def _send_alerts(self, alerts: tuple, base: str, stamp: str, run_dir: str) -> str | None:
        """The client's alerts (its alerts.toml, the job's [alerts], --alert), resolved by the
        CLI and sent to the box as a 0600 file (never argv); the box's agent sends them.  Its
        path on the box, or None when the run has no alerts."""
        from trainctl.hosts.ssh_address import _remote_path

        urls, on = alerts
        if not urls:
            return None
        remote = posixpath.join(base, f".alerts-{stamp}-{os.getpid()}.json")
        attach = attach_hint(attach_url(self.where, run_dir)) if run_dir.startswith("/") else None
        self.link.send_text(json.dumps({"urls": list(urls), "on": on, "attach": attach}), remote, 0o600)
        return _remote_path(remote)

    def _remote_abs(self, path: str) -> str:
        from trainctl.hosts.ssh_address import _remote_path

        r = self.link.run(["sh", "-c", 'cd -- "$1" && pwd -P', "sh", _remote_path(path)], timeout=30)
        return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else path


def _check_remote_command(host, argv: list[str], cwd: str, setup: str = "") -> None:
    """Refuse a command that the box cannot start (`command -v` there, in ``cwd``; a path
    must be an executable file), before an agent starts: UsageError naming it."""
    if not argv or not argv[0]:
        raise UsageError("empty command: give one after `--` (trainctl run -- python train.py)")
    script = (
        'cd "$1" 2>/dev/null || cd; case $2 in */*) test -f "$2" && test -x "$2";; '
        '*) command -v "$2" >/dev/null;; esac'
    )
    if setup:  # the job's environment first, as the trainer will have it (bash: `source`)
        r = host.run(["bash", "-c", f"{setup}\n{script}", "bash", cwd, argv[0]], timeout=60)
    else:
        r = host.run(["sh", "-c", script, "sh", cwd, argv[0]], timeout=60)
    if r.returncode != 0:
        where = f"in {cwd} " if cwd != "." else ""
        hint = (
            ", after its [host] setup"
            if setup
            else "; if it lives in a venv or conda env, say how to enter it with [host] setup = "
            '"source ~/venv/bin/activate" in the job'
        )
        raise UsageError(
            f"command {argv[0]!r} not found on {host.name} {where}(as an "
            f"executable file or on the PATH of a non-interactive ssh session "
            f"there){hint}"
        )


def _job_for_box(path: Path) -> str:
    """The job file as the box gets it: without its [host] table, which says where to run
    it from here (left in, the box would hand the job on over ssh instead of running it)."""
    import tomlkit

    doc = tomlkit.parse(path.read_text(encoding="utf-8"))
    doc.pop("host", None)
    doc.pop("alerts", None)  # resolved on the client; they reach the box in a 0600 file
    return tomlkit.dumps(doc)


def claim(target: str) -> SshBox | None:
    """``ssh://[user@]host[:port][/RUN_DIR]``: that box."""
    if not target.startswith("ssh://"):
        return None
    from trainctl.hosts.ssh_address import parse_attach_url

    try:
        destination, _ = parse_attach_url(target)
    except ValueError as e:
        raise UsageError(str(e)) from e
    return SshBox(destination)


def named(destination: str, trainctl_cmd: str | None = None) -> SshBox:
    """`--host DEST`, a job's ``[host] destination``, a destination of hosts.toml."""
    return SshBox(destination, trainctl_cmd)


class SkippedEntry:
    """An entry of hosts.toml that is no destination: `ls` shows it as a row saying why."""

    def __init__(self, why: str) -> None:
        self.why = why

    def runs(self, folds: dict | None = None, ended_slurm: bool = True) -> list[dict]:
        return [{"where": "hosts.toml", "error": self.why, "started": None}]


def listed() -> list[SshBox | SkippedEntry]:
    """The boxes `ls` asks: hosts.toml's, and a row for each entry skipped."""
    good, skipped = ls_hosts()
    return [*(SshBox(dest) for dest in good), *(SkippedEntry(why) for why in skipped)]
