"""The one dashboard screen: it owns the run model and pushes views down to its widgets.

Bridge messages arrive here (:class:`EventBatch` and friends); the screen folds them into
a :class:`RunModel` and sets each widget's ``info``.  Keys request changes from the agent
through ``command`` (the bridge's); destructive ones ask first in a modal
(:mod:`trainctl.tui.screens.dashboard_keys`); what each panel shows is
:mod:`trainctl.tui.screens.dashboard_panels`.

With ``runs`` (the CLI's ``RunsSource``: every run of the user, blocking calls, made in
threads here): `g` picks another run to follow (the app switches the bridge; messages of
the bridge left are dropped by their ``gen``), the header counts the other runs that need
attention (every ATTENTION_EVERY_S), and a Slurm run with no agent shows its queued job's
state and reason (every SLURM_EVERY_S); `s` then scancels the job.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal
from textual.markup import escape
from textual.notifications import SeverityLevel
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Input
from textual.worker import Worker, WorkerState

from trainctl.core.events import DIAGNOSING, Event, Stall, State
from trainctl.core.recovery import FINAL_STATES
from trainctl.core.runview import RANGES
from trainctl.core.sanitize import sanitize
from trainctl.store.listing import attention_count
from trainctl.tui.background import in_background
from trainctl.tui.messages import AgentConnected, AgentDisconnected, CommandDone, EventBatch
from trainctl.tui.model import RunModel
from trainctl.tui.screens.dashboard_keys import (
    COMMAND_WORDS,
    KEYS,
    DashboardKeys,
    outcome,
)
from trainctl.tui.screens.dashboard_panels import DashboardPanels
from trainctl.tui.widgets.log_tail import LogTail
from trainctl.tui.widgets.loss_chart import LossChart
from trainctl.tui.widgets.progress_panel import ProgressPanel
from trainctl.tui.widgets.projection_panel import ProjectionPanel
from trainctl.tui.widgets.resources_panel import ResourcesPanel
from trainctl.tui.widgets.run_header import RunHeader
from trainctl.tui.widgets.stall_meter import StallMeter
from trainctl.tui.widgets.warnings_panel import WarningsPanel

Command = Callable[..., Awaitable[dict[str, Any]]]
BRIDGE_RESTART_S = 2.0  # after an internal error in the bridge
ALERT_RECENT_S = 5.0
ATTENTION_EVERY_S = 5.0  # the other runs looked at (journals, squeue, ssh hosts) in a thread
SLURM_EVERY_S = 2.0  # a Slurm run with no agent: its job's state and reason


async def _not_connected(name: str, /, **args: Any) -> dict[str, Any]:
    return {"ok": False, "error": "not connected to the agent", "result": None}


class DashboardScreen(DashboardKeys, DashboardPanels, Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = list(KEYS)

    connected: reactive[bool] = reactive(False, bindings=True)
    run_state: reactive[str] = reactive("STARTING", bindings=True)
    show_log: reactive[bool] = reactive(False)

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        title_hint: str = "",
        runs: Any = None,
        run_key: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(id="dashboard")
        self.runs = runs  # RunsSource-like, or None: no picker, no count
        self.run_key = run_key  # (where, run_dir) of the run on screen, when known
        self.gen = 0  # the bridge generation whose messages count
        self.attention = 0  # other runs that need attention
        self.queued: dict[str, Any] | None = None  # a Slurm run's waiting job, no agent
        self.switch_run: Callable[[dict], object] | None = None  # the app's
        self._busy: set[str] = set()  # background looks still going (a slow ssh host)
        self.clock = clock
        self.model = RunModel()
        self.model.job = title_hint
        self.command: Command = _not_connected
        self.bridge_restart: Callable[[], object] | None = None
        self._connection = "connecting…"
        self._offline = False
        self._chart_seen = -1
        self.chart_range = RANGES[0]
        self._warnings_seen = -1
        self._dumped: tuple[float, str] | None = None  # (when, path) of the dump `d` wrote
        self.bell = True  # ring the terminal bell on a stall or failure
        self._alerts_since = clock() - ALERT_RECENT_S  # a replayed journal's old stalls stay quiet

    def compose(self) -> ComposeResult:
        yield RunHeader(id="header")
        with Horizontal(id="top"):
            yield ProgressPanel(id="progress", classes="panel")
            yield StallMeter(id="stall", classes="panel")
        with Horizontal(id="middle"):
            yield LossChart(id="chart", classes="panel")
            yield WarningsPanel(id="warnings", classes="panel")
        yield LogTail(id="log", classes="panel")
        yield Input(
            placeholder="find in the output (enter: newest match; n: the next one back; escape: close)",
            id="log-search",
        )
        with Horizontal(id="bottom"):
            yield ProjectionPanel(id="projection", classes="panel")
            yield ResourcesPanel(id="resources", classes="panel")
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(1.0, self._push_clock)
        if self.runs is not None:
            self.set_interval(ATTENTION_EVERY_S, self._look_at_runs)
            self.set_interval(SLURM_EVERY_S, self._look_at_slurm)
            self.call_later(self._look_at_runs)
        self._push()

    def reset_run(self, gen: int, title_hint: str, run_key: tuple[str, str] | None) -> None:
        """Another run is followed from now on (bridge ``gen``): everything shown is its."""
        self.gen, self.run_key, self.queued = gen, run_key, None
        self.model = RunModel()
        self.model.job = title_hint
        self._connection, self._offline = "connecting…", False
        self._chart_seen = self._warnings_seen = -1
        self._alerts_since = self.clock() - ALERT_RECENT_S
        self.connected = False
        self.query_one(LogTail).replace_lines(())
        self._push()
        self.call_later(self._look_at_runs)

    @property
    def current_key(self) -> tuple[str, str] | None:
        if self.run_key is not None:
            return self.run_key
        return ("local", self.model.run_dir) if self.model.run_dir else None

    # ------------------------------------------------------------------ the other runs
    def _look_at_runs(self) -> None:
        if self.runs is not None and "runs" not in self._busy:
            self._busy.add("runs")
            in_background(self.app, self.runs.poll_rows, partial(self._took_rows, self.gen), "runs")

    def _took_rows(self, gen: int, rows: list[dict] | None, error: BaseException | None) -> None:
        self._busy.discard("runs")
        if gen != self.gen or rows is None:
            return
        count = attention_count(rows, self.current_key)
        if count != self.attention:
            self.attention = count
            self._push_header()

    def _look_at_slurm(self) -> None:
        key = self.current_key
        if (
            self.runs is None
            or not self._offline
            or key is None
            or key[0] != "local"
            or self.model.state in FINAL_STATES
            or "slurm" in self._busy
        ):
            if self.queued is not None and (not self._offline or self.model.state in FINAL_STATES):
                self.queued = None
                self._push_header()
            return
        self._busy.add("slurm")
        in_background(
            self.app, partial(self.runs.slurm_status, key[1]), partial(self._took_slurm, self.gen), "slurm"
        )

    def _took_slurm(self, gen: int, info: dict | None, error: BaseException | None) -> None:
        self._busy.discard("slurm")
        if gen != self.gen or not self._offline or error is not None:
            return
        from trainctl.hosts.slurm.queue import ENDED

        state = str((info or {}).get("state") or "").split(" ")[0]
        self.queued = info if state and state not in ENDED else None
        if self.queued is not None:
            reason = self.queued.get("reason")
            why = f" ({reason})" if reason not in (None, "", "None") else ""
            self._connection = f"Slurm job {self.queued['job']} {state}{why}: waiting for its agent"
        elif info is not None and info.get("error"):
            self._connection = f"no agent running; Slurm: {info['error']}"
        elif info is not None and state and self.model.last_seq < 0:  # ended, and no agent ever wrote a line
            self._connection = f"Slurm job {info['job']} {state} before its agent started"
        else:
            self._connection = "journal only: no agent running"
        self.refresh_bindings()
        self._push_header()

    def on_resize(self) -> None:
        self.set_class(not self.wide, "-narrow")
        footer = self.query_one(Footer)
        footer.compact = not self.wide
        footer.show_command_palette = self.wide
        if self.model.version:
            self._push()

    # ------------------------------------------------------------------ bridge messages
    def on_agent_connected(self, message: AgentConnected) -> None:
        if message.gen != self.gen:
            return  # the run switched away from
        self.model.apply_hello(message.hello)
        # No agent: the run directory's journal answered (the run is over, or its agent died).
        self._offline = message.hello.get("live") is False
        if not self._offline:
            self.queued = None
            self._connection = "connected"
        elif self.queued is None:
            self._connection = "journal only: no agent running"
        self.connected = not self._offline
        self._push()

    def on_agent_disconnected(self, message: AgentDisconnected) -> None:
        if message.gen != self.gen:
            return
        if self._offline:
            self.connected = False
            self._push_header()
            return  # the journal was replayed; the label stays
        over = " (run over)" if self.model.state in FINAL_STATES else ""
        self._connection = (
            f"disconnected{over} — retrying in {message.retry_in:.0f}s"
            if message.retry_in >= 1
            else f"disconnected{over} — retrying"
        )
        self.connected = False
        self._push_header()

    def on_event_batch(self, message: EventBatch) -> None:
        if message.gen != self.gen:
            return
        model = self.model
        if message.snapshot is not None:
            self._take_snapshot(message.snapshot.view)
        self._alert_on(message.events)
        model.apply_all(message.events)
        if message.tick is not None:
            model.apply_tick(message.tick)
        if message.log_lines:
            lines = model.apply_log(message.log_lines)
            if self.show_log:
                self.query_one(LogTail).append_lines(lines)
        self._push()

    def _take_snapshot(self, view: dict[str, Any]) -> None:
        """The run's view up to the events that follow (a long replay, skipped)."""
        fresh = RunModel()
        try:
            fresh.load_dict(view)
        except ValueError as e:
            self.report_error(
                f"the agent's snapshot is unusable ({e}); restart the dashboard for a full replay"
            )
            return
        m = self.model
        fresh.apply_hello(
            {
                "job": m.job,
                "host": m.host,
                "run_dir": m.run_dir,
                "fallback": m.fallback,
                "auto_recover": m.auto_recover,
            }
        )
        fresh.tick, fresh.log = m.tick, m.log
        fresh.version = m.version + 1
        fresh.chart_version, fresh.warnings_version = m.chart_version + 1, m.warnings_version + 1
        self.model = fresh

    def _alert_on(self, events: Iterable[Event]) -> None:
        """A stall or a failure as it happens: a notification and the terminal bell (in
        tmux the bell sets the window's alert flag, seen from the other windows)."""
        severity: SeverityLevel
        for ev in events:
            if ev.ts < self._alerts_since:
                continue
            if isinstance(ev, Stall):
                what = "no batch" if ev.diagnosis == DIAGNOSING else ev.diagnosis
                text = f"{what} in {ev.phase} after {ev.idle_s:.0f} s without progress"
                title, severity = "Stalled", "warning"
            elif isinstance(ev, State) and ev.state == "FAILED":
                text, title, severity = ev.reason or "the run failed", "Failed", "error"
            else:
                continue
            self.notify(escape(sanitize(text)), title=title, severity=severity, timeout=10)
            if self.bell:
                self.app.bell()

    def on_command_done(self, message: CommandDone) -> None:
        if not message.ok:
            self.notify(
                escape(sanitize(str(message.error))),
                title=f"{COMMAND_WORDS.get(message.name, message.name)} failed",
                severity="error",
                timeout=8,
            )
            return
        if message.name == "auto_recover":
            self.model.auto_recover = bool(message.args.get("on"))
            self._push_header()
        if message.name == "dump_stacks" and (message.result or {}).get("stacks"):
            self._dumped = (self.clock(), str(message.result["stacks"]))
            self.refresh_bindings()
        self.notify(
            escape(sanitize(outcome(message.name, message.args, message.result))),
            title=COMMAND_WORDS.get(message.name, message.name).capitalize(),
            timeout=8,
        )

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place this screen's worker failures land (bridge, commands, dialogs):
        an error row in the warnings panel; the bridge is started again."""
        worker = event.worker
        if event.state != WorkerState.ERROR:
            return
        self.report_error(f"{worker.name or worker.group} failed: {worker.error!r}")
        if worker.group == "engine" and self.bridge_restart is not None:
            self.set_timer(BRIDGE_RESTART_S, self.bridge_restart)

    def report_error(self, text: str) -> None:
        """A failure inside the TUI itself, shown as an error row in the warnings panel."""
        self.model.note("trainctl.tui", "error", text, "see the log for the traceback", self.clock())
        self._push()

    def action_cycle_range(self) -> None:
        self.chart_range = RANGES[(RANGES.index(self.chart_range) + 1) % len(RANGES)]
        self._chart_seen = -1
        self._push()

    def action_show_goodput(self) -> None:
        from trainctl.tui.screens.goodput import GoodputScreen

        self.app.push_screen(GoodputScreen(self.goodput_now()))

    def watch_show_log(self, show: bool) -> None:
        """The log view takes the place of the chart and warnings (no restyle, no chart
        redraw at a new size: toggling stays cheap while the trainer floods output); it
        takes the focus, so the arrows scroll it back."""
        log = self.query_one(LogTail)
        if show:
            log.replace_lines(self.model.log)
            self.model.take_notes()  # in model.log already
        log.display = show
        self.query_one("#middle").display = not show
        if show:
            log.focus()
        else:
            self._close_search()
            self.set_focus(None)
        self.refresh_bindings()

    def action_find_in_log(self) -> None:
        if self._allowed("find_in_log"):
            search = self.query_one("#log-search", Input)
            search.display = True
            search.focus()

    def action_find_next(self) -> None:
        if self._allowed("find_next"):
            log = self.query_one(LogTail)
            log.find(log.query_text, again=True)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "log-search":
            return
        event.stop()
        log = self.query_one(LogTail)
        if event.value.strip():
            log.find(event.value.strip())
        self._close_search()
        self.refresh_bindings()

    def _close_search(self) -> None:
        search = self.query_one("#log-search", Input)
        if search.display:
            search.display = False
            if self.show_log:
                self.query_one(LogTail).focus()
