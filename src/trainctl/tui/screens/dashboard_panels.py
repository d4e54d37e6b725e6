"""The dashboard's panels: what each widget shows, pushed down from the run model.

:class:`DashboardPanels` is a part of :class:`~trainctl.tui.screens.dashboard.DashboardScreen`
(a mixin, as :mod:`trainctl.tui.screens.dashboard_keys`: the model, the connection and the
widgets are the screen's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual.markup import escape

from trainctl.core.goodput import describe
from trainctl.core.recovery import FINAL_STATES
from trainctl.tui import fmt
from trainctl.tui.screens.dashboard_keys import LIVE_STATES, continue_command
from trainctl.tui.widgets.log_tail import LogTail
from trainctl.tui.widgets.loss_chart import ChartData, LossChart
from trainctl.tui.widgets.progress_panel import ProgressInfo, ProgressPanel
from trainctl.tui.widgets.projection_panel import ProjectionInfo, ProjectionPanel
from trainctl.tui.widgets.resources_panel import ResourcesInfo, ResourcesPanel
from trainctl.tui.widgets.run_header import HeaderInfo, RunHeader
from trainctl.tui.widgets.stall_meter import StallInfo, StallMeter
from trainctl.tui.widgets.warnings_panel import WarningsPanel

if TYPE_CHECKING:
    from textual.screen import Screen

    from trainctl.tui.model import RunModel

    _ScreenBase = Screen[None]  # the mixin's methods run on the screen
else:
    _ScreenBase = object

NARROW_BELOW = 120  # columns: below this the panels use their compact layout


class DashboardPanels(_ScreenBase):
    """The panels' half of the dashboard screen (see the module doc)."""

    # the screen's (DashboardScreen sets them), declared for the type checker
    run_state: str
    connected: bool
    show_log: bool
    model: RunModel
    queued: dict[str, Any] | None
    clock: Callable[[], float]
    attention: int
    chart_range: str
    _connection: str
    _chart_seen: int
    _warnings_seen: int

    @property
    def wide(self) -> bool:
        return self.size.width >= NARROW_BELOW

    def _push(self) -> None:
        model = self.model
        self.run_state = model.state
        self._push_header()
        self._push_clock()
        # where Ultralytics writes the results (save_dir): on the progress panel's lower border
        panel = self.query_one(ProgressPanel)
        panel.border_subtitle = (
            escape(f"results {fmt.path(model.save_dir, max(12, panel.size.width - 14))}")
            if model.save_dir
            else ""
        )
        tick = model.tick
        stall = model.stall
        ended = model.state if model.state in FINAL_STATES else None
        self.query_one(StallMeter).info = StallInfo(
            phase=(tick.phase if tick else None) or model.phase,
            idle_s=tick.idle_s if tick else None,
            threshold_s=tick.threshold_s if tick else None,
            stalled=model.state == "STALLED",
            diagnosis=stall.diagnosis if stall else None,
            stall_phase=stall.phase if stall else None,
            stall_idle_s=stall.idle_s if stall else None,
            detail=stall.detail if stall else "",
            stacks=self._short_path(stall.stacks) if stall else None,
            wide=self.wide,
            ended=ended,
            go_on=continue_command(model.run_dir) if ended else "",
        )
        self.query_one(ResourcesPanel).info = ResourcesInfo(
            tick.processes if tick else (),
            tick.gpu if tick else None,
            tick is not None,
            self.wide,
            ended,
            model.rank_rows(),
            model.stuck_ranks if model.state in ("STALLED", "STOPPING") else (),
        )
        if model.chart_version != self._chart_seen:
            self._chart_seen = model.chart_version
            self.query_one(LossChart).show(self.chart_data())
        if model.warnings_version != self._warnings_seen:
            self._warnings_seen = model.warnings_version
            self.query_one(WarningsPanel).show_rows(model.warning_rows())
            self.refresh_bindings()
        notes = model.take_notes()
        if notes and self.show_log:
            self.query_one(LogTail).append_lines(notes)

    def _short_path(self, path: str | None) -> str | None:
        """A path inside the run directory, relative to it."""
        run_dir = self.model.run_dir.rstrip("/")
        if path and run_dir and path.startswith(run_dir + "/"):
            return path[len(run_dir) + 1 :]
        return path

    def _push_header(self) -> None:
        m = self.model
        state = m.state
        if self.queued is not None and state not in FINAL_STATES:
            state = "PENDING"  # its job waits in Slurm's queue: no agent yet, not a hang
        self.query_one(RunHeader).info = HeaderInfo(
            m.job,
            m.host,
            m.preset,
            state,
            m.attempt,
            m.auto_recover,
            self.connected,
            self._connection,
            self.wide,
            self.attention,
            m.tick.workers
            if m.tick and m.tick.processes and self.connected and state in LIVE_STATES
            else None,
        )

    def _push_clock(self) -> None:
        """The parts that change with time alone: time in this epoch, time to ETA."""
        m, now = self.model, self.clock()
        p = m.progress
        in_epoch = None
        if m.epoch_started is not None:
            end = now if m.state in LIVE_STATES and self.connected else m.last_progress_ts
            in_epoch = max(0.0, (end or now) - m.epoch_started)
        proj = m.projection
        rate, source, whose = (
            (p.rate, "measured", None)  # the trainer's own figure: measured
            if p and p.rate is not None
            else (proj.rate, proj.rate_source, proj.preset)
            if proj
            else (None, None, None)
        )
        self.query_one(ProgressPanel).info = ProgressInfo(
            p.epoch if p else None,
            p.epochs if p else None,
            p.batch if p else None,
            p.batches if p else None,
            rate,
            in_epoch,
            m.phase,
            source,
            whose,
            self.wide,
        )
        ended = m.state if m.state in FINAL_STATES else None
        goodput = describe(self.goodput_now())
        ladder = m.tick.ladder if m.tick is not None and self.connected else None
        self.query_one(ProjectionPanel).info = ProjectionInfo(
            m.projection, now, self.wide, ended, goodput=goodput, ladder=ladder
        )

    def goodput_now(self) -> dict:
        """The run's goodput, its time going on to now while the run lives here."""
        m = self.model
        return m.goodput.totals(self.clock() if m.state in LIVE_STATES and self.connected else None)

    def chart_data(self) -> ChartData:
        m = self.model
        now = self.clock() if m.state in LIVE_STATES and self.connected else None
        series, restarts = m.chart(self.chart_range, now=now)
        return ChartData(series, restarts, self.chart_range)
