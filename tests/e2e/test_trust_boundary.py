"""Issue 27, the trust half: nothing another user writes is obeyed, every input is checked
where it comes in, and no user pattern freezes supervision.

Real processes throughout: `python -m trainctl ...`, real agents and trainers, a second
local user made by the test (tests/helpers/other_user.py: root only, as the CI runs; a skip
with the reason elsewhere).  ssh, scancel and the other Slurm commands are stand-ins on
PATH that only write down that they were called: the point is that they never are.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.e2e.conftest import PYTHON, of_type, read_journal, run_trainctl, start_trainctl
from tests.helpers.hangs import wait_until
from tests.helpers.other_user import give, other_uid

pytestmark = pytest.mark.e2e


@pytest.fixture
def env(tmp_path):
    """Private runs, config and tmux; ssh and Slurm's commands are stand-ins that log."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    for prog in ("ssh", "scancel", "scontrol", "squeue", "sbatch"):
        (fake / prog).write_text(f'#!/bin/sh\necho "{prog} $*" >> {tmp_path}/calls.log\nexit 1\n')
        (fake / prog).chmod(0o755)
    return {
        "TRAINCTL_RUNS_DIR": str(tmp_path / "runs"),
        "TRAINCTL_CONFIG_DIR": str(tmp_path / "config"),
        "TRAINCTL_TMUX_SOCKET": f"trainctl-trust-{uuid.uuid4().hex[:8]}",
        "PATH": f"{fake}:{os.environ['PATH']}",
        "TRAINCTL_NODE_SSH": "auto",
    }


def calls(tmp_path: Path) -> list[str]:
    """The stand-ins called about the planted run: ssh at all, or a Slurm command naming its
    job (`ls` may ask squeue for the user's own jobs where Slurm is set up, as in CI)."""
    log = tmp_path / "calls.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [ln for ln in lines if ln.startswith("ssh") or "4242" in ln]


def one_line_refusal(r, *words: str) -> str:
    err = r.stderr.strip()
    assert r.returncode == 2, r.describe()
    assert "Traceback" not in r.stderr and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, (w, err)
    return err


def planted_run(where: Path, marker: Path) -> Path:
    """What the issue's hostile user planted: agent.json naming another node and a command,
    slurm.json with a job id, a socket file, a spec whose command touches ``marker``."""
    run = where / "run"
    run.mkdir(parents=True)
    (run / "agent.json").write_text(
        json.dumps(
            {
                "pid": 1,
                "node": "node9",
                "boot_id": "other",
                "hostname": "elsewhere",
                "slurm_job": "4242",
                "trainctl": ["sh", "-c", f"touch {marker}"],
            }
        )
    )
    (run / "slurm.json").write_text(json.dumps({"jobs": ["4242"]}))
    (run / "spec.json").write_text(
        json.dumps({"job_name": "evil", "kind": "command", "command": ["sh", "-c", f"touch {marker}"]})
    )
    (run / "events.jsonl").write_text("")
    (run / "agent.sock").write_text("")
    return run


def test_another_users_run_directory_is_never_followed(env, tmp_path):
    """status, attach, ctl stop, bridge and --resume-from on a directory another user owns:
    one line, exit 2, no ssh run (let alone the command agent.json names), no scancel of the
    job id slurm.json names; ls lists it as unreadable beside the user's own runs."""
    uid = other_uid()
    theirs = tmp_path / "theirs"
    run = planted_run(theirs, tmp_path / "PWNED")
    give(theirs, uid)
    for args in (
        ["status", str(run)],
        ["attach", "--json", str(run)],
        ["ctl", str(run), "stop"],
        ["bridge", str(run)],  # what ssh runs on a node: no relay to their socket
        ["run", "--json", "--resume-from", str(run), "--resume-arg=--r", "--", "true"],
    ):
        r = run_trainctl(args, timeout=60, env=env)
        one_line_refusal(r, f"owned by uid {uid}")
    assert calls(tmp_path) == [] and not (tmp_path / "PWNED").exists()
    # one of the user's own runs, and the other's directory remembered in known-runs
    mine = run_trainctl(["run", "--json", "--", "true"], timeout=120, env=env)
    assert mine.returncode == 0, mine.describe()
    with open(Path(env["TRAINCTL_RUNS_DIR"]) / "known-runs", "a") as f:
        f.write(f"{run}\n")
    r = run_trainctl(["ls"], timeout=60, env=env)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.describe()
    rows = {ln.split()[0]: ln for ln in r.stdout.splitlines()[1:]}
    assert "FINISHED" in rows and f"owned by uid {uid}" in rows["UNREADABLE"], r.stdout
    assert calls(tmp_path) == [] and not (tmp_path / "PWNED").exists()


def test_files_of_another_user_in_an_own_run_directory_are_not_read(env, tmp_path):
    """The user's own directory, but agent.json and slurm.json are another user's: neither
    is read (no ssh to the node it names, no scancel of its job); the run is what its journal
    says."""
    uid = other_uid()
    mine = tmp_path / "mine"
    run = planted_run(mine, tmp_path / "PWNED")
    for name in ("agent.json", "slurm.json"):
        os.lchown(run / name, uid, -1)
    r = run_trainctl(["status", "--json", str(run)], timeout=60, env=env)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.describe()
    r = run_trainctl(["ctl", str(run), "stop"], timeout=60, env=env)
    assert r.returncode == 1 and "no agent is running" in r.stderr and "Traceback" not in r.stderr, (
        r.describe()
    )
    assert calls(tmp_path) == [] and not (tmp_path / "PWNED").exists()


def test_run_dir_through_another_users_link_is_refused(env, tmp_path):
    """--run-dir evil/link/run, evil being another user's world-writable directory and link
    their symlink to a directory of ours: refused in one line, nothing made there."""
    uid = other_uid()
    victim = tmp_path / "victim"
    victim.mkdir()
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "link").symlink_to(victim)
    give(evil, uid)
    evil.chmod(0o777)
    r = run_trainctl(
        ["run", "--json", "--run-dir", str(evil / "link" / "run"), "--", "true"], timeout=60, env=env
    )
    one_line_refusal(r, "--run-dir", str(evil))
    assert list(victim.iterdir()) == [] and not Path(env["TRAINCTL_RUNS_DIR"]).exists()


def test_what_trainctl_makes_is_the_users_alone(env, tmp_path):
    """Under a umask of 022: the runs directory 0700, known-runs 0600, and every directory
    and file of a run directory (the preset copies, spec.json, the journal, agent.json...)
    open to its owner only."""
    preset = tmp_path / "A.toml"
    preset.write_text('[env]\nFOO = "1"\n')
    old = os.umask(0o022)
    try:
        r = run_trainctl(["run", "--json", "--preset", str(preset), "--", "true"], timeout=120, env=env)
    finally:
        os.umask(old)
    assert r.returncode == 0, r.describe()
    runs = Path(env["TRAINCTL_RUNS_DIR"])
    assert stat.S_IMODE(runs.stat().st_mode) == 0o700
    assert stat.S_IMODE((runs / "known-runs").stat().st_mode) == 0o600
    open_to_others = []
    for root, dirs, files in os.walk(r.run_dir):
        for name in dirs + files:
            st = os.lstat(os.path.join(root, name))
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
                open_to_others.append(f"{name} {stat.S_IMODE(st.st_mode):o}")
    assert open_to_others == [] and (r.run_dir / "presets" / "A.toml").exists()


SIDE_TRAINER = """
import json, os, time
path = os.environ.get("TRAINCTL_EVENTS_PATH")
out = open(path, "a") if path else os.fdopen(int(os.environ["TRAINCTL_EVENTS_FD"]), "w")
def say(**ev):
    out.write(json.dumps({"ts": time.time(), **ev}) + "\\n"); out.flush()
say(type="progress", epoch="x", epochs=4, batch=10, batches=10)
for e in range(1, 5):
    say(type="progress", epoch=e, epochs=4, batch=10, batches=10, losses={"loss": 1.0 / e})
say(type="checkpoint", path=os.path.abspath("ck.pt"), epoch=4, ok=True)
say(type="progress", epoch=5, epochs=4, batch=None, batches="ten")
print("done", flush=True)
time.sleep(1.5)
"""


def test_an_ill_typed_side_event_is_named_and_loses_nothing(env, tmp_path):
    """An event whose epoch is "x": refused alone (an info naming the field), never an
    error event; the four progress events and the checkpoint after it are all journaled."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "t.py").write_text(SIDE_TRAINER)
    (job / "ck.pt").write_bytes(b"x")
    (job / "trainctl.toml").write_text(f'kind = "command"\ncommand = ["{PYTHON}", "t.py"]\n')
    r = run_trainctl(["run", "--json", str(job / "trainctl.toml")], timeout=120, env=env)
    assert r.returncode == 0, r.describe()
    assert of_type(r.events, "error") == [], r.describe()
    said = [e.text for e in of_type(r.events, "info") if e.key == "side.bad_event"]
    assert len(said) == 2 and "progress.epoch" in said[0] and "progress.batches" in said[1], said
    assert [e.epoch for e in of_type(r.events, "progress")] == [1, 2, 3, 4]
    assert [e.epoch for e in of_type(r.events, "checkpoint")] == [4]


def test_a_malformed_spec_is_one_unreadable_run_among_the_others(env, tmp_path):
    """spec.json = [1,2] in one run: ls shows it UNREADABLE (why, in one cell) and the
    other run as it is; status and attach on it answer without a traceback."""
    good = run_trainctl(["run", "--json", "--name", "good", "--", "true"], timeout=120, env=env)
    bad = run_trainctl(["run", "--json", "--name", "bad", "--", "true"], timeout=120, env=env)
    assert good.returncode == 0 and bad.returncode == 0, bad.describe()
    (bad.run_dir / "spec.json").write_text("[1, 2]\n")
    r = run_trainctl(["ls"], timeout=60, env=env)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.describe()
    rows = r.stdout.splitlines()[1:]
    assert any(ln.startswith("FINISHED") and " good " in ln for ln in rows), r.stdout
    assert any(ln.startswith("UNREADABLE") and "not a run spec" in ln for ln in rows), r.stdout
    for args in (["status", str(bad.run_dir)], ["attach", "--json", str(bad.run_dir)]):
        s = run_trainctl(args, timeout=60, env=env)
        assert "Traceback" not in s.stderr and s.returncode in (0, 2), s.describe()


def test_bad_values_are_refused_and_a_refused_run_leaves_nothing(env, tmp_path):
    """A NUL in a preset's [env]: refused by `presets validate` and by `run` (no run left
    UNKNOWN); --rescue-wait inf / -1 refused as --stall-timeout is; a run refused after its
    directory was made (an unreadable --alert-file) removes it."""
    preset = tmp_path / "nul.toml"
    preset.write_text('[env]\nFOO = "a\\u0000b"\n')
    v = run_trainctl(["presets", "validate", str(preset)], timeout=60, env=env)
    assert v.returncode != 0 and "[env] FOO" in v.stderr + v.stdout and "U+0000" in v.stderr + v.stdout
    one_line_refusal(
        run_trainctl(["run", "--json", "--preset", str(preset), "--", "true"], timeout=60, env=env),
        "[env] FOO",
        "U+0000",
    )
    for value in ("inf", "-1", "nan"):
        one_line_refusal(
            run_trainctl(["run", "--json", f"--rescue-wait={value}", "--", "true"], timeout=60, env=env),
            "--rescue-wait",
        )
    one_line_refusal(
        run_trainctl(
            ["run", "--json", "--alert-file", str(tmp_path / "none.json"), "--", "true"], timeout=60, env=env
        ),
        "--alert-file",
    )
    runs = Path(env["TRAINCTL_RUNS_DIR"])
    assert (
        not runs.exists()
        or [p.name for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")] == []
    )


CATASTROPHIC = r"^(?P<batch>\d*)(a+)+$"


def test_a_catastrophic_pattern_never_freezes_supervision(env, tmp_path):
    """The issue's pattern on lines of 26 `a` and a `!` (a backtracking engine: about 7 s a
    line, the agent deaf meanwhile): the agent answers status all along, the pattern still
    reads its good lines, and SIGTERM ends `run --json` promptly."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "t.py").write_text(
        "import time\nfor i in range(1, 200):\n"
        "    print('a' * 26 + '!', flush=True)\n"
        "    print(f'{i}aaa', flush=True)\n    time.sleep(0.1)\n"
    )
    (job / "trainctl.toml").write_text(
        f'kind = "command"\ncommand = ["{PYTHON}", "t.py"]\n[progress]\npattern = \'{CATASTROPHIC}\'\n'
    )
    with start_trainctl(["run", "--json", str(job / "trainctl.toml")], env=env) as tc:
        tc.wait_event(lambda e: e.type == "progress" and (e.batch or 0) >= 3, timeout=60)
        for _ in range(3):
            t0 = time.monotonic()
            s = subprocess.run(
                [PYTHON, "-m", "trainctl", "status", "--json", str(tc.run_dir)],
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert s.returncode == 0 and json.loads(s.stdout)["live"], s.stderr
            assert time.monotonic() - t0 < 30
        tc.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: tc.proc.poll() is not None, timeout=30)
    states = [e.state for e in of_type(read_journal(tc.run_dir), "state")]
    assert states[-1] == "STOPPED", states
