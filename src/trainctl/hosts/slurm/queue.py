"""Slurm through its own commands (sbatch, squeue, scontrol, scancel, sinfo): submit a run's
batch job, read a job's state and time limit, cancel it.  Never a Slurm library: the
commands read the cluster's slurm.conf (SLURM_CONF) and munge as the user's would.

The run directory keeps ``slurm.json``: the run's jobs in order (``{"jobs": [id, ...]}``,
the last one the current), written by whoever submits (`trainctl run`, then each job's
agent for the next one), so any reader finds the job from the run directory alone.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainctl.config.slurm import slurm_time_s
from trainctl.store.paths import read_private, write_private

BATCH_SCRIPT = "slurm-job.sh"
AGENT_SCRIPT = "slurm-agent.sh"  # a node's agent, kept going (keeper_script)
AGENT_RESTARTS = 5  # agents killed in a job that its keeper starts again
RESTARTED_ENV = "TRAINCTL_AGENT_RESTARTED"  # "N:SIGNAL:PID": the agent before this one was killed
JOBS_FILE = "slurm.json"
PORT_ENV = "TRAINCTL_RDZV_PORT"  # a job of several nodes: its rendezvous port (the batch script's)
QUERY_TIMEOUT_S = 20.0
#: Job states that end a job (squeue/scontrol names).
ENDED = (
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
    "SPECIAL_EXIT",
    "REVOKED",
)


class SlurmError(Exception):
    """Slurm refused or failed a request; ``str()`` is one line saying why."""


class SlurmUnreachable(SlurmError):
    """slurmctld does not answer (or Slurm is not installed / configured here)."""


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    state: str  # PENDING, RUNNING, COMPLETING, CANCELLED, TIMEOUT, ...
    reason: str = ""  # squeue's reason: Priority, Resources, Dependency, None, ...
    time_limit_s: int | None = None
    partition: str = ""
    node: str = ""
    end_ts: float | None = None  # when Slurm will end it (its time limit), unix seconds
    restarts: int = 0  # times Slurm requeued it (node failure, preemption, requeue)
    queued_s: float | None = None  # how long it waited in the queue (start - submit)
    preempt_ts: float | None = None  # when Slurm chose it for preemption (its grace runs)

    @property
    def ended(self) -> bool:
        return self.state.split()[0] in ENDED


def _env() -> dict[str, str]:
    """Our environment without the SLURM_*/SBATCH_* variables of an enclosing job (a job's
    agent submits the next job: its own job's settings must not leak in), SLURM_CONF kept."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_")) or k == "SLURM_CONF"
    }


def configured() -> bool:
    """Slurm's commands are here and a slurm.conf for them (SLURM_CONF, or the usual
    places): without one they retry for a minute before failing."""
    import shutil

    conf = os.environ.get("SLURM_CONF")
    return bool(shutil.which("squeue")) and any(
        Path(p).is_file()
        for p in ([conf] if conf else ["/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf"])
    )


def _run(argv: list[str], timeout: float = QUERY_TIMEOUT_S) -> subprocess.CompletedProcess:
    from trainctl.system.process import ends_with_us  # psutil: not on `trainctl run`'s path

    try:
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_env(),
            stdin=subprocess.DEVNULL,
            preexec_fn=ends_with_us(),
        )
    except FileNotFoundError:
        raise SlurmUnreachable(
            f"{argv[0]} not found: Slurm's commands are not installed here "
            "(run trainctl on the cluster's login node)"
        ) from None
    except subprocess.TimeoutExpired:
        raise SlurmUnreachable(
            f"{argv[0]} did not answer within {timeout:g} s: slurmctld is unreachable or overloaded"
        ) from None


_UNREACHABLE = (
    "unable to contact slurm controller",
    "connection refused",
    "unable to process configuration file",
    "could not establish a configuration source",
    "socket timed out",
    "zero bytes were transmitted",
)


def _why(r: subprocess.CompletedProcess, what: str) -> SlurmError:
    """One line from a Slurm command's stderr: the last 'error:' reason, without prefixes."""
    lines = [ln.strip() for ln in (r.stderr or r.stdout or "").splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error:" in ln or "fatal:" in ln] or lines
    text = errors[-1] if errors else f"exit status {r.returncode}"
    for marker in ("Batch job submission failed: ", "error: ", "fatal: "):
        if marker in text:
            text = text.split(marker, 1)[1]
            break
    low = " ".join(lines).lower()
    if any(u in low for u in _UNREACHABLE):
        return SlurmUnreachable(f"{what}: slurmctld is unreachable ({text})")
    return SlurmError(f"{what}: {text}")


def job_name(run_job: str) -> str:
    """The Slurm job name of a trainctl job's batch jobs (squeue -n finds them)."""
    return f"trainctl-{run_job}"


JOB_OUTPUT = "slurm-%j.out"  # a job's own output in its run directory (sbatch --output)


def job_output(run_dir: Path, job_id: str) -> Path:
    """The job's own output: its agents' (each start of it appended), Slurm's own lines."""
    return Path(run_dir) / JOB_OUTPUT.replace("%j", job_id)


def sbatch_by_hand(cfg: dict[str, Any], run_dir: Path, job_name: str) -> str:
    """The sbatch command that submits a run's next job by hand (no dependency): its agent
    goes on with the run from its last good checkpoint, and joins slurm.json."""
    return shlex.join(sbatch_argv(cfg, run_dir, job_name, cfg.get("warn")))


def sbatch_argv(
    cfg: dict[str, Any], run_dir: Path, job_name: str, warn_s: int | None, dependency: str | None = None
) -> list[str]:
    """The sbatch command for a run's batch job: the job's ``[slurm]`` options, then
    trainctl's own: a job name to find it by, the agent's output in the run directory, the
    warning signal before the time limit, and the dependency on the job before."""
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={job_name}",
        f"--output={run_dir}/{JOB_OUTPUT}",
        "--open-mode=append",
        f"--chdir={run_dir}",
        "--requeue",
    ]
    if warn_s and int(cfg.get("nodes") or 1) <= 1:
        # not for several nodes: the batch shell is srun there, which passes a signal on to
        # every process of its step, trainers included (SIGUSR1 ends torchrun); each node's
        # agent asks the save by its own timer, from the job's end time
        argv.append(f"--signal=B:USR1@{warn_s}")
    if dependency:
        argv += [f"--dependency=afterany:{dependency}", "--kill-on-invalid-dep=yes"]
    for key, flag in (
        ("partition", "--partition"),
        ("time", "--time"),
        ("nodes", "--nodes"),
        ("gpus", "--gpus"),
        ("gres", "--gres"),
        ("cpus", "--cpus-per-task"),
        ("mem", "--mem"),
    ):
        if cfg.get(key) is not None:
            argv.append(f"{flag}={cfg[key]}")
    argv += list(cfg.get("options", ()))
    argv.append(str(run_dir / BATCH_SCRIPT))
    return argv


def warn_seconds(cfg: dict[str, Any], limit_s: int | None) -> int | None:
    """How long before the time limit the agent is warned (sbatch --signal=B:USR1@N): the
    job's ``warn``, else a tenth of the limit, between 30 s and 10 min, and at most half
    the limit (Slurm sends it up to a minute early: its timer ticks every 30 s)."""
    if cfg.get("warn"):
        return int(cfg["warn"])
    if limit_s is None:
        return None
    return max(1, min(600, max(30, limit_s // 10), limit_s // 2))


def time_limit_s(cfg: dict[str, Any]) -> int | None:
    """The job's time limit: its ``time``, else its partition's default (else its maximum);
    None when unlimited."""
    if cfg.get("time"):
        return slurm_time_s(cfg["time"])
    argv = ["sinfo", "-h", "-o", "%L|%l|%P"]
    if cfg.get("partition"):
        argv[1:1] = ["-p", cfg["partition"]]
    r = _run(argv)
    if r.returncode != 0:
        raise _why(r, "sinfo")
    for line in r.stdout.splitlines():
        default, most, part = (line.split("|") + ["", "", ""])[:3]
        if cfg.get("partition") or part.endswith("*"):
            for value in (default, most):
                if value and value not in ("n/a", "infinite", "UNLIMITED"):
                    return _squeue_time(value)
            return None
    return None


def _timestamp(value: str) -> float | None:
    """squeue's %e (local time, ISO without a zone), or None (N/A, Unknown)."""
    import datetime as dt

    try:
        return dt.datetime.fromisoformat(value.strip()).timestamp()
    except ValueError:
        return None


def _waited(submit: str, start: str) -> float | None:
    a, b = _timestamp(submit), _timestamp(start)
    return max(0.0, b - a) if a is not None and b is not None else None


def _squeue_time(value: str) -> int | None:
    """squeue/sinfo's D-HH:MM:SS, HH:MM:SS or MM:SS."""
    value = value.strip()
    if value in ("", "UNLIMITED", "infinite", "NOT_SET", "INVALID", "N/A", "n/a"):
        return None
    days, _, rest = value.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def agent_line(run_dir: Path, nodes: int = 1) -> str:
    """The batch script's last line.  One node: the agent's keeper (:func:`keeper_script`)
    as the batch shell itself (exec): the warning signal (B:) reaches it, and it passes it on
    to the agent, not to the trainer.  Several: a rendezvous port free on this, the first,
    node, then one keeper (and its agent) per node through srun (no warning signal then: see
    :func:`sbatch_argv`); see src/trainctl/hosts/slurm/nodes.py."""
    keeper = f"/bin/bash {shlex.quote(str(Path(run_dir) / AGENT_SCRIPT))}"
    if nodes <= 1:
        return f"exec {keeper}\n"
    free_port = 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
    return (
        f"export {PORT_ENV}=$({shlex.quote(sys.executable)} -c {shlex.quote(free_port)})\n"
        f"exec {' '.join(srun_argv())} {keeper}\n"
    )


def keeper_script(run_dir: Path, agent: str | None = None) -> str:
    """``<run_dir>/slurm-agent.sh``: a node's agent, kept going inside the job.  An agent
    killed (kill -9, the OOM killer, a crash of Python) would end the job's step, and Slurm
    would kill the trainer with it, maybe while it writes a checkpoint; its keeper, a few
    lines of bash that hold the step, starts it again at once instead (``AGENT_RESTARTS``
    times at most in a job), and the new agent adopts the trainer, which went on meanwhile.
    The agent's own ends (its exit codes, below 128, and 130: stopped) and a SIGTERM (Slurm
    ends the job: every process of it gets one, the agent too) end the keeper too.  The
    warning signal (USR1, to the batch shell only) is passed on to the agent."""
    agent = agent or (f"{shlex.quote(sys.executable)} -m trainctl agent {shlex.quote(str(run_dir))} --slurm")
    return f"""#!/bin/bash
# trainctl: this node's agent, kept going: one killed is started again and adopts the trainer
pid=
trap '[ -n "$pid" ] && kill -USR1 "$pid" 2>/dev/null' USR1
trap 'term=1' TERM   # Slurm ends the job: it sends the agent its own SIGTERM
term=0
restarts=0
adopt=
while :; do
    {agent} $adopt &
    pid=$!
    while :; do
        wait "$pid"
        rc=$?
        # a signal to this shell ends the wait (above 128), not the agent: wait again
        [ "$rc" -gt 128 ] && kill -0 "$pid" 2>/dev/null && continue
        # the agent ended just as a signal came: bash kept its status (127: none left)
        if [ "$rc" -gt 128 ]; then wait "$pid"; again=$?; [ "$again" -ne 127 ] && rc=$again; fi
        break
    done
    if [ "$rc" -le 128 ] || [ "$rc" -eq 130 ] || [ "$rc" -eq 143 ] || [ "$term" = 1 ] \\
            || [ "$restarts" -ge {AGENT_RESTARTS} ]; then
        exit "$rc"
    fi
    restarts=$((restarts + 1))
    echo "trainctl: the agent (pid $pid) was killed (signal $((rc - 128))); starting it again" \\
         "($restarts of {AGENT_RESTARTS} in this job): it adopts the trainer" >&2
    export {RESTARTED_ENV}="$restarts:$((rc - 128)):$pid"
    adopt=--adopt   # the trainer's holder keeps the job lock: the new agent takes it over
    sleep 1
done
"""


def srun_argv() -> list[str]:
    """srun of the agents of a job of several nodes: one task on each node of the job; a
    task that ends does not end the others (each agent ends its own trainer in order, and
    the nodes follow the lead's end through its journal); the job's --cpus-per-task again
    (srun 22.05+ does not inherit it from sbatch)."""
    return [
        "srun",
        "--nodes=$SLURM_JOB_NUM_NODES",
        "--ntasks=$SLURM_JOB_NUM_NODES",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=0",
        "${SLURM_CPUS_PER_TASK:+--cpus-per-task=$SLURM_CPUS_PER_TASK}",
    ]


def write_batch_script(run_dir: Path, setup: str = "", nodes: int = 1) -> Path:
    """``<run_dir>/slurm-job.sh``: the job's environment (``[slurm] setup``), then its agents
    (:func:`agent_line`), each kept by ``<run_dir>/slurm-agent.sh`` (:func:`keeper_script`)."""
    path = Path(run_dir) / BATCH_SCRIPT
    text = (
        "#!/bin/bash\n# trainctl: the agent"
        + ("s" if nodes > 1 else "")
        + " of this run, inside its Slurm allocation\n"
        + (setup.rstrip() + "\n" if setup.strip() else "")
        + agent_line(run_dir, nodes)
    )
    _write_script(Path(run_dir) / AGENT_SCRIPT, keeper_script(run_dir))
    _write_script(path, text)
    return path


def _write_script(path: Path, text: str) -> None:
    write_private(path, text, 0o700)


def submit(argv: list[str], timeout: float = 60) -> str:
    """Run sbatch; the job id.  SlurmError (one line) when Slurm refuses the job,
    SlurmUnreachable when slurmctld does not answer (within ``timeout``)."""
    r = _run(argv, timeout=timeout)
    if r.returncode != 0:
        raise _why(r, "sbatch refused the job")
    job_id = r.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch said {r.stdout.strip()[:200]!r}, not a job id")
    return job_id


# ------------------------------------------------------------------ sbatch, retried
SUBMIT_FIRST_WAIT_S = 5.0  # the first wait after an sbatch slurmctld did not answer
SUBMIT_MAX_WAIT_S = 60.0  # the waits double up to this
SUBMIT_MARGIN_S = 15.0  # no try this close to the job's end (Slurm ends the agent then)
SUBMIT_TRIES_NO_END = 8  # a job without a known end: this many tries


def submit_retry_wait(tries: int, now: float, end: float | None) -> float | None:
    """How long to wait before the next sbatch after ``tries`` ones slurmctld did not
    answer: doubling from SUBMIT_FIRST_WAIT_S up to SUBMIT_MAX_WAIT_S, never past the job's
    ``end`` minus SUBMIT_MARGIN_S; None: no try is left."""
    wait = min(SUBMIT_MAX_WAIT_S, SUBMIT_FIRST_WAIT_S * 2 ** max(0, tries - 1))
    if end is None:
        return wait if tries < SUBMIT_TRIES_NO_END else None
    left = end - SUBMIT_MARGIN_S - now
    return min(wait, left) if left >= 1.0 else None


def submit_timeout(now: float, end: float | None) -> float:
    """sbatch's own bound: a minute, less when the job ends sooner (at least 5 s)."""
    return 60.0 if end is None else max(5.0, min(60.0, end - SUBMIT_MARGIN_S - now))


def jobs_after(squeue_out: str, job_id: str) -> list[str]:
    """The ids in squeue's ``%i|%E`` lines whose dependency is ``afterany`` on ``job_id``."""
    out = []
    for line in squeue_out.splitlines():
        jid, _, dep = line.strip().partition("|")
        if jid.isdigit() and re.search(rf"\bafterany:{re.escape(job_id)}(?![0-9])", dep):
            out.append(jid)
    return sorted(out, key=int)


def queued_after(job_id: str, name: str) -> list[str]:
    """The jobs named ``name`` queued after ``job_id``: a next job whose sbatch slurmctld
    took but did not answer in time (so that a try again does not queue a second one)."""
    r = _run(["squeue", "-h", "-n", name, "-o", "%i|%E"])
    if r.returncode != 0:
        raise _why(r, "squeue")
    return jobs_after(r.stdout, job_id)


def job_info(job_id: str) -> JobInfo | None:
    """The job's state now (scontrol: its base state, CANCELLED even while it completes);
    None when Slurm no longer knows it (ended longer ago than MinJobAge)."""
    r = _run(["scontrol", "-o", "show", "job", job_id])
    if r.returncode != 0:
        if "invalid job id" in (r.stderr or "").lower():
            return None
        raise _why(r, "scontrol")
    fields = dict(kv.split("=", 1) for kv in r.stdout.split() if "=" in kv)
    return JobInfo(
        job_id,
        fields.get("JobState", "?"),
        fields.get("Reason", ""),
        _squeue_time(fields.get("TimeLimit", "")),
        fields.get("Partition", ""),
        fields.get("NodeList", ""),
        _timestamp(fields.get("EndTime", "")),
        int(fields["Restarts"]) if fields.get("Restarts", "").isdigit() else 0,
        _waited(fields.get("SubmitTime", ""), fields.get("StartTime", "")),
        _timestamp(fields.get("PreemptTime", "")),
    )


def grace_time_s(partition: str) -> int:
    """The partition's preemption GraceTime (seconds; 0: a preempted job is ended at once)."""
    r = _run(["scontrol", "-o", "show", "partition", partition])
    if r.returncode != 0:
        raise _why(r, "scontrol")
    fields = dict(kv.split("=", 1) for kv in r.stdout.split() if "=" in kv)
    value = fields.get("GraceTime", "0")
    return int(value) if value.isdigit() else 0


def cancel(job_id: str) -> None:
    r = _run(["scancel", job_id])
    if r.returncode != 0:
        raise _why(r, f"scancel {job_id}")


# ------------------------------------------------------------------ slurm.json
def read_jobs(run_dir: Path) -> list[str]:
    try:
        data = json.loads(read_private(Path(run_dir) / JOBS_FILE))  # the user's own file
        return [str(j) for j in data.get("jobs", [])]
    except (OSError, ValueError, AttributeError):
        return []


def add_job(run_dir: Path, job_id: str) -> None:
    jobs = read_jobs(run_dir)
    if job_id not in jobs:
        jobs.append(job_id)
    write_private(Path(run_dir) / JOBS_FILE, json.dumps({"jobs": jobs}))


def current_job(run_dir: Path) -> str | None:
    jobs = read_jobs(run_dir)
    return jobs[-1] if jobs else None


CANCEL_MARK = "slurm-cancel"


def mark_cancel(run_dir: Path, job_id: str) -> None:
    """Before trainctl itself scancels a job: its agent then knows the cancel was the user's
    stop through trainctl, not someone else's scancel."""
    write_private(Path(run_dir) / CANCEL_MARK, job_id)


def cancel_was_ours(run_dir: Path, job_id: str) -> bool:
    try:
        return (Path(run_dir) / CANCEL_MARK).read_text().strip() == job_id
    except OSError:
        return False
