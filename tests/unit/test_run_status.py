"""Issue 29, item 4: the status builder (src/trainctl/hosts/run_status.py) is below the CLI:
with no agent to ask, a run's status comes from its run directory, as `trainctl status
--json` prints it."""

from __future__ import annotations

import pytest

from tests.unit.test_client_offline import make_run
from trainctl.hosts.run_status import run_status

pytestmark = pytest.mark.timeout(30)


def test_an_ended_run_without_an_agent_is_read_from_its_journal(tmp_path):
    built = run_status(make_run(tmp_path, "FINISHED"))
    assert (built.code, built.agent, built.error) == (0, "agent not running", None)
    status = built.status
    assert (status["state"], status["attempt"], status["preset"]) == ("FINISHED", 2, "B")
    assert status["progress"]["batch"] == 3 and "op" not in status and "ok" not in status
    assert "live" not in status or status["live"] is False
    assert "slurm" not in status and "nodes" not in status
