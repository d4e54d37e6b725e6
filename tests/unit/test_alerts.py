"""Alerts: the pure policy (time as an argument), redaction, config, and the sink against
a real receiver (apprise json:// posts to a local HTTP server)."""

from __future__ import annotations

import os
import time

import pytest

from tests.helpers.receiver import Receiver, silent_receiver
from trainctl.alerts.policy import AlertPolicy
from trainctl.alerts.settings import AlertConfigError, load_user_alerts, redact, redact_text, run_alerts
from trainctl.alerts.sink import AlertSink, send_with_helper
from trainctl.core import events as E


def policy(**kw) -> AlertPolicy:
    return AlertPolicy("yolo-boxes", "gpu-box", "trainctl attach /runs/x", **kw)


def stall_incident(p: AlertPolicy, t: float) -> None:
    p.feed(E.Progress(t - 5, 2, 10, 311, 500), t - 5)
    p.feed(E.Stall(t, "train", 30.0, "deadlock", 0.0, None, 30.0, "DataLoader worker"), t)
    p.feed(E.Exit(t + 3, -9, "SIGKILL"), t + 3)
    p.feed(
        E.Restart(t + 4, 2, "the trainer stalled; falling back from A to B", "B", "/runs/x/last.pt", 1.0),
        t + 4,
    )


def test_a_stall_and_what_trainctl_did_are_one_message_naming_the_job():
    p = policy()
    p.feed(E.Checkpoint(880.0, "/runs/x/last.pt", 2), 880.0)
    p.feed(
        E.Projection(
            900.0,
            eta=900.0 + 3600,
            deadline=900.0 + 7200,
            buffer_s=3600,
            rate=1.0,
            cost_so_far=None,
            cost_at_eta=None,
        ),
        900.0,
    )
    stall_incident(p, 1000.0)
    alerts = p.due(1004.5)
    assert len(alerts) == 1 and p.due(1010.0) == []
    a = alerts[0]
    assert "\n" not in a.title and "yolo-boxes" in a.title and "restarted under preset B" in a.title
    assert "job yolo-boxes on gpu-box" in a.body
    assert (
        "stalled in train at epoch 2 batch 311 after 30 s without progress: deadlock, DataLoader worker"
    ) in a.body
    assert "restarted under preset B from the checkpoint of 2 m ago" in a.body
    assert "before the deadline" in a.body and "ETA" in a.body and "declared" not in a.body
    assert "look: trainctl attach /runs/x" in a.body
    assert set(a.kinds) == {"stall", "fallback"}


def test_an_eta_on_a_declared_rate_says_so():
    p = policy()
    p.feed(
        E.Projection(
            900.0,
            eta=900.0 + 3600,
            deadline=900.0 + 7200,
            buffer_s=3600,
            rate=2.1,
            cost_so_far=None,
            cost_at_eta=None,
            rate_source="declared",
            preset="B",
        ),
        900.0,
    )
    stall_incident(p, 1000.0)
    [a] = p.due(1004.5)
    assert "(at preset B's declared rate, not measured yet), 60 m before the deadline" in a.body, a.body


def test_a_stall_waits_a_bounded_time_for_what_follows():
    p = policy(settle_s=45)
    p.feed(E.Stall(0.0, "train", 30.0, "spin", 100.0), 0.0)
    assert p.due(10.0) == []
    [a] = p.due(45.0)
    assert "nothing followed within 45 s" in a.body


def test_a_crash_loop_gives_one_alert_a_minute_then_a_digest():
    p = policy()
    sent = []
    t = 0.0
    for i in range(20):  # a crash every 5 s for 100 s, then the run fails
        p.feed(E.Exit(t, 1), t)
        p.feed(E.Restart(t + 0.5, i + 2, "the trainer crashed", "A", None, 1.0), t + 0.5)
        sent += [(t + 0.5, a) for a in p.due(t + 0.5)]
        t += 5.0
    p.feed(E.State(t, "FAILED", "gave up after 20 restarts"), t)
    sent += [(t, a) for a in p.due(t)]
    sent += [(t + 61, a) for a in p.due(t + 61)]
    times = [s for s, _ in sent]
    assert all(b - a >= 60 for a, b in zip(times, times[1:])), times
    assert len(sent) <= 3
    first, digests = sent[0][1], [a for _, a in sent[1:]]
    assert first.items == 1 and "exit code 1" in first.body
    assert digests and "digest" in digests[0].title and digests[0].items > 5
    assert any("failed for good" in a.body for a in digests)
    assert "goodput 0.0 % · lost" in digests[0].body and "restart start-up" in digests[0].body


def test_the_finished_alert_says_the_goodput():
    p = policy(on=["finished"])
    for e in [E.Start(0, 1, 1, "A"), E.Phase(10, "train"), E.Progress(40, 1, 1, 1, 1), E.Exit(40, 0)]:
        p.feed(e, e.ts)
    p.feed(E.State(40, "FINISHED", "the trainer exited 0"), 40)
    (a,) = p.due(40)
    assert "goodput 75.0 % · lost 10 s: start-up 10" in a.body


def test_flush_sends_what_is_held_at_the_end_and_on_chooses_kinds():
    p = policy(on=["finished", "failed"])
    stall_incident(p, 0.0)  # stall + fallback: not chosen
    assert p.due(5.0) == []
    p.feed(E.State(20.0, "FINISHED", "the trainer exited 0"), 20.0)
    [a] = p.due(20.0)
    assert "finished" in a.title and "yolo-boxes" in a.title
    p2 = policy()
    stall_incident(p2, 0.0)
    p2.due(5.0)
    p2.feed(E.State(20.0, "FINISHED"), 20.0)
    assert p2.due(20.0) == []  # within the minute: held
    [last] = p2.flush(21.0)
    assert "finished" in last.title


def test_trainer_text_is_sanitized_in_messages():
    p = policy()
    p.feed(E.Warning(0.0, "oom", "fatal", "out of \x1b]52;c;Zm9v\x07memory\x07 on rank 0"), 0.0)
    p.feed(E.State(1.0, "FAILED", "a fatal warning"), 1.0)
    [a] = p.due(1.0)
    assert "\x1b" not in a.body and "\x07" not in a.body and "out of memory" in a.body


def test_redact_keeps_scheme_and_host_only():
    assert redact("ntfys://ntfy.sh/my-secret-topic") == "ntfys://ntfy.sh/…"
    assert redact("json://127.0.0.1:8080/tok?x=1") == "json://127.0.0.1:8080/…"
    assert redact("tgram://123:ABCsecret/456") == "tgram://…"
    assert redact("mailto://me:pw@mail.example.org") == "mailto://mail.example.org/…"
    assert "secret" not in redact_text("failed to post to json://h.example.org/secret: 500")


def test_alerts_toml_names_default_and_mode(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINCTL_CONFIG_DIR", str(tmp_path))
    f = tmp_path / "alerts.toml"
    f.write_text(
        'bell = false\ndefault = ["phone"]\n[alert.phone]\nurl = "ntfys://ntfy.sh/t"\n'
        '[alert.team]\nurls = ["json://a.example.org/x", "json://b.example.org/y"]\n'
    )
    os.chmod(f, 0o644)
    with pytest.raises(AlertConfigError, match="chmod 600"):
        load_user_alerts()
    os.chmod(f, 0o600)
    user = load_user_alerts()
    assert user.bell is False and user.named["team"][1] == "json://b.example.org/y"
    assert run_alerts(None, [], user) == (["ntfys://ntfy.sh/t"], list(run_alerts(None, [], user)[1]))
    urls, on = run_alerts({"use": ("team",), "on": ("failed",)}, ["json://c.example.org/z"], user)
    assert urls == ["json://a.example.org/x", "json://b.example.org/y", "json://c.example.org/z"]
    assert on == ["failed"]
    with pytest.raises(AlertConfigError, match="no alert named 'nope'"):
        run_alerts(None, ["nope"], user)


def test_the_sink_posts_to_a_real_receiver_and_a_silent_one_costs_the_bus_nothing():
    with Receiver() as rx, silent_receiver() as silent:
        warnings = []
        sink = AlertSink(
            [rx.url, silent],
            policy(),
            sender=lambda u, t, b: send_with_helper(u, t, b, timeout=6.0),
            on_warning=warnings.append,
        )
        calls = []
        t0 = time.time()
        for ev in (
            E.Progress(t0, 2, 10, 311, 500),
            E.Stall(t0, "train", 30.0, "deadlock", 0.0, None, 30.0, "DataLoader worker"),
            E.Restart(t0, 2, "the trainer stalled; falling back from A to B", "B", None, 1.0),
        ):
            s = time.perf_counter()
            sink(ev)
            calls.append(time.perf_counter() - s)
        assert max(calls) < 0.1, calls  # the sink returns at once
        [post] = rx.wait(1)
        assert "yolo-boxes" in post["title"] and "restarted under preset B" in post["message"]
        assert "deadlock, DataLoader worker" in post["message"]
        sink.close(timeout=15)
        # the silent receiver timed out: journaled once, redacted
        assert len(warnings) == 1 and warnings[0].id == "trainctl.alert_failed"
        assert "never-answers" not in warnings[0].text and "127.0.0.1" in warnings[0].text


def test_a_stall_said_at_detection_takes_its_verdict_into_the_same_message():
    p = policy()
    p.feed(E.Progress(995.0, 2, 10, 311, 500), 995.0)
    p.feed(E.Stall(1000.0, "train", 30.0, E.DIAGNOSING, None, None, 30.0, "no progress for 30s"), 1000.0)
    p.feed(E.StallDiagnosis(1002.0, "train", "deadlock", 0.0, None, "DataLoader worker"), 1002.0)
    p.feed(E.Restart(1004.0, 2, "the trainer stalled; falling back from A to B", "B", None, 0.0), 1004.0)
    [a] = p.due(1004.5)
    assert "deadlock" in a.title, a.title  # the head follows the verdict
    assert "after 30 s without progress: no progress for 30s" in a.body and "diagnosing" not in a.body
    assert "diagnosis: deadlock, DataLoader worker" in a.body, a.body
