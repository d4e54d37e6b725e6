"""The dashboard's keys: whether each can act now and why not, what each does (a command
sent to the agent, a dialog, a screen), and the words of the toast after one.

:class:`DashboardKeys` is a part of :class:`~trainctl.tui.screens.dashboard.DashboardScreen`
(a mixin: the run model, the connection and the bindings are the screen's).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from textual import work
from textual.binding import Binding
from textual.markup import escape
from textual.widgets import Input

from trainctl.core.projection_text import checkpoint_phrase
from trainctl.core.recovery import FINAL_STATES
from trainctl.core.sanitize import sanitize
from trainctl.inside.report import SAVE_ON_REQUEST_KEY
from trainctl.tui import fmt
from trainctl.tui.messages import CommandDone
from trainctl.tui.screens.confirm import ConfirmScreen
from trainctl.tui.screens.help import HelpScreen
from trainctl.tui.screens.preset_editor import PresetEditorScreen
from trainctl.tui.screens.preset_picker import PresetPicker
from trainctl.tui.screens.run_picker import RunPicker
from trainctl.tui.screens.stacks import StacksScreen
from trainctl.tui.widgets.log_tail import LogTail
from trainctl.tui.widgets.warnings_panel import WarningsPanel

if TYPE_CHECKING:
    from textual.screen import Screen

    from trainctl.tui.model import RunModel

    _ScreenBase = Screen[None]  # the mixin's methods run on the screen
else:
    _ScreenBase = object

LIVE_STATES = ("STARTING", "RUNNING", "STALLED")
AGENT_ACTIONS = ("restart", "fallback", "pick_preset", "edit_preset", "stop", "dump_stacks", "toggle_auto")
KEY_WORDS = {
    "toggle_auto": "auto-recovery",
    "dump_stacks": "stack dump",
    "pick_preset": "preset switch",
    "edit_preset": "preset edit",
    "show_stacks": "last stack dump",
    "pick_run": "run list",
    "dismiss_warning": "dismiss",
    "find_in_log": "find",
    "find_next": "next match",
}
ENDED_HIDDEN = ("restart", "fallback", "pick_preset", "stop", "dump_stacks", "toggle_auto")


COMMAND_WORDS = {
    "restart": "restart",
    "fallback": "fallback",
    "switch_preset": "preset switch",
    "stop": "stop",
    "auto_recover": "auto-recovery",
    "dump_stacks": "stack dump",
    "write_preset": "preset save",
    "set_next_preset": "next preset",
    "list_presets": "preset list",
    "read_preset": "preset read",
}


def outcome(name: str, args: dict[str, Any], result: Any) -> str:
    """What a command the agent accepted did, in words (the toast after a key)."""
    r = result if isinstance(result, dict) else {}
    if name == "auto_recover":
        on = r.get("auto_recover", args.get("on"))
        return (
            "auto-recovery on: stalls and crashes restart the trainer"
            if on
            else "auto-recovery off: a stall is diagnosed and left for you"
        )
    if name == "dump_stacks":
        if not r.get("stacks"):
            return f"no stacks written: {r.get('detail') or 'py-spy gave none'}"
        return f"stacks written to {r['stacks']} ({r.get('diagnosis', '?')}); k opens them"
    if name in ("restart", "fallback", "switch_preset"):
        preset = r.get("preset") or args.get("preset")
        with_ = f" with preset {preset}" if preset else ""
        return (
            f"restarting the trainer{with_}"
            if r.get("restart") == "now"
            else f"the next attempt starts{with_}"
        )
    if name == "stop":
        return "stopping: the trainer is killed and not restarted"
    if name == "write_preset":
        return f"preset {r.get('name', '?')} saved to {r.get('path', '?')}"
    if name == "set_next_preset":
        return f"the next restart uses preset {r.get('next_preset', '?')}"
    return f"{COMMAND_WORDS.get(name, name)}: done"


STACKS_SAID = re.compile(r"stacks dumped to (.+?) \(")  # the agent's note after `d`


def continue_command(run_dir: str) -> str:
    """How to go on from a run that ended: a new run from its last good checkpoint."""
    return f"trainctl run JOB --resume-from {fmt.home_path(run_dir) or 'RUN_DIR'}"


KEYS: list[Binding] = [  # the dashboard's bindings: footer, palette, help and on_key
    Binding(
        "question_mark",
        "help",
        "Help",
        key_display="?",
        id="help",
        tooltip="Keys and what the run states mean",
    ),
    Binding("q", "app.leave", "Quit", id="quit", tooltip="Leave the dashboard; the run goes on"),
    Binding(
        "r",
        "restart",
        "Restart",
        id="restart",
        tooltip="Restart the trainer: saved first where it can, else from the last good "
        "checkpoint, else from the start (the confirmation says which)",
    ),
    Binding(
        "f",
        "fallback",
        "Fallback",
        id="fallback",
        tooltip="Restart with the job's fallback preset (the safe one), the same way as r",
    ),
    Binding("p", "pick_preset", "Preset…", id="pick_preset", tooltip="Pick a preset and restart with it"),
    Binding(
        "e",
        "edit_preset",
        "Edit",
        id="edit_preset",
        tooltip="Edit the running preset; save for now or the next restart",
    ),
    Binding("s", "stop", "Stop", id="stop", tooltip="Stop the run: kill the trainer, no restart"),
    Binding(
        "d",
        "dump_stacks",
        "Stacks",
        id="dump_stacks",
        tooltip="py-spy dump of the trainer and its workers into the run directory",
    ),
    Binding(
        "a",
        "toggle_auto",
        "Auto",
        id="auto_recover",
        tooltip="Turn automatic restarts after stalls and crashes on or off",
    ),
    Binding(
        "z",
        "cycle_range",
        "Range",
        id="chart_range",
        tooltip="The loss chart's range: the whole run, the last hour, the last epoch",
    ),
    Binding("l", "toggle_log", "Log", id="toggle_log", tooltip="Show or hide the trainer's raw output"),
    Binding("t", "show_goodput", "Goodput", id="show_goodput", tooltip="Where the run's time went, by cause"),
    Binding(
        "g",
        "pick_run",
        "Runs…",
        id="pick_run",
        tooltip="Every run of yours (here, on the ssh hosts, on Slurm): follow another",
    ),
    Binding(
        "k",
        "show_stacks",
        "Last stacks",
        id="show_stacks",
        tooltip="Open the last stack dump (a stall's, or the one d wrote)",
    ),
    Binding(
        "x",
        "dismiss_warning",
        "Dismiss",
        id="dismiss_warning",
        tooltip="Dismiss the highlighted warning until it happens again",
    ),
    Binding(
        "slash",
        "find_in_log",
        "Find",
        key_display="/",
        id="find_in_log",
        tooltip="In the log view: find text in the trainer's output",
    ),
    Binding(
        "n",
        "find_next",
        "Next",
        id="find_next",
        show=False,
        tooltip="In the log view: the next match further back",
    ),
]


class DashboardKeys(_ScreenBase):
    """The keys' half of the dashboard screen (see the module doc)."""

    # the screen's (DashboardScreen sets them), declared for the type checker
    run_state: str
    connected: bool
    show_log: bool
    model: RunModel
    runs: Any
    queued: dict[str, Any] | None
    switch_run: Callable[[dict], object] | None
    command: Callable[..., Awaitable[dict[str, Any]]]
    clock: Callable[[], float]
    _busy: set[str]
    _connection: str
    _dumped: tuple[float, str] | None

    if TYPE_CHECKING:

        @property
        def current_key(self) -> tuple[str, str] | None: ...

        def _close_search(self) -> None: ...

    # ------------------------------------------------------------------ keys
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """True: the key acts; False: hidden (it cannot act on a run that ended); None:
        shown greyed (not now).  A key pressed that cannot act says why (``on_key``)."""
        if self.why_not(action) is None:
            return True
        if action in ("pick_run", "show_stacks", "dismiss_warning", "find_in_log", "find_next"):
            return False  # nothing to act on: not worth a place in the footer
        return False if self.run_state in FINAL_STATES and action in ENDED_HIDDEN else None

    def why_not(self, action: str) -> str | None:
        """Why a key cannot act now, in words; None when it can."""
        state = self.run_state
        ended = (
            f"the run is {state}. To go on from its last checkpoint: {continue_command(self.model.run_dir)}"
        )
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
            return None if state not in FINAL_STATES else ended  # scancel the queued job
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
        self.notify(
            escape(f"{KEY_WORDS.get(action, action.replace('_', ' '))} cannot act: {why}"),
            severity="warning",
            timeout=8,
        )
        return False

    def on_key(self, event) -> None:
        """A key of a binding that cannot act now (hidden or greyed) says why, not nothing."""
        search = self.query_one("#log-search", Input)
        if self.focused is search:
            if event.key == "escape":
                event.stop()
                self._close_search()
            return
        for binding in KEYS:
            if event.key in binding.key.split(",") and self.why_not(binding.action) is not None:
                event.stop()
                self._allowed(binding.action)
                return

    def action_restart(self) -> None:
        if self._allowed("restart"):
            self._confirm_then(
                "restart", "Restart the trainer now?", self.restart_words(self.model.preset or "?")
            )

    def action_fallback(self) -> None:
        if self._allowed("fallback"):
            fb = self.model.fallback
            assert fb is not None  # _allowed: the run has a fallback preset
            self._confirm_then("fallback", f"Fall back to preset {fb}?", self.restart_words(fb))

    def restart_words(self, preset: str) -> str:
        """What a restart does to this run, as it stands: a trainer that saves on request
        saves first; else it resumes from the last good checkpoint, or with none yet,
        starts over."""
        m = self.model
        ckpt = m.projection.checkpoint if m.projection is not None else None
        saves = SAVE_ON_REQUEST_KEY in m.warnings
        if saves:
            after = (
                f" If that save fails, it resumes from the last good checkpoint "
                f"({checkpoint_phrase(ckpt, self.clock())})."
                if ckpt
                else " If that save fails, there is no checkpoint yet: it starts over."
            )
            return f"The trainer saves now, is killed and resumed from that save with preset {preset}.{after}"
        if ckpt:
            return (
                f"The trainer is killed and resumed with preset {preset} from the last good "
                f"checkpoint: {checkpoint_phrase(ckpt, self.clock())}."
            )
        return (
            f"There is no checkpoint yet: the trainer is killed and starts over from the "
            f"beginning with preset {preset}."
        )

    def action_stop(self) -> None:
        if self.queued is not None and not self.connected and self._allowed("stop"):
            job = self.queued.get("job")
            if "scancel" in self._busy:
                self.notify(f"Slurm job {job} is being cancelled", severity="warning")
                return
            self._confirm_cancel(
                job,
                "Stop the run?",
                f"Its Slurm job {job} waits in the queue: it is cancelled "
                "(scancel) and the run ends STOPPED. The journal stays.",
            )
        elif self._allowed("stop"):
            self._confirm_then(
                "stop", "Stop the run?", "The trainer is killed and not restarted. The journal stays."
            )

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
        assert path is not None  # _allowed: there is a dump
        where = self.current_key[0] if self.current_key else "local"
        if where != "local":
            self.notify(escape(f"the last stack dump is on {where}: {path}"), timeout=10)
            return
        self.app.push_screen(StacksScreen(path))

    def action_dismiss_warning(self) -> None:
        if self._allowed("dismiss_warning"):
            row = self.query_one(WarningsPanel).dismiss_selected()
            if row is not None:
                self.notify(
                    escape(f"dismissed until it happens again: {row.text.splitlines()[0]}"), timeout=4
                )
            self.refresh_bindings()

    def action_pick_run(self) -> None:
        if self._allowed("pick_run"):
            self._pick_run()

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(KEYS))

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
            key = self.current_key
            assert key is not None  # a queued job is only looked for on a run with a key
            self._busy.add("scancel")
            self._cancel_queued(key[1])

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
            self.notify(escape(sanitize(str(error))), title="stop failed", severity="error", timeout=8)
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
                PresetPicker(listed["result"], None, title="Edit which preset?")
            )
            if not name:
                return
        reply = await self.command("read_preset", name=name)
        if not reply.get("ok"):
            self.post_message(CommandDone("read_preset", {"name": name}, reply))
            return
        await self.app.push_screen_wait(PresetEditorScreen(reply["result"], self.command))
