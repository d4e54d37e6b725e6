"""Alerts end to end: a real `trainctl run` whose worker deadlocks under preset A posts ONE
incident alert (stall, diagnosis, restart under B) and then a finished alert to a real
receiver (apprise json:// to a local HTTP server); the holder says "unsupervised" when the
agent is killed while the trainer runs."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.e2e.conftest import PYTHON, start_trainctl
from tests.helpers.hangs import STEADY
from tests.helpers.receiver import Receiver

pytestmark = pytest.mark.e2e


def steady_args(tmp_path, *extra: str) -> list[str]:
    ckpt = tmp_path / "ckpt.json"
    return [
        "run",
        "--json",
        "--name",
        "alerted",
        "--preset",
        "A",
        "--fallback",
        "B",
        "--stall-timeout",
        "2",
        "--resume-arg=--resume",
        f"--resume-arg={ckpt}",
        *extra,
        "--",
        PYTHON,
        "-u",
        str(STEADY),
        "--epochs",
        "3",
        "--batches",
        "10",
        "--batch-time",
        "0.03",
        "--mp-workers",
        "2",
        "--hang-at",
        "2:4",
        "--hang-attempt",
        "1",
        "--checkpoint",
        str(ckpt),
    ]


def test_a_hang_under_A_gives_one_incident_alert_and_the_finish_a_finished_alert(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINCTL_CONFIG_DIR", str(tmp_path / "config"))
    with Receiver() as rx:
        with start_trainctl(steady_args(tmp_path, "--alert", rx.url)) as tc:
            res = tc.wait(120)
        assert res.returncode == 0, res.stderr[-2000:]
        rx.wait(2, timeout=30)
        time.sleep(0.5)
        assert len(rx.posts) == 2, [p["title"] for p in rx.posts]
        incident, finished = rx.posts
        assert "alerted" in incident["title"] and "restarted under preset B" in incident["title"]
        body = incident["message"]
        assert "job alerted on" in body and "stalled in train at epoch 2" in body
        assert "restarted under preset B" in body and "trainctl attach" in body
        assert "alerted" in finished["title"] and "finished" in finished["title"]
        # latency: the event that closed the incident (the restart) -> received
        restart = next(e for e in res.events if e.type == "restart")
        latency = incident["_received"] - restart.ts
        print(f"ALERT_LATENCY restart->received {latency:.3f}s")
        assert latency < 10
    # the token never reaches the journal, the spec or the logs; alerts.json is 0600
    run_dir = res.run_dir
    for name in ("events.jsonl", "spec.json", "holder.out", "train.log"):
        path = run_dir / name
        if path.exists():
            assert "hook-secret-token" not in path.read_text(errors="replace"), name
    assert "hook-secret-token" not in res.stdout + res.stderr
    assert os.stat(run_dir / "alerts.json").st_mode & 0o777 == 0o600
    assert any(e.type == "info" and e.key == "alerts" and "json://127.0.0.1" in e.text for e in res.events)


def test_the_holder_says_unsupervised_when_the_agent_dies(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINCTL_CONFIG_DIR", str(tmp_path / "config"))
    args = [
        "run",
        "--json",
        "--name",
        "orphaned",
        "--alert",
        "",
        "--",
        PYTHON,
        "-u",
        str(STEADY),
        "--epochs",
        "1000",
        "--batches",
        "10",
        "--batch-time",
        "0.05",
    ]
    with Receiver() as rx:
        args[args.index("--alert") + 1] = rx.url
        with start_trainctl(args) as tc:
            tc.wait_event(lambda e: e.type == "progress", 60, "progress")
            info = json.loads((tc.run_dir / "agent.json").read_text())
            os.kill(info["pid"], signal.SIGKILL)
            try:
                [post] = rx.wait(1, timeout=30)
            except TimeoutError:
                out = tc.run_dir / "holder.out"
                raise AssertionError(out.read_text() if out.exists() else "no holder.out") from None
            assert "orphaned" in post["title"] and "UNSUPERVISED" in post["title"]
            assert "trainctl attach" in post["message"]
