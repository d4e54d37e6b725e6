"""A new host is one file and one registration (src/trainctl/hosts/registry.py): a host that
lives "in a folder", defined here, registered by the test, runs a real agent for a tiny job,
and `trainctl run`, `attach --json`, `status`, `ctl` and `ls` reach it through the seam.  The
host counts what is asked of it: a CLI that chose the place itself (bypassing the seam) would
leave it unasked, and the run in its folder would not be listed at all (nothing else knows
the folder)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainctl.core.usage import UsageError
from trainctl.hosts.base import Launched, LaunchRequest


class FolderHost:
    """Runs that live in one folder of this machine: ``folder://<root>``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.where = f"folder://{root}"
        self.asked: list[str] = []  # what the seam asked of it, in order
        self.agents: list[subprocess.Popen] = []

    def owns(self, target: str) -> bool:
        return target.startswith(self.where) or target.startswith(str(self.root) + "/")

    def launch(self, request: LaunchRequest) -> Launched:
        from trainctl.store.spec import RunSpec

        self.asked.append("launch")
        if not request.command:
            raise UsageError("a folder host runs a command only")
        run_dir = self.root / f"{request.name}-{len(self.agents) + 1}"
        run_dir.mkdir(mode=0o700)
        RunSpec(job_name=request.name, kind="command", command=list(request.command)).save(
            run_dir / "spec.json"
        )
        with open(run_dir / "agent.out", "ab") as out:
            self.agents.append(
                subprocess.Popen(
                    [sys.executable, "-m", "trainctl", "agent", str(run_dir)],
                    cwd=run_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        deadline = time.monotonic() + 30
        while not (run_dir / "agent.sock").exists() and time.monotonic() < deadline:
            if self.agents[-1].poll() is not None:
                break  # it ran and ended already: its journal says how
            time.sleep(0.05)
        return Launched(str(run_dir), f"trainctl: started in {self.root}: {run_dir}")

    def client_factory(self, run_dir: str):
        from trainctl.client.connection import AgentClient
        from trainctl.hosts.where import transport_for

        self.asked.append("client")
        return lambda: AgentClient(transport_for(run_dir))

    def runs(self, folds: dict | None = None, ended_slurm: bool = True) -> list[dict]:
        from trainctl.hosts.local import summarize

        self.asked.append("runs")
        return [
            dict(summarize(d, with_slurm=False), where=self.where)
            for d in sorted(self.root.iterdir())
            if (d / "spec.json").is_file()
        ]

    def waits_in_queue(self, run_dir: str) -> bool:
        return False

    def cancel_waiting(self, run_dir: str) -> str:
        raise UsageError(f"{run_dir}: nothing waits in a folder")

    def between_agents(self, run_dir: str, say):
        return None

    def url(self, run_dir: str) -> str:
        return f"{self.where}{run_dir}"

    def attach_hint(self, run_dir: str) -> str:
        return f"trainctl attach {run_dir}"


@pytest.fixture
def folder_host(tmp_path):
    from trainctl.hosts import registry

    root = tmp_path / "folder"
    root.mkdir(mode=0o700)
    host = FolderHost(root)
    kind = registry.register(
        registry.Kind("folder", lambda target: host if host.owns(target) else None, lambda: [host])
    )
    try:
        yield host
    finally:
        registry.unregister(kind)
        for agent in host.agents:
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.wait(timeout=30)
            if agent.poll() is None:
                agent.kill()
                agent.wait()


def trainctl(*argv: str) -> tuple[int, str, str]:
    """`trainctl ARGV` in this process (where the test registered its host)."""
    from trainctl.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_a_host_defined_in_a_test_runs_a_job_through_the_seam(folder_host, monkeypatch):
    monkeypatch.setenv("TRAINCTL_NODE_SSH", "never")
    code, out, err = trainctl(
        "run",
        "--host",
        folder_host.where,
        "--name",
        "tiny",
        "--json",
        "--",
        sys.executable,
        "-c",
        "print('hello from the folder')",
    )
    assert code == 0, (out, err)
    assert folder_host.asked[:2] == ["launch", "client"], folder_host.asked
    (run_dir,) = [d for d in folder_host.root.iterdir() if d.is_dir()]
    assert f"trainctl: started in {folder_host.root}: {run_dir}" in out
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert any("hello from the folder" in json.dumps(e) for e in events), out
    for agent in folder_host.agents:
        agent.wait(timeout=30)

    del folder_host.asked[:]
    code, out, err = trainctl("attach", "--json", str(run_dir))
    assert code == 0, (out, err)
    assert folder_host.asked == ["client"]  # the seam chose the folder's host
    assert any(
        json.loads(line).get("state") == "FINISHED" for line in out.splitlines() if line.startswith("{")
    ), out

    del folder_host.asked[:]
    code, out, err = trainctl("status", "--json", str(run_dir))
    assert json.loads(out)["state"] == "FINISHED", (out, err)
    assert folder_host.asked == ["client"]

    del folder_host.asked[:]
    code, out, err = trainctl("ls", "--json")
    assert code == 0, err
    rows = [r for r in json.loads(out) if r.get("where") == folder_host.where]
    assert [(r["run_dir"], r["state"]) for r in rows] == [(str(run_dir), "FINISHED")]
    assert folder_host.asked == ["runs"]
    assert os.path.isdir(run_dir)
