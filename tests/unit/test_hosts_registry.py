"""Which host a target means (src/trainctl/hosts/registry.py): the one place that chooses."""

from __future__ import annotations

import json

import pytest

from trainctl.core.usage import UsageError
from trainctl.hosts import registry
from trainctl.hosts.box import SshBox
from trainctl.hosts.local import LocalHost
from trainctl.hosts.slurm.host import SlurmHost


def test_a_run_directory_is_this_machines_unless_it_is_a_slurm_runs(tmp_path):
    from trainctl.hosts.slurm import queue as slurm

    plain, queued, ran = tmp_path / "plain", tmp_path / "queued", tmp_path / "ran"
    for d in (plain, queued, ran):
        d.mkdir(mode=0o700)
    slurm.add_job(queued, "41")
    (ran / "agent.json").write_text(json.dumps({"node": "gpu7", "slurm_job": "42"}))
    assert isinstance(registry.host_for(plain), LocalHost)
    assert isinstance(registry.host_for(queued), SlurmHost)
    assert isinstance(registry.host_for(ran), SlurmHost)
    assert isinstance(registry.host_for("slurm:"), SlurmHost)
    assert isinstance(registry.host_for_launch(slurm=True), SlurmHost)
    assert isinstance(registry.host_for_launch(), LocalHost)
    assert registry.host_for_launch("gpu-box", slurm=True).where == "gpu-box"


def test_urls_destinations_and_rows_name_their_host():
    box = registry.host_for("ssh://me@gpu-box/~/runs/a")
    assert isinstance(box, SshBox) and box.where == "me@gpu-box"
    assert box.attach_hint("/r/a b") == "trainctl attach ssh://me@gpu-box/r/a%20b"
    assert registry.host_for_destination("gpu-box").where == "gpu-box"
    assert registry.host_for_destination("ssh://me@gpu-box:2222").where == "ssh://me@gpu-box:2222"
    assert registry.host_for_row({"where": "gpu-box", "run_dir": "/r"}).where == "gpu-box"
    assert isinstance(registry.host_for_row({"where": "local", "run_dir": "/nowhere"}), LocalHost)
    with pytest.raises(UsageError, match="bad SSH destination"):
        registry.host_for_destination("-oProxyCommand=x")
    with pytest.raises(UsageError, match="no host knows it"):
        registry.host_for("gopher://x/y")


def test_a_registered_kind_is_asked_first_and_taken_back():
    class Mine:
        where = "mine://"

    mine = Mine()
    kind = registry.register(registry.Kind("mine", lambda t: mine if t.startswith("mine://") else None))
    try:
        assert registry.host_for("mine://x") is mine
        assert registry.host_for_destination("mine://x") is mine  # `--host mine://x`
        assert registry.host_for_row({"where": "mine://", "run_dir": "x"}) is mine
    finally:
        registry.unregister(kind)
    with pytest.raises(UsageError):
        registry.host_for("mine://x")
