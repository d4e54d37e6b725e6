"""A node's agent kept going inside its Slurm job: the keeper (`slurm-agent.sh`, from
src/trainctl/hosts/slurm/queue.py keeper_script) run for real by bash, with a stand-in agent."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from trainctl.hosts.slurm import queue as slurm

# The stand-in agent: a bash script that counts its starts in a file and does what the
# test's plan asks of its Nth start (an exit code, a kill -9 of itself, wait for USR1).
STAND_IN = r"""
n=$(( $(cat "$DIR/starts" 2>/dev/null || echo 0) + 1 )); echo $n > "$DIR/starts"
echo "$n ${TRAINCTL_AGENT_RESTARTED:-} $*" >> "$DIR/seen"
case "$(sed -n "${n}p" "$DIR/plan")" in
  kill) kill -KILL $$ ;;
  usr1) trap 'exit 42' USR1; echo ready > "$DIR/ready"; while :; do sleep 0.05; done ;;
  *) exit "$(sed -n "${n}p" "$DIR/plan")" ;;
esac
"""


def run_keeper(tmp_path, plan: list[str], usr1: bool = False) -> tuple[int, list[str]]:
    (tmp_path / "agent.sh").write_text(STAND_IN)
    (tmp_path / "plan").write_text("\n".join(plan) + "\n")
    keeper = tmp_path / "keeper.sh"
    keeper.write_text(slurm.keeper_script(tmp_path, agent=f"bash {tmp_path}/agent.sh"))
    proc = subprocess.Popen(
        ["bash", str(keeper)], env={**os.environ, "DIR": str(tmp_path)}, stderr=subprocess.PIPE, text=True
    )
    if usr1:
        deadline = time.monotonic() + 20
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)  # the time-limit warning, to the batch shell only
    proc.wait(timeout=60)
    return proc.returncode, (tmp_path / "seen").read_text().splitlines()


def test_the_keeper_starts_a_killed_agent_again_adopting(tmp_path):
    rc, seen = run_keeper(tmp_path, ["kill", "kill", "0"])
    assert rc == 0 and len(seen) == 3
    assert seen[0] == "1  " and seen[1].startswith("2 1:9:") and seen[1].endswith(" --adopt")
    assert seen[2].startswith("3 2:9:") and seen[2].endswith(" --adopt")


@pytest.mark.parametrize("code", ["1", "130", "143"])
def test_the_keeper_ends_with_the_agents_own_end(tmp_path, code):
    rc, seen = run_keeper(tmp_path, [code])
    assert rc == int(code) and len(seen) == 1


def test_the_keeper_gives_up_after_its_restarts(tmp_path):
    rc, seen = run_keeper(tmp_path, ["kill"] * (slurm.AGENT_RESTARTS + 2))
    assert rc == 137 and len(seen) == slurm.AGENT_RESTARTS + 1


def test_the_keeper_passes_the_warning_signal_to_the_agent(tmp_path):
    rc, seen = run_keeper(tmp_path, ["usr1"], usr1=True)
    assert rc == 42 and len(seen) == 1
