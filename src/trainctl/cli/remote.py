"""`trainctl run --host HOST` and `trainctl attach ssh://HOST[/RUN_DIR]`: the agent lives on
the box (inside tmux), the dashboard wherever the user is, joined by the user's own ssh."""
from __future__ import annotations

import asyncio
import os
import posixpath
import shlex
import sys
import time
from pathlib import Path

from trainctl.cli.common import UsageError, note, printer, resolve_alerts, run_name


def _host(destination: str, trainctl_cmd: str | None = None):
    """The box, reached with the user's OpenSSH setup. TRAINCTL_SSH_CONFIG (an `ssh -F`
    file) and TRAINCTL_REMOTE_TRAINCTL (trainctl's path on the box) are for setups where
    ~/.ssh/config is not the place, e.g. tests."""
    from trainctl.hosts.ssh import SshHost
    config = os.environ.get("TRAINCTL_SSH_CONFIG")
    remote = trainctl_cmd or os.environ.get("TRAINCTL_REMOTE_TRAINCTL") or "trainctl"
    try:
        return SshHost(destination, ssh_config=Path(config) if config else None,
                       remote_trainctl=(remote,))
    except ValueError as e:
        raise UsageError(str(e)) from e


def _forwarded_options(args) -> list[str]:
    out: list[str] = []
    for flag in ("preset", "fallback", "deadline", "name", "resume_from"):
        value = getattr(args, flag, None)
        if value:
            out += [f"--{flag.replace('_', '-')}", value]
    for flag in ("stall_timeout", "startup_idle", "silence_floor"):
        value = getattr(args, flag, None)
        if value is not None:
            out += [f"--{flag.replace('_', '-')}", repr(value)]
    if args.max_restarts is not None:
        out += ["--max-restarts", str(args.max_restarts)]
    if getattr(args, "node_rank", None) is not None:
        out += ["--node-rank", str(args.node_rank)]
    for r in args.resume_arg or []:
        out += ["--resume-arg", r]
    if args.no_auto_recover:
        out.append("--no-auto-recover")
    if getattr(args, "no_instrument", False):
        out.append("--no-instrument")
    out.append("--via-ssh")   # the box's agent says so in its advice
    return out


def run_remote(args, runs=None) -> int:
    """Send the job and presets to the box, start the agent there in tmux, then attach."""
    from trainctl.config import ConfigError, list_presets, load_job, load_preset
    from trainctl.hosts.ssh import RemoteError, _remote_path

    job = None
    try:
        job = load_job(Path(args.job)) if args.job else None
    except ConfigError as e:
        raise UsageError(str(e)) from e
    host_cfg = dict(job.host or {}) if job else {}
    destination = args.host or host_cfg.get("destination")
    host = _host(destination, host_cfg.get("trainctl"))
    workdir = host_cfg.get("workdir") or "~/trainctl"
    # Named as `trainctl run` names it on the box (`python train.py` -> train, not python).
    name = run_name(args, job)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = posixpath.join(workdir, name)
    run_dir = args.run_dir or posixpath.join(base, "runs", f"{name}-{stamp}")
    try:
        host.check()
        # The job and every preset it may use travel to the box, next to each other.
        search = [job.path.parent / "presets"] if job else [Path.cwd() / "presets"]
        sent: dict[str, str] = {}          # preset name -> its copy on the box
        for path in list_presets(search):
            sent[path.stem] = posixpath.join(base, "presets", path.name)
            host.send_file(path, sent[path.stem])
        for ref in (args.preset, args.fallback):
            if ref and ("/" in ref or ref.endswith(".toml")):
                p = load_preset(ref, search)
                sent[p.name] = posixpath.join(base, "presets", f"{p.name}.toml")
                host.send_file(p.path, sent[p.name])
        opts = _forwarded_options(args)
        setup = args.setup or host_cfg.get("setup") or ""
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
        argv = [*host.remote_trainctl, "run", "--detach", "--run-dir", run_dir, *opts]
        alert_file = _send_alerts(args, job, host, base, stamp, destination, run_dir)
        if alert_file:
            argv += ["--alert-file", alert_file]
        if job is not None:
            remote_job = posixpath.join(base, "trainctl.toml")
            host.send_text(_job_for_box(job.path), remote_job)
            # `~/...` would reach the box quoted, never expanded: name it from the remote home.
            argv.insert(len(host.remote_trainctl) + 1, _remote_path(remote_job))
        else:
            argv += ["--", *args.command_argv]
        if job is None or job.kind in ("command", "torchrun"):
            # Checked on the box, where it will run (a job's in WORKDIR/JOB, a command's in
            # the remote home), before an agent starts there.
            _check_remote_command(host, list(job.command) if job else list(args.command_argv),
                                  _remote_path(base) if job else ".", setup)
        r = host.run(argv, timeout=120)
        if r.returncode != 0:
            raise UsageError(f"could not start the run on {host.name}: "
                             f"{(r.stderr or r.stdout).strip()}")
    except RemoteError as e:
        raise UsageError(str(e)) from e
    except ConfigError as e:
        raise UsageError(str(e)) from e
    if not run_dir.startswith("/"):
        run_dir = _remote_abs(host, run_dir)
    print(f"trainctl: started on {host.name}: {run_dir}", flush=True)
    url = attach_url(destination, run_dir)
    if args.headless or args.json or args.detach:
        if args.detach:
            print(f"trainctl: dashboard: {attach_hint(url)}")
            return 0
        return _follow(host, run_dir, args.json)
    return _dashboard(host, run_dir, url, runs)


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


def _send_alerts(args, job, host, base: str, stamp: str, destination: str, run_dir: str) -> str | None:
    """The client's alerts (its alerts.toml, the job's [alerts], --alert), resolved here and
    sent to the box as a 0600 file (never argv); the box's agent sends them.  Its path on the
    box, or None when the run has no alerts."""
    import json
    from trainctl.hosts.ssh import _remote_path
    urls, on = resolve_alerts(args, job)
    if not urls:
        return None
    remote = posixpath.join(base, f".alerts-{stamp}-{os.getpid()}.json")
    attach = attach_hint(attach_url(destination, run_dir)) if run_dir.startswith("/") else None
    host.send_text(json.dumps({"urls": urls, "on": on, "attach": attach}), remote, 0o600)
    return _remote_path(remote)


def _check_remote_command(host, argv: list[str], cwd: str, setup: str = "") -> None:
    """Refuse a command that the box cannot start (`command -v` there, in ``cwd``; a path
    must be an executable file), before an agent starts: UsageError naming it."""
    if not argv or not argv[0]:
        raise UsageError("empty command: give one after `--` (trainctl run -- python train.py)")
    script = ('cd "$1" 2>/dev/null || cd; case $2 in */*) test -f "$2" && test -x "$2";; '
              '*) command -v "$2" >/dev/null;; esac')
    if setup:   # the job's environment first, as the trainer will have it (bash: `source`)
        r = host.run(["bash", "-c", f"{setup}\n{script}", "bash", cwd, argv[0]], timeout=60)
    else:
        r = host.run(["sh", "-c", script, "sh", cwd, argv[0]], timeout=60)
    if r.returncode != 0:
        where = f"in {cwd} " if cwd != "." else ""
        hint = (", after its [host] setup" if setup else
                "; if it lives in a venv or conda env, say how to enter it with [host] setup = "
                "\"source ~/venv/bin/activate\" in the job")
        raise UsageError(f"command {argv[0]!r} not found on {host.name} {where}(as an "
                         f"executable file or on the PATH of a non-interactive ssh session "
                         f"there){hint}")


def _job_for_box(path: Path) -> str:
    """The job file as the box gets it: without its [host] table, which says where to run
    it from here (left in, the box would hand the job on over ssh instead of running it)."""
    import tomlkit
    doc = tomlkit.parse(path.read_text(encoding="utf-8"))
    doc.pop("host", None)
    doc.pop("alerts", None)   # resolved on the client; they reach the box in a 0600 file
    return tomlkit.dumps(doc)


def _remote_abs(host, path: str) -> str:
    from trainctl.hosts.ssh import _remote_path
    r = host.run(["sh", "-c", 'cd -- "$1" && pwd -P', "sh", _remote_path(path)], timeout=30)
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else path


def _client_factory(host, run_dir: str):
    from trainctl.client.connection import AgentClient
    from trainctl.hosts.ssh import SshTransport
    return lambda: AgentClient(SshTransport(host, run_dir))


def _follow(host, run_dir: str, as_json: bool, *, tail: int | None = None,
            from_snapshot: bool = False) -> int:
    from trainctl.client.follow import follow
    return asyncio.run(follow(_client_factory(host, run_dir), printer(as_json), note,
                              tail=tail, from_snapshot=from_snapshot))


def _dashboard(host, run_dir: str, url: str, runs=None) -> int:
    """``runs``: the user's other runs for the dashboard's picker (the CLI's RunsSource)."""
    from trainctl.tui.app import run_dashboard
    return run_dashboard(_client_factory(host, run_dir), attach_hint=attach_hint(url),
                         runs=runs, run_key=(_destination(url), run_dir))


def _destination(url: str) -> str:
    """The ssh destination of an attach URL, as hosts.toml (and `ls`'s where) would say it."""
    from trainctl.hosts.ssh import parse_attach_url
    return parse_attach_url(url)[0]


def host_runs(destination: str) -> list[dict]:
    """The runs on a box (its `trainctl ls --here --json`), each with ``where`` = the
    destination; one row with ``error`` when the box cannot be reached or answer."""
    import json
    from trainctl.hosts.ssh import RemoteError
    try:
        host = _host(destination)
        r = host.run([*host.remote_trainctl, "ls", "--here", "--json"], timeout=30)
        if r.returncode != 0:
            raise RemoteError((r.stderr or r.stdout).strip()[:200] or f"exit {r.returncode}")
        rows = json.loads(r.stdout)
    except (RemoteError, UsageError, ValueError, OSError) as e:
        return [{"where": destination, "error": f"cannot list its runs: {e}", "started": None}]
    return [dict(row, where=destination) for row in rows if isinstance(row, dict)]


def attach_remote(url: str, *, follow: bool = False, as_json: bool = False,
                  tail: int | None = None, from_snapshot: bool = False, runs=None) -> int:
    from trainctl.hosts.ssh import RemoteError, parse_attach_url
    try:
        destination, run_dir = parse_attach_url(url)
    except ValueError as e:
        raise UsageError(str(e)) from e
    host = _host(destination)
    try:
        host.check(require_tmux=False)
    except RemoteError as e:
        raise UsageError(str(e)) from e
    run_dir = run_dir or "latest"
    if run_dir == "latest":
        r = host.run([*host.remote_trainctl, "status", "--json"], timeout=60)
        import json
        try:
            run_dir = json.loads(r.stdout)["run_dir"]
        except (ValueError, KeyError):
            raise UsageError(f"no run found on {host.name}: {(r.stderr or r.stdout).strip()[:300]}")
    if follow:
        return _follow(host, run_dir, as_json, tail=tail, from_snapshot=from_snapshot)
    return _dashboard(host, run_dir, attach_url(destination, run_dir), runs)


if __name__ == "__main__":   # pragma: no cover
    sys.exit(2)
