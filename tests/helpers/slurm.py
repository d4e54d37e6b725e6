"""The real Slurm that `.ci/slurm-up.sh` starts (munged, slurmctld, two slurmds: node1, node2).

    require_slurm()            # skips the test when no Slurm answers (fails in CI)
    jobs = queue_of(name)      # squeue's job ids for a job name
    wait_queue_empty(name, 30) # until squeue lists none of them

Clients find the test Slurm through SLURM_CONF; when it is not set, the file slurm-up.sh
writes (``$TRAINCTL_SLURM_DIR/slurm.conf``, default /tmp/trainctl-slurm) is used, so a
developer who ran `.ci/slurm-up.sh` can run the tests without exporting anything.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

DEFAULT_DIR = "/tmp/trainctl-slurm"


def slurm_conf() -> str | None:
    if os.environ.get("SLURM_CONF"):
        return os.environ["SLURM_CONF"]
    conf = Path(os.environ.get("TRAINCTL_SLURM_DIR") or DEFAULT_DIR) / "slurm.conf"
    return str(conf) if conf.exists() else None


def slurm_env() -> dict[str, str]:
    """os.environ with SLURM_CONF set to the test Slurm's (for subprocesses)."""
    env = dict(os.environ)
    conf = slurm_conf()
    if conf:
        env["SLURM_CONF"] = conf
    return env


def _answers() -> str | None:
    """None when a Slurm answers `sinfo` with a node up; else why not."""
    if not shutil.which("sbatch"):
        return "Slurm is not installed (run .ci/install-slurm.sh)"
    conf = slurm_conf()
    if conf is None:
        return "no Slurm configured (run .ci/slurm-up.sh as root)"
    try:
        r = subprocess.run(
            ["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=15, env=slurm_env()
        )
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 15 s (is slurmctld up? .ci/slurm-up.sh)"
    states = r.stdout.split()
    if r.returncode != 0 or not any(
        s.rstrip("*~#!%$@^-") in ("idle", "mix", "alloc", "comp") for s in states
    ):
        return (
            f"Slurm does not answer with a node up (.ci/slurm-up.sh): {(r.stderr or r.stdout).strip()[:200]}"
        )
    return None


def require_slurm() -> None:
    """Skip when no Slurm answers, unless TRAINCTL_REQUIRE_SLURM=1 (CI) makes that a failure.
    Sets SLURM_CONF in os.environ for what the test starts."""
    why = _answers()
    if why is None:
        os.environ["SLURM_CONF"] = slurm_conf() or ""
        return
    if os.environ.get("TRAINCTL_REQUIRE_SLURM") == "1":
        pytest.fail(why + " and TRAINCTL_REQUIRE_SLURM=1", pytrace=False)
    pytest.skip(why)


def queue_of(name: str) -> list[str]:
    """The ids squeue lists (any state) for jobs named ``name``."""
    r = subprocess.run(
        ["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True, timeout=15, env=slurm_env()
    )
    return r.stdout.split()


def wait_queue_empty(name: str, timeout: float) -> list[str]:
    """Wait until squeue lists no job named ``name``; what is left at the end."""
    end = time.monotonic() + timeout
    while True:
        left = queue_of(name)
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.3)


def cancel_all(name: str) -> None:
    """scancel every job named ``name`` (test cleanup)."""
    subprocess.run(["scancel", "--quiet", "-n", name], capture_output=True, timeout=15, env=slurm_env())


def scontrol(*args: str) -> str:
    r = subprocess.run(
        ["scontrol", *args], capture_output=True, text=True, timeout=15, env=slurm_env(), check=True
    )
    return r.stdout


def job_field(job_id: str, field: str) -> str:
    """One field of `scontrol show job` (NodeList, JobState, Restarts, ...)."""
    out = scontrol("-o", "show", "job", job_id)
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv).get(field, "")


def wait_node_only(node: str, job_id: str, timeout: float = 60) -> None:
    """Until ``job_id`` is the only job on ``node``: a preemption or a node failure made for
    a test must not hit the jobs of others sharing the test Slurm."""
    end = time.monotonic() + timeout
    while True:
        r = subprocess.run(
            ["squeue", "-h", "-w", node, "-o", "%i"],
            capture_output=True,
            text=True,
            timeout=15,
            env=slurm_env(),
        )
        others = [j for j in r.stdout.split() if j != job_id]
        if not others:
            return
        if time.monotonic() > end:
            raise AssertionError(f"{node} still runs other jobs {others} after {timeout} s")
        time.sleep(0.5)


def lift_requeue_hold(job_id: str, timeout: float = 30) -> None:
    """Slurm holds a requeued job (BeginTime, two minutes): once it shows so, start it now."""
    end = time.monotonic() + timeout
    while True:
        r = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%T %r"],
            capture_output=True,
            text=True,
            timeout=15,
            env=slurm_env(),
        )
        if r.stdout.strip() == "PENDING BeginTime":
            scontrol("update", f"jobid={job_id}", "StartTime=now")
            return
        if time.monotonic() > end:
            raise AssertionError(f"job {job_id} not requeued after {timeout} s: {r.stdout.strip()!r}")
        time.sleep(0.3)


class SlurmctldStopped:
    """slurmctld frozen (SIGSTOP) for at most ``seconds``, never killed: a watchdog of its own
    session sends SIGCONT at the end even if the test dies meanwhile (the daemon is shared);
    leaving the block sends it at once.

        with SlurmctldStopped(18):
            ...   # sbatch, squeue time out
    """

    def __init__(self, seconds: float) -> None:
        conf = Path(slurm_env()["SLURM_CONF"])
        self.pid = int((conf.parent / "slurmctld.pid").read_text())
        self.seconds = seconds
        self.watchdog: subprocess.Popen | None = None

    def __enter__(self) -> SlurmctldStopped:
        self.watchdog = subprocess.Popen(
            ["sh", "-c", f"sleep {self.seconds}; kill -CONT {self.pid}"],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc) -> None:
        os.kill(self.pid, signal.SIGCONT)
        if self.watchdog is not None:
            self.watchdog.kill()
            self.watchdog.wait()
