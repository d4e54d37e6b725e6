"""The one dashboard screen: it owns the run model and pushes views down to its widgets.

Bridge messages arrive here (:class:`EventBatch` and friends); the screen folds them into
a :class:`RunModel` and sets each widget's ``info``.  Keys request changes from the agent
through ``command`` (the bridge's); destructive ones ask first in a modal.

With ``runs`` (the CLI's ``RunsSource``: every run of the user, blocking calls, made in
threads here): `g` picks another run to follow (the app switches the bridge; messages of
the bridge left are dropped by their ``gen``), the header counts the other runs that need
attention (every ATTENTION_EVERY_S), and a Slurm run with no agent shows its queued job's
state and reason (every SLURM_EVERY_S); `s` then scancels the job.
"""
from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.markup import escape
from textual.binding import Binding
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Input
from textual.worker import Worker, WorkerState

from trainctl.core.projection_text import checkpoint_phrase
from trainctl.inside.report import SAVE_ON_REQUEST_KEY
from trainctl.store.listing import attention_count
from trainctl.core.runview import RANGES
from trainctl.core.sanitize import sanitize
from trainctl.core.recovery import FINAL_STATES

from trainctl.tui import fmt
from trainctl.tui.background import in_background
from trainctl.tui.messages import AgentConnected, AgentDisconnected, CommandDone, EventBatch
from trainctl.tui.model import RunModel
from trainctl.tui.screens.confirm import ConfirmScreen
from trainctl.tui.screens.help import HelpScreen
from trainctl.tui.screens.preset_editor import PresetEditorScreen
from trainctl.tui.screens.preset_picker import PresetPicker
from trainctl.tui.screens.run_picker import RunPicker
from trainctl.tui.screens.stacks import StacksScreen
from trainctl.tui.widgets.log_tail import LogTail
from trainctl.tui.widgets.loss_chart import ChartData, LossChart
from trainctl.tui.widgets.progress_panel import ProgressInfo, ProgressPanel
from trainctl.tui.widgets.projection_panel import ProjectionInfo, ProjectionPanel
from trainctl.tui.widgets.resources_panel import ResourcesInfo, ResourcesPanel
from trainctl.tui.widgets.run_header import HeaderInfo, RunHeader
from trainctl.tui.widgets.stall_meter import StallInfo, StallMeter
from trainctl.tui.widgets.warnings_panel import WarningsPanel

Command = Callable[..., Awaitable[dict[str, Any]]]
LIVE_STATES = ("STARTING", "RUNNING", "STALLED")
BRIDGE_RESTART_S = 2.0   # after an internal error in the bridge
NARROW_BELOW = 120   # columns: below this the panels use their compact layout
AGENT_ACTIONS = ("restart", "fallback", "pick_preset", "edit_preset", "stop", "dump_stacks",
                 "toggle_auto")
KEY_WORDS = {"toggle_auto": "auto-recovery", "dump_stacks": "stack dump", "pick_preset": "preset switch",
             "edit_preset": "preset edit", "show_stacks": "last stack dump", "pick_run": "run list",
             "dismiss_warning": "dismiss", "find_in_log": "find", "find_next": "next match"}
ENDED_HIDDEN = ("restart", "fallback", "pick_preset", "stop", "dump_stacks", "toggle_auto")


COMMAND_WORDS = {"restart": "restart", "fallback": "fallback", "switch_preset": "preset switch",
                 "stop": "stop", "auto_recover": "auto-recovery", "dump_stacks": "stack dump",
                 "write_preset": "preset save", "set_next_preset": "next preset",
                 "list_presets": "preset list", "read_preset": "preset read"}


def outcome(name: str, args: dict[str, Any], result: Any) -> str:
    """What a command the agent accepted did, in words (the toast after a key)."""
    r = result if isinstance(result, dict) else {}
    if name == "auto_recover":
        on = r.get("auto_recover", args.get("on"))
        return ("auto-recovery on: stalls and crashes restart the trainer" if on else
                "auto-recovery off: a stall is diagnosed and left for you")
    if name == "dump_stacks":
        if not r.get("stacks"):
            return f"no stacks written: {r.get('detail') or 'py-spy gave none'}"
        return f"stacks written to {r['stacks']} ({r.get('diagnosis', '?')}); k opens them"
    if name in ("restart", "fallback", "switch_preset"):
        preset = r.get("preset") or args.get("preset")
        with_ = f" with preset {preset}" if preset else ""
        return (f"restarting the trainer{with_}" if r.get("restart") == "now" else
                f"the next attempt starts{with_}")
    if name == "stop":
        return "stopping: the trainer is killed and not restarted"
    if name == "write_preset":
        return f"preset {r.get('name', '?')} saved to {r.get('path', '?')}"
    if name == "set_next_preset":
        return f"the next restart uses preset {r.get('next_preset', '?')}"
    return f"{COMMAND_WORDS.get(name, name)}: done"


STACKS_SAID = re.compile(r"stacks dumped to (.+?) \(")   # the agent's note after `d`


def continue_command(run_dir: str) -> str:
    """How to go on from a run that ended: a new run from its last good checkpoint."""
    return f"trainctl run JOB --resume-from {fmt.home_path(run_dir) or 'RUN_DIR'}"


ALERT_RECENT_S = 5.0
ATTENTION_EVERY_S = 5.0   # the other runs looked at (journals, squeue, ssh hosts) in a thread
SLURM_EVERY_S = 2.0       # a Slurm run with no agent: its job's state and reason


async def _not_connected(name: str, /, **args: Any) -> dict[str, Any]:
    return {"ok": False, "error": "not connected to the agent", "result": None}


class DashboardScreen(Screen[None]):
    BINDINGS = [
        Binding("question_mark", "help", "Help", key_display="?", id="help",
                tooltip="Keys and what the run states mean"),
        Binding("q", "app.leave", "Quit", id="quit",
                tooltip="Leave the dashboard; the run goes on"),
        Binding("r", "restart", "Restart", id="restart",
                tooltip="Restart the trainer: saved first where it can, else from the last good "
                        "checkpoint, else from the start (the confirmation says which)"),
        Binding("f", "fallback", "Fallback", id="fallback",
                tooltip="Restart with the job's fallback preset (the safe one), the same way as r"),
        Binding("p", "pick_preset", "Preset…", id="pick_preset",
                tooltip="Pick a preset and restart with it"),
        Binding("e", "edit_preset", "Edit", id="edit_preset",
                tooltip="Edit the running preset; save for now or the next restart"),
        Binding("s", "stop", "Stop", id="stop", tooltip="Stop the run: kill the trainer, no restart"),
        Binding("d", "dump_stacks", "Stacks", id="dump_stacks",
                tooltip="py-spy dump of the trainer and its workers into the run directory"),
        Binding("a", "toggle_auto", "Auto", id="auto_recover",
                tooltip="Turn automatic restarts after stalls and crashes on or off"),
        Binding("z", "cycle_range", "Range", id="chart_range",
                tooltip="The loss chart's range: the whole run, the last hour, the last epoch"),
        Binding("l", "toggle_log", "Log", id="toggle_log",
                tooltip="Show or hide the trainer's raw output"),
        Binding("g", "pick_run", "Runs…", id="pick_run",
                tooltip="Every run of yours (here, on the ssh hosts, on Slurm): follow another"),
        Binding("k", "show_stacks", "Last stacks", id="show_stacks",
                tooltip="Open the last stack dump (a stall's, or the one d wrote)"),
        Binding("x", "dismiss_warning", "Dismiss", id="dismiss_warning",
                tooltip="Dismiss the highlighted warning until it happens again"),
        Binding("slash", "find_in_log", "Find", key_display="/", id="find_in_log",
                tooltip="In the log view: find text in the trainer's output"),
        Binding("n", "find_next", "Next", id="find_next", show=False,
                tooltip="In the log view: the next match further back"),
    ]

    connected: reactive[bool] = reactive(False, bindings=True)
    run_state: reactive[str] = reactive("STARTING", bindings=True)
    show_log: reactive[bool] = reactive(False)

    def __init__(self, *, clock: Callable[[], float] = time.time, title_hint: str = "",
                 runs: Any = None, run_key: tuple[str, str] | None = None) -> None:
        super().__init__(id="dashboard")
        self.runs = runs                  # RunsSource-like, or None: no picker, no count
        self.run_key = run_key            # (where, run_dir) of the run on screen, when known
        self.gen = 0                      # the bridge generation whose messages count
        self.attention = 0                # other runs that need attention
        self.queued: dict[str, Any] | None = None   # a Slurm run's waiting job, no agent
        self.switch_run: Callable[[dict], object] | None = None   # the app's
        self._busy: set[str] = set()      # background looks still going (a slow ssh host)
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
        self._dumped: tuple[float, str] | None = None   # (when, path) of the dump `d` wrote
        self.bell = True                          # ring the terminal bell on a stall or failure
        self._alerts_since = clock() - ALERT_RECENT_S   # a replayed journal's old stalls stay quiet

    def compose(self) -> ComposeResult:
        yield RunHeader(id="header")
        with Horizontal(id="top"):
            yield ProgressPanel(id="progress", classes="panel")
            yield StallMeter(id="stall", classes="panel")
        with Horizontal(id="middle"):
            yield LossChart(id="chart", classes="panel")
            yield WarningsPanel(id="warnings", classes="panel")
        yield LogTail(id="log", classes="panel")
        yield Input(placeholder="find in the output (enter: newest match; n: the next one back; "
                    "escape: close)", id="log-search")
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
            in_background(self.app, self.runs.poll_rows, partial(self._took_rows, self.gen),
                          "runs")

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
        if (self.runs is None or not self._offline or key is None or key[0] != "local"
                or self.model.state in FINAL_STATES or "slurm" in self._busy):
            if self.queued is not None and (not self._offline or self.model.state in FINAL_STATES):
                self.queued = None
                self._push_header()
            return
        self._busy.add("slurm")
        in_background(self.app, partial(self.runs.slurm_status, key[1]),
                      partial(self._took_slurm, self.gen), "slurm")

    def _took_slurm(self, gen: int, info: dict | None, error: BaseException | None) -> None:
        self._busy.discard("slurm")
        if gen != self.gen or not self._offline or error is not None:
            return
        from trainctl.hosts.slurm.commands import ENDED
        state = str((info or {}).get("state") or "").split(" ")[0]
        self.queued = info if state and state not in ENDED else None
        if self.queued is not None:
            reason = self.queued.get("reason")
            why = f" ({reason})" if reason not in (None, "", "None") else ""
            self._connection = (f"Slurm job {self.queued['job']} {state}{why}: waiting for its "
                                "agent")
        elif info is not None and info.get("error"):
            self._connection = f"no agent running; Slurm: {info['error']}"
        elif state and self.model.last_seq < 0:   # ended, and no agent ever wrote a line
            self._connection = f"Slurm job {info['job']} {state} before its agent started"
        else:
            self._connection = "journal only: no agent running"
        self.refresh_bindings()
        self._push_header()

    @property
    def wide(self) -> bool:
        return self.size.width >= NARROW_BELOW

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
            return   # the run switched away from
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
            return   # the journal was replayed; the label stays
        over = " (run over)" if self.model.state in FINAL_STATES else ""
        self._connection = (f"disconnected{over} — retrying in {message.retry_in:.0f}s"
                            if message.retry_in >= 1 else f"disconnected{over} — retrying")
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
            self.report_error(f"the agent's snapshot is unusable ({e}); restart the dashboard "
                              "for a full replay")
            return
        m = self.model
        fresh.apply_hello({"job": m.job, "host": m.host, "run_dir": m.run_dir,
                           "fallback": m.fallback, "auto_recover": m.auto_recover})
        fresh.tick, fresh.log = m.tick, m.log
        fresh.version = m.version + 1
        fresh.chart_version, fresh.warnings_version = m.chart_version + 1, m.warnings_version + 1
        self.model = fresh

    def _alert_on(self, events) -> None:
        """A stall or a failure as it happens: a notification and the terminal bell (in
        tmux the bell sets the window's alert flag, seen from the other windows)."""
        for ev in events:
            if ev.ts < self._alerts_since:
                continue
            if ev.type == "stall":
                text = f"{ev.diagnosis} in {ev.phase} after {ev.idle_s:.0f} s without progress"
                title, severity = "Stalled", "warning"
            elif ev.type == "state" and ev.state == "FAILED":
                text, title, severity = ev.reason or "the run failed", "Failed", "error"
            else:
                continue
            self.notify(escape(sanitize(text)), title=title, severity=severity, timeout=10)
            if self.bell:
                self.app.bell()

    def on_command_done(self, message: CommandDone) -> None:
        if not message.ok:
            self.notify(escape(sanitize(str(message.error))),
                        title=f"{COMMAND_WORDS.get(message.name, message.name)} failed",
                        severity="error", timeout=8)
            return
        if message.name == "auto_recover":
            self.model.auto_recover = bool(message.args.get("on"))
            self._push_header()
        if message.name == "dump_stacks" and (message.result or {}).get("stacks"):
            self._dumped = (self.clock(), str(message.result["stacks"]))
            self.refresh_bindings()
        self.notify(escape(sanitize(outcome(message.name, message.args, message.result))),
                    title=COMMAND_WORDS.get(message.name, message.name).capitalize(), timeout=8)

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
        self.model.note("trainctl.tui", "error", text, "see the log for the traceback",
                         self.clock())
        self._push()

    # ------------------------------------------------------------------ pushing views down
    def _push(self) -> None:
        model = self.model
        self.run_state = model.state
        self._push_header()
        self._push_clock()
        # where Ultralytics writes the results (save_dir): on the progress panel's lower border
        panel = self.query_one(ProgressPanel)
        panel.border_subtitle = escape(f"results {fmt.path(model.save_dir, max(12, panel.size.width - 14))}"
                                       ) if model.save_dir else ""
        tick = model.tick
        stall = model.stall
        ended = model.state if model.state in FINAL_STATES else None
        self.query_one(StallMeter).info = StallInfo(
            phase=(tick.phase if tick else None) or model.phase,
            idle_s=tick.idle_s if tick else None, threshold_s=tick.threshold_s if tick else None,
            stalled=model.state == "STALLED",
            diagnosis=stall.diagnosis if stall else None, stall_phase=stall.phase if stall else None,
            stall_idle_s=stall.idle_s if stall else None, detail=stall.detail if stall else "",
            stacks=self._short_path(stall.stacks) if stall else None, wide=self.wide,
            ended=ended, go_on=continue_command(model.run_dir) if ended else "")
        self.query_one(ResourcesPanel).info = ResourcesInfo(
            tick.processes if tick else (), tick.gpu if tick else None, tick is not None,
            self.wide, ended, model.rank_rows(),
            model.stuck_ranks if model.state in ("STALLED", "STOPPING") else ())
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
            return path[len(run_dir) + 1:]
        return path

    def _push_header(self) -> None:
        m = self.model
        state = m.state
        if self.queued is not None and state not in FINAL_STATES:
            state = "PENDING"   # its job waits in Slurm's queue: no agent yet, not a hang
        self.query_one(RunHeader).info = HeaderInfo(
            m.job, m.host, m.preset, state, m.attempt, m.auto_recover, self.connected,
            self._connection, self.wide, self.attention)

    def _push_clock(self) -> None:
        """The parts that change with time alone: time in this epoch, time to ETA."""
        m, now = self.model, self.clock()
        p = m.progress
        in_epoch = None
        if m.epoch_started is not None:
            end = now if m.state in LIVE_STATES and self.connected else m.last_progress_ts
            in_epoch = max(0.0, (end or now) - m.epoch_started)
        proj = m.projection
        if p and p.rate is not None:   # the trainer's own figure: measured
            rate, source, whose = p.rate, "measured", None
        else:
            rate, source, whose = (proj.rate, proj.rate_source, proj.preset) if proj else (None, None, None)
        self.query_one(ProgressPanel).info = ProgressInfo(
            p.epoch if p else None, p.epochs if p else None, p.batch if p else None,
            p.batches if p else None, rate, in_epoch, m.phase, source, whose, self.wide)
        ended = m.state if m.state in FINAL_STATES else None
        self.query_one(ProjectionPanel).info = ProjectionInfo(m.projection, now, self.wide, ended)

    def chart_data(self) -> ChartData:
        m = self.model
        now = self.clock() if m.state in LIVE_STATES and self.connected else None
        series, restarts = m.chart(self.chart_range, now=now)
        return ChartData(series, restarts, self.chart_range)

    def action_cycle_range(self) -> None:
        self.chart_range = RANGES[(RANGES.index(self.chart_range) + 1) % len(RANGES)]
        self._chart_seen = -1
        self._push()

    def watch_show_log(self, show: bool) -> None:
        """The log view takes the place of the chart and warnings (no restyle, no chart
        redraw at a new size: toggling stays cheap while the trainer floods output); it
        takes the focus, so the arrows scroll it back."""
        log = self.query_one(LogTail)
        if show:
            log.replace_lines(self.model.log)
            self.model.take_notes()   # in model.log already
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

    # ------------------------------------------------------------------ keys
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """True: the key acts; False: hidden (it cannot act on a run that ended); None:
        shown greyed (not now).  A key pressed that cannot act says why (``on_key``)."""
        if self.why_not(action) is None:
            return True
        if action in ("pick_run", "show_stacks", "dismiss_warning", "find_in_log", "find_next"):
            return False   # nothing to act on: not worth a place in the footer
        return False if self.run_state in FINAL_STATES and action in ENDED_HIDDEN else None

    def why_not(self, action: str) -> str | None:
        """Why a key cannot act now, in words; None when it can."""
        state = self.run_state
        ended = (f"the run is {state}. To go on from its last checkpoint: "
                 f"{continue_command(self.model.run_dir)}")
        if action == "pick_run":
            return None if self.runs is not None else "no list of runs in this dashboard"
        if action == "show_stacks":
            return None if self.last_stacks() else "no stack dump yet (d writes one)"
        if action == "dismiss_warning":
            if self.show_log:
                return "the log view is open (l closes it)"
            panels = self.query(WarningsPanel)
            return None if panels and panels.first().rows else "no warning to dismiss"
        if action in ("find_in_log", "find_next"):
            if not self.show_log:
                return "open the log view first (l)"
            logs = self.query(LogTail)
            if action == "find_next" and not (logs and logs.first().query_text):
                return "nothing to find yet (/)"
            return None
        if action == "stop" and self.queued is not None and not self.connected:
            return None if state not in FINAL_STATES else ended   # scancel the queued job
        if action in AGENT_ACTIONS and state in FINAL_STATES and action != "edit_preset":
            return ended
        if action in AGENT_ACTIONS and not self.connected:
            return "not connected to the agent" + (f" ({self._connection})" if self._connection else "")
        if action == "fallback" and not self.model.fallback:
            return "this run has no fallback preset (--fallback, or `fallback` in the job)"
        if action == "stop" and state == "STOPPING":
            return "the run is already stopping"
        if action == "dump_stacks" and state not in LIVE_STATES:
            return f"no trainer to dump: the run is {state}"
        return None

    def _allowed(self, action: str) -> bool:
        """Palette commands skip the footer's greying: check again and say why not."""
        why = self.why_not(action)
        if why is None:
            return True
        self.notify(escape(f"{KEY_WORDS.get(action, action.replace('_', ' '))} cannot act: {why}"),
                    severity="warning",
                    timeout=8)
        return False

    def on_key(self, event) -> None:
        """A key of a binding that cannot act now (hidden or greyed) says why, not nothing."""
        search = self.query_one("#log-search", Input)
        if self.focused is search:
            if event.key == "escape":
                event.stop()
                self._close_search()
            return
        for binding in self.BINDINGS:
            if event.key in binding.key.split(",") and self.why_not(binding.action) is not None:
                event.stop()
                self._allowed(binding.action)
                return

    def action_restart(self) -> None:
        if self._allowed("restart"):
            self._confirm_then("restart", "Restart the trainer now?",
                               self.restart_words(self.model.preset or "?"))

    def action_fallback(self) -> None:
        if self._allowed("fallback"):
            fb = self.model.fallback
            self._confirm_then("fallback", f"Fall back to preset {fb}?", self.restart_words(fb))

    def restart_words(self, preset: str) -> str:
        """What a restart does to this run, as it stands: a trainer that saves on request
        saves first; else it resumes from the last good checkpoint, or with none yet,
        starts over."""
        m = self.model
        ckpt = m.projection.checkpoint if m.projection is not None else None
        saves = SAVE_ON_REQUEST_KEY in m.warnings
        if saves:
            after = (f" If that save fails, it resumes from the last good checkpoint "
                     f"({checkpoint_phrase(ckpt, self.clock())})." if ckpt else
                     " If that save fails, there is no checkpoint yet: it starts over.")
            return (f"The trainer saves now, is killed and resumed from that save with preset "
                    f"{preset}.{after}")
        if ckpt:
            return (f"The trainer is killed and resumed with preset {preset} from the last good "
                    f"checkpoint: {checkpoint_phrase(ckpt, self.clock())}.")
        return (f"There is no checkpoint yet: the trainer is killed and starts over from the "
                f"beginning with preset {preset}.")

    def action_stop(self) -> None:
        if self.queued is not None and not self.connected and self._allowed("stop"):
            job = self.queued.get("job")
            if "scancel" in self._busy:
                self.notify(f"Slurm job {job} is being cancelled", severity="warning")
                return
            self._confirm_cancel(job, "Stop the run?",
                                 f"Its Slurm job {job} waits in the queue: it is cancelled "
                                 "(scancel) and the run ends STOPPED. The journal stays.")
        elif self._allowed("stop"):
            self._confirm_then("stop", "Stop the run?",
                               "The trainer is killed and not restarted. The journal stays.")

    def action_dump_stacks(self) -> None:
        if self._allowed("dump_stacks"):
            self.send("dump_stacks")

    def action_toggle_auto(self) -> None:
        if self._allowed("toggle_auto"):
            self.send("auto_recover", on=not self.model.auto_recover)

    def action_toggle_log(self) -> None:
        self.show_log = not self.show_log

    def last_stacks(self) -> str | None:
        """The newest stack dump: the last stall's, or one `d` wrote (said in the journal)."""
        m = self.model
        found: list[tuple[float, str]] = []
        if m.stall is not None and m.stall.stacks:
            found.append((m.stall.ts, m.stall.stacks))
        said = m.warnings.get("stacks")
        if said is not None:
            match = STACKS_SAID.match(said.text)
            if match:
                found.append((said.ts, match.group(1)))
        if self._dumped is not None:
            found.append(self._dumped)
        return max(found)[1] if found else None

    def action_show_stacks(self) -> None:
        if not self._allowed("show_stacks"):
            return
        path = self.last_stacks()
        where = self.current_key[0] if self.current_key else "local"
        if where != "local":
            self.notify(escape(f"the last stack dump is on {where}: {path}"), timeout=10)
            return
        self.app.push_screen(StacksScreen(path))

    def action_dismiss_warning(self) -> None:
        if self._allowed("dismiss_warning"):
            row = self.query_one(WarningsPanel).dismiss_selected()
            if row is not None:
                self.notify(escape(f"dismissed until it happens again: {row.text.splitlines()[0]}"),
                            timeout=4)
            self.refresh_bindings()

    def action_pick_run(self) -> None:
        if self._allowed("pick_run"):
            self._pick_run()

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(list(self.BINDINGS)))

    def action_pick_preset(self) -> None:
        if self._allowed("pick_preset"):
            self._pick_preset()

    def action_edit_preset(self) -> None:
        if self._allowed("edit_preset"):
            self._edit_preset()

    # ------------------------------------------------------------------ workers
    def send(self, name: str, **args: Any) -> None:
        """Send a command in a worker; the answer comes back as :class:`CommandDone`."""
        self.run_worker(self._send(name, args), group="commands", exit_on_error=False)

    async def _send(self, name: str, args: dict[str, Any]) -> None:
        self.post_message(CommandDone(name, args, await self.command(name, **args)))

    @work(group="dialogs", exclusive=True, exit_on_error=False)
    async def _confirm_then(self, name: str, question: str, body: str) -> None:
        if await self.app.push_screen_wait(ConfirmScreen(question, body, yes=name.title())):
            await self._send(name, {})

    @work(group="dialogs", exclusive=True, exit_on_error=False)
    async def _pick_run(self) -> None:
        row = await self.app.push_screen_wait(RunPicker(self.runs.rows, self.current_key))
        if row is not None and self.switch_run is not None:
            self.switch_run(row)

    @work(group="dialogs", exclusive=True, exit_on_error=False)
    async def _confirm_cancel(self, job: str, question: str, body: str) -> None:
        if await self.app.push_screen_wait(ConfirmScreen(question, body, yes="Stop")):
            self._busy.add("scancel")
            self._cancel_queued(self.current_key[1])

    @work(thread=True, group="scancel", exit_on_error=False)
    def _cancel_queued(self, run_dir: str) -> None:
        """A Textual thread worker, not a daemon thread: quitting waits for the scancel and
        the STOPPED it journals (up to 30 s)."""
        try:
            job, error = self.runs.stop_queued(run_dir), None
        except Exception as e:  # noqa: BLE001 - UsageError, SlurmError: one line, shown
            job, error = None, e
        self.app.call_from_thread(self._cancelled, job, error)

    def _cancelled(self, job: str | None, error: BaseException | None) -> None:
        self._busy.discard("scancel")
        if error is not None:
            self.notify(escape(sanitize(str(error))), title="stop failed", severity="error",
                        timeout=8)
        else:
            self.notify(f"Slurm job {job} cancelled: the run is STOPPED", title="Stopped")

    @work(group="dialogs", exclusive=True, exit_on_error=False)
    async def _pick_preset(self) -> None:
        reply = await self.command("list_presets")
        if not reply.get("ok"):
            self.post_message(CommandDone("list_presets", {}, reply))
            return
        choice = await self.app.push_screen_wait(PresetPicker(reply["result"], self.model.preset))
        if choice:
            await self._send("switch_preset", {"preset": choice})

    @work(group="dialogs", exclusive=True, exit_on_error=False)
    async def _edit_preset(self) -> None:
        name = self.model.preset
        if not name:
            listed = await self.command("list_presets")
            if not listed.get("ok"):
                self.post_message(CommandDone("list_presets", {}, listed))
                return
            name = await self.app.push_screen_wait(
                PresetPicker(listed["result"], None, title="Edit which preset?"))
            if not name:
                return
        reply = await self.command("read_preset", name=name)
        if not reply.get("ok"):
            self.post_message(CommandDone("read_preset", {"name": name}, reply))
            return
        await self.app.push_screen_wait(PresetEditorScreen(reply["result"], self.command))
