"""Pilot tests: the run picker (`g`), the header's count of other runs that need attention,
and a Slurm run whose job waits in the queue (PENDING with squeue's reason; `s` scancels),
against FakeAgents and a fake runs source (the CLI's RunsSource: blocking calls, here
blocking on purpose to show the dashboard does not wait for them)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from tui_fakes import FakeAgent, FakeClient
from tui_helpers import replayed, screen_text, shown, wait_for

from trainctl.core import events as ev
from trainctl.tui.app import TrainctlApp
from trainctl.tui.screens.confirm import ConfirmScreen
from trainctl.tui.screens.run_picker import RunPicker, picker_rows

pytestmark = pytest.mark.timeout(60)

HERE = ("local", "/home/ana/runs/yolo-rocm-20251115")


def ls_row(run_dir: str, state: str, job: str = "other", **kw: Any) -> dict:
    return {
        "where": "local",
        "run_dir": run_dir,
        "job": job,
        "state": state,
        "live": state in ("RUNNING", "STALLED"),
        "reason": "",
        "progress": None,
        "eta": None,
        "buffer_s": None,
        "incident": None,
        "started": 1.0,
        **kw,
    }


class FakeRuns:
    """The runs source: ``rows`` (blocking while ``gate`` is closed), a client factory per
    run from ``agents``, a Slurm status per run directory, the scancels asked."""

    def __init__(self, rows: list[dict], agents: dict[str, FakeAgent]) -> None:
        self.listed = rows
        self.agents = agents
        self.gate = threading.Event()
        self.gate.set()
        self.calls = 0
        self.slurm: dict[str, dict] = {}
        self.stopped: list[str] = []

    def rows(self) -> list[dict]:
        self.calls += 1
        self.gate.wait(30)
        return list(self.listed)

    poll_rows = rows

    def client_factory(self, row: dict):
        return self.agents[row["run_dir"]].client

    def attach_hint(self, row: dict) -> str:
        return f"trainctl attach {row['run_dir']}"

    def slurm_status(self, run_dir: str) -> dict | None:
        return self.slurm.get(run_dir)

    def stop_queued(self, run_dir: str) -> str:
        info = self.slurm.pop(run_dir)
        self.stopped.append(info["job"])
        agent = self.agents[run_dir]
        agent.journal.append(
            ev.State(
                1.0,
                "STOPPED",
                f"stopped by the user: Slurm job {info['job']} cancelled before it ran",
                seq=len(agent.journal),
            )
        )
        agent.hello = {**agent.hello, "state": "STOPPED"}  # as the real offline hello says
        return info["job"]


class OfflineClient(FakeClient):
    """No agent: the journal, then the end of the stream (as the real client's fallback)."""

    async def events(self):
        for event in self._backlog:
            yield event


def offline(agent: FakeAgent):
    return lambda: OfflineClient(agent)


def small_journal(job: str) -> list[ev.Event]:
    return [
        ev.Start(100.0, 1, 1234, "A", ("python", "t.py"), seq=0),
        ev.State(100.5, "RUNNING", "", seq=1),
        ev.Progress(101.0, 1, 3, 5, 100, {"loss": 1.5}, 2.0, seq=2),
    ]


def test_picker_rows_mark_the_run_on_screen_and_those_that_need_attention():
    rows = [
        ls_row(HERE[1], "RUNNING", job="yolo"),
        ls_row("/r/b", "STALLED"),
        ls_row("/r/c", "FINISHED"),
        {"where": "gpu-box", "error": "cannot list its runs: x", "started": None},
    ]
    got = picker_rows(rows, HERE)
    assert [r.cells[0] for r in got] == ["▶", "!", " ", " "]
    assert [r.selectable for r in got] == [False, True, True, False]
    assert got[1].attention == "stalled" and got[1].cells[1:4] == ("STALLED", "other", "/r/b")
    assert got[0].current and got[0].key == HERE


def test_picker_rows_tell_two_demo_runs_apart(monkeypatch, tmp_path):
    """Two runs of one job under the default runs folder: each is shown by its directory's
    name (the time it began), not by a long common prefix cut to 'demo-2026…'."""
    monkeypatch.setenv("TRAINCTL_RUNS_DIR", str(tmp_path / "runs"))
    rows = [
        ls_row(str(tmp_path / "runs" / "demo-20261127-125959"), "FINISHED", job="demo"),
        ls_row(str(tmp_path / "runs" / "demo-20261127-131502"), "RUNNING", job="demo"),
        ls_row(str(tmp_path / "elsewhere" / "demo-x"), "STOPPED", job="demo"),
    ]
    got = picker_rows(rows, None)
    assert [r.cells[3] for r in got] == [
        "demo-20261127-125959",
        "demo-20261127-131502",
        str(tmp_path / "elsewhere" / "demo-x"),
    ]
    assert [r.key for r in got] == [("local", r["run_dir"]) for r in rows]


async def test_the_header_counts_other_runs_that_need_attention_without_waiting(make_app, agent):
    rows = [
        ls_row(HERE[1], "STALLED", job="yolo-rocm"),  # the one on screen: not counted
        ls_row("/r/b", "STALLED"),
        ls_row("/r/c", "FAILED", reason="budget spent"),
        ls_row("/r/d", "RUNNING"),
        ls_row("/r/e", "FINISHED"),
    ]
    runs = FakeRuns(rows, {})
    runs.gate.clear()  # a slow ssh host: rows() blocks
    app = make_app(runs=runs, run_key=HERE)
    async with app.run_test(size=(160, 48)) as pilot:
        await replayed(pilot, agent)  # the dashboard works meanwhile
        await wait_for(pilot, lambda: runs.calls == 1, what="the look at the runs")
        await pilot.press("l")
        await wait_for(pilot, lambda: app.dashboard.show_log, what="the log toggled")
        assert "need attention" not in screen_text(app)
        runs.gate.set()
        await wait_for(pilot, lambda: app.dashboard.attention == 2, what="the count")
        await wait_for(pilot, lambda: "2 other runs need attention" in screen_text(app), what="header")
        runs.listed = rows[:1] + rows[3:]
        app.dashboard._look_at_runs()
        await wait_for(pilot, lambda: app.dashboard.attention == 0, what="none left")
        await pilot.pause()
        assert "need attention" not in screen_text(app)


async def test_the_picker_lists_every_run_and_switches_to_the_one_chosen(make_app, agent):
    other = FakeAgent(
        small_journal("other"),
        {
            "job": "other-job",
            "run_dir": "/r/b",
            "host": "box2",
            "state": "RUNNING",
            "preset": "A",
            "auto_recover": True,
        },
        {},
    )
    rows = [ls_row(HERE[1], "RUNNING", job="yolo-rocm"), ls_row("/r/b", "STALLED", job="other-job")]
    runs = FakeRuns(rows, {"/r/b": other})
    app = make_app(runs=runs, run_key=HERE)
    async with app.run_test(size=(160, 48)) as pilot:
        await replayed(pilot, agent)
        # escape cancels: the same run, the same bridge
        await pilot.press("g")
        await shown(pilot, RunPicker)
        await wait_for(pilot, lambda: app.screen.rows is not None, what="the rows")
        text = screen_text(app)
        assert "other-job" in text and "STALLED" in text and "▶" in text
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is app.dashboard, what="dashboard")
        assert app.bridge.gen == 0 and app.dashboard.model.job == "yolo-rocm"
        # enter on the other run: the dashboard follows it, the first agent is let go
        await pilot.press("g")
        await shown(pilot, RunPicker)
        await wait_for(pilot, lambda: app.screen.rows is not None, what="the rows")
        await pilot.press(*"zzz")  # typing narrows the list
        await wait_for(pilot, lambda: app.screen.rows == [], what="nothing matches zzz")
        assert "no runs matching “zzz”" in screen_text(app)
        await pilot.press("backspace", "backspace", "backspace", *"OTHER")
        await wait_for(
            pilot, lambda: [r.key for r in app.screen.rows] == [("local", "/r/b")], what="only the other run"
        )
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.screen is app.dashboard, what="dashboard")
        await wait_for(pilot, lambda: app.dashboard.model.last_seq == 2, what="the other journal")
        model = app.dashboard.model
        assert (model.job, model.host, app.bridge.gen) == ("other-job", "box2", 1)
        assert model.progress.batch == 5 and model.chart_points() == 1
        await wait_for(pilot, lambda: not agent._queues, what="the first agent's client closed")
        agent.append(ev.State(2e9, "FAILED", "from the run left"))  # never shown now
        other.append(ev.Progress(102.0, 1, 3, 6, 100, {"loss": 1.4}, 2.0))
        await wait_for(pilot, lambda: app.dashboard.model.last_seq == 3, what="live from the other")
        assert app.dashboard.model.state == "RUNNING"
        assert "other-job@box2" in screen_text(app)
        assert app.come_back_hint() == "trainctl attach /r/b"
        await pilot.press("r")  # commands go to the run on screen
        await shown(pilot, ConfirmScreen)
        await pilot.press("y")
        await wait_for(pilot, lambda: other.names("restart"), what="restart sent to the other")
        assert not agent.names("restart")


async def test_a_queued_slurm_job_shows_pending_and_s_cancels_it(journal):
    queued = FakeAgent(
        [], {"op": "hello", "live": False, "job": "sl-queued", "run_dir": "/r/q", "state": "UNKNOWN"}, {}
    )
    runs = FakeRuns([], {"/r/q": queued})
    runs.slurm["/r/q"] = {"job": "42", "jobs": ["42"], "state": "PENDING", "reason": "BeginTime"}
    app = TrainctlApp(offline(queued), runs=runs, run_key=("local", "/r/q"), clock=lambda: 200.0)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.queued is not None, what="the Slurm job")
        await pilot.pause()
        text = screen_text(app)
        assert "PENDING" in text and "Slurm job 42 PENDING (BeginTime)" in text, text
        assert app.dashboard.check_action("stop", ()) is True
        assert app.dashboard.check_action("restart", ()) is None
        await pilot.press("s")
        await shown(pilot, ConfirmScreen)
        assert "scancel" in screen_text(app)
        await pilot.press("y")
        await wait_for(pilot, lambda: runs.stopped == ["42"], what="scancel")
        await wait_for(pilot, lambda: app.dashboard.model.state == "STOPPED", what="STOPPED", timeout=15)
        await wait_for(pilot, lambda: app.dashboard.queued is None, what="no job waits", timeout=5)
        await pilot.pause()
        assert " STOPPED " in screen_text(app)


async def test_a_queued_slurm_run_goes_live_by_itself_when_its_agent_answers():
    """PENDING while the job waits (no agent: the journal only); once the job's agent
    answers, the dashboard is connected to it without a key pressed."""
    queued = FakeAgent(
        small_journal("sl")[:0],
        {"op": "hello", "live": False, "job": "sl-next", "run_dir": "/r/q", "state": "UNKNOWN"},
        {},
    )
    runs = FakeRuns([], {"/r/q": queued})
    runs.slurm["/r/q"] = {"job": "43", "jobs": ["43"], "state": "PENDING", "reason": "Priority"}
    live = {"up": False}

    def client():
        return queued.client() if live["up"] else OfflineClient(queued)

    app = TrainctlApp(client, runs=runs, run_key=("local", "/r/q"), clock=lambda: 200.0)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(
            pilot, lambda: "Slurm job 43 PENDING (Priority)" in screen_text(app), what="PENDING and why"
        )
        assert not app.dashboard.connected
        for event in small_journal("sl"):  # the job started: its agent journals
            queued.journal.append(event)
        queued.hello = {**queued.hello, "live": True, "state": "RUNNING"}
        runs.slurm["/r/q"] = {"job": "43", "jobs": ["43"], "state": "RUNNING", "reason": "None"}
        live["up"] = True
        await wait_for(pilot, lambda: app.dashboard.connected, what="connected by itself")
        await wait_for(pilot, lambda: app.dashboard.model.last_seq == 2, what="its journal")
        await pilot.pause()
        assert app.dashboard.queued is None
        text = screen_text(app)
        assert "● connected" in text and " RUNNING " in text and "PENDING" not in text, text


async def test_a_refused_scancel_is_said_and_the_job_still_shows_queued():
    queued = FakeAgent(
        [], {"op": "hello", "live": False, "job": "sl-queued", "run_dir": "/r/q", "state": "UNKNOWN"}, {}
    )
    runs = FakeRuns([], {"/r/q": queued})
    runs.slurm["/r/q"] = {"job": "44", "jobs": ["44"], "state": "PENDING", "reason": "Priority"}

    def refused(run_dir: str) -> str:
        raise RuntimeError("scancel: error: Kill job error on job id 44: Access/permission denied")

    runs.stop_queued = refused
    notes: list[str] = []
    app = TrainctlApp(offline(queued), runs=runs, run_key=("local", "/r/q"), clock=lambda: 200.0)
    async with app.run_test(size=(160, 48)) as pilot:
        app.dashboard.notify = lambda text, **kw: notes.append(text)
        await wait_for(pilot, lambda: app.dashboard.queued is not None, what="the Slurm job")
        await pilot.press("s")
        await shown(pilot, ConfirmScreen)
        await pilot.press("y")
        await wait_for(pilot, lambda: any("permission denied" in n for n in notes), what="why")
        assert app.dashboard.queued is not None and app.dashboard.check_action("stop", ()) is True
        assert "scancel" not in app.dashboard._busy
