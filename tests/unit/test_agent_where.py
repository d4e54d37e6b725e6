"""Where a run's agent runs and how a client reaches it: the run directory's socket when the
agent is on this machine, ssh to its Slurm node when it is not (src/trainctl/hosts/where.py)."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import pytest

from trainctl.client.connection import AgentUnavailable, UnixTransport
from trainctl.hosts.where import AgentUnreachable, NodeTransport, ssh_destination, transport_for, where_i_run

HERE = {"node": "", "hostname": "login1", "boot_id": "aaaa"}


@pytest.mark.parametrize(
    "agent, mode, dest",
    [
        ({}, "auto", None),  # an older agent.json
        ({"hostname": "gpu7", "boot_id": "bbbb"}, "auto", None),  # no node: not Slurm's
        ({"node": "gpu7", "hostname": "gpu7", "boot_id": "bbbb"}, "auto", "gpu7"),
        ({"node": "node1", "hostname": "login1", "boot_id": "aaaa"}, "auto", None),  # same kernel
        ({"node": "node1", "hostname": "login1", "boot_id": "cccc"}, "auto", "node1"),  # rebooted/other
        ({"node": "gpu7", "hostname": "gpu7"}, "auto", "gpu7"),  # no boot id: hostnames
        ({"node": "node1", "hostname": "login1"}, "auto", None),
        ({"node": "node1", "hostname": "login1", "boot_id": "aaaa"}, "always", "node1"),
        ({"node": "gpu7", "hostname": "gpu7", "boot_id": "bbbb"}, "never", None),
        ({"hostname": "gpu7", "boot_id": "bbbb"}, "always", None),
    ],
)
def test_the_agent_is_reached_over_ssh_only_from_another_machine(agent, mode, dest):
    assert ssh_destination(agent, HERE, mode) == dest


def test_an_agent_says_where_it_runs(monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "node2")
    me = where_i_run()
    assert me["node"] == "node2" and me["hostname"] and "trainctl" not in me  # no command to follow
    assert ssh_destination(me, where_i_run()) is None  # this machine: its socket


def run_dir_with(tmp_path: Path, info: dict, sock: bool) -> Path:
    run = tmp_path / "run"
    run.mkdir(parents=True)
    (run / "agent.json").write_text(json.dumps(info))
    if sock:
        (run / "agent.sock").touch()
    return run


def test_the_transport_follows_agent_json(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAINCTL_NODE_SSH", raising=False)
    elsewhere = {
        "node": "gpu7",
        "hostname": "gpu7",
        "boot_id": "not-this-one",
        "trainctl": ["/venv/bin/python", "-m", "trainctl"],
    }
    run = run_dir_with(tmp_path, elsewhere, sock=True)
    monkeypatch.delenv("TRAINCTL_REMOTE_TRAINCTL", raising=False)
    t = transport_for(run)
    assert isinstance(t, NodeTransport) and t.node == "gpu7"
    # the trainctl ssh runs is this installation's, never the one agent.json names
    assert t.inner.remote_argv() == [sys.executable, "-m", "trainctl", "bridge", str(run)]
    monkeypatch.setenv("TRAINCTL_REMOTE_TRAINCTL", "/opt/tc/bin/trainctl")  # the user's setting
    assert transport_for(run).inner.remote_argv() == ["/opt/tc/bin/trainctl", "bridge", str(run)]
    (run / "agent.sock").unlink()  # the agent ended (it removes its socket): the journal, here
    assert isinstance(transport_for(run), UnixTransport)
    here = run_dir_with(tmp_path / "b", {**where_i_run(), "node": "node1"}, sock=True)
    assert isinstance(transport_for(here), UnixTransport)
    monkeypatch.setenv("TRAINCTL_NODE_SSH", "always")
    assert isinstance(transport_for(here), NodeTransport)


def test_a_bad_setting_is_said_when_connecting(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINCTL_NODE_SSH", "sometimes")
    run = run_dir_with(tmp_path, {"node": "gpu7"}, sock=True)
    with pytest.raises(AgentUnavailable, match="TRAINCTL_NODE_SSH='sometimes'"):
        asyncio.run(transport_for(run).open())


@pytest.mark.skipif(not shutil.which("ssh"), reason="no OpenSSH client")
def test_an_unreachable_node_is_one_line(tmp_path, monkeypatch):
    config = tmp_path / "ssh_config"
    config.write_text("Host gpu7\n  HostName 127.0.0.1\n  Port 1\n  BatchMode yes\n")
    monkeypatch.setenv("TRAINCTL_SSH_CONFIG", str(config))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("TRAINCTL_NODE_SSH", raising=False)
    run = run_dir_with(tmp_path, {"node": "gpu7", "boot_id": "not-this-one"}, sock=True)
    with pytest.raises(AgentUnreachable) as e:
        asyncio.run(transport_for(run).open())
    text = str(e.value)
    assert "\n" not in text and text.startswith("cannot reach the agent on node gpu7 over ssh")
    assert "Connection refused" in text


@pytest.mark.parametrize(
    "state, offline", [(None, True), ("PENDING", True), ("CANCELLED", True), ("RUNNING", False)]
)
def test_a_dead_nodes_agent_leaves_the_journal_to_read_here(tmp_path, monkeypatch, state, offline):
    """A node that died leaves its agent's socket file on the shared storage: ssh to it fails.
    When Slurm says the agent's job no longer runs there (requeued: PENDING; ended; forgotten),
    the journal is read here (the dashboard then shows the queued job); while it runs, the node
    is what cannot be reached."""
    from trainctl.core import events as E
    from trainctl.hosts.registry import transport_for  # through the run's host: Slurm's
    from trainctl.hosts.slurm import queue as slurm
    from trainctl.store.journal import Journal

    config = tmp_path / "ssh_config"
    config.write_text("Host gpu7\n  HostName 127.0.0.1\n  Port 1\n  BatchMode yes\n")
    monkeypatch.setenv("TRAINCTL_SSH_CONFIG", str(config))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("TRAINCTL_NODE_SSH", raising=False)
    asked: list[str] = []

    def job_info(job):
        asked.append(job)
        return None if state is None else slurm.JobInfo(job, state)

    monkeypatch.setattr(slurm, "job_info", job_info)
    run = run_dir_with(tmp_path, {"node": "gpu7", "boot_id": "not-this-one", "slurm_job": "77"}, sock=True)
    journal = Journal(run / "events.jsonl")
    journal.append(E.State(1.0, "RUNNING", "progress"))
    journal.close()
    transport = transport_for(run)
    if not offline:
        with pytest.raises(AgentUnreachable):
            asyncio.run(transport.open())
    else:

        async def hello() -> bytes:
            reader, writer = await transport.open()
            writer.write(b'{"op": "hello", "since": 0}\n')
            return await reader.readline()

        assert json.loads(asyncio.run(hello()))["live"] is False
    assert asked == ["77"]


def test_a_client_never_adopts_a_slurm_run(tmp_path):
    """A run between two attempts with no agent is adopted by a client's new agent, but not a
    Slurm run's: its agent runs in its job, on a node whose agent.lock this machine may not see."""
    from trainctl.agent.adopt import needs_adoption
    from trainctl.core import events as E
    from trainctl.store.journal import Journal
    from trainctl.store.spec import RunSpec

    run = tmp_path / "run"
    run.mkdir()
    RunSpec(job_name="t", kind="command", command=["true"]).save(run / "spec.json")
    journal = Journal(run / "events.jsonl")
    journal.append(E.State(1.0, "BACKOFF", "attempt 1 crashed"))
    journal.close()
    assert needs_adoption(run)
    (run / "slurm.json").write_text('{"jobs": ["41"]}')
    assert not needs_adoption(run)
    node = run / "node1"  # a node's directory of a job of several nodes: the job's too
    node.mkdir()
    RunSpec(job_name="t-node1", kind="command", command=["true"]).save(node / "spec.json")
    journal = Journal(node / "events.jsonl")
    journal.append(E.State(1.0, "BACKOFF", "attempt 1 crashed"))
    journal.close()
    assert not needs_adoption(node)
    (run / "slurm.json").unlink()
    assert needs_adoption(node)
