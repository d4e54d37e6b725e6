"""The trainctl Textual app: one dashboard over one agent, reached through the bridge.

With ``runs`` (the CLI's ``RunsSource``) the dashboard's run picker switches to another
run: a new bridge (the next generation) to that run's agent; the old one's exclusive
worker is cancelled, which closes its connection.

The app never owns the training process.  Quitting leaves the run going and prints how
to come back (``trainctl attach RUN_DIR``, or ``ssh://HOST/RUN_DIR`` when remote).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from trainctl.core.recovery import FINAL_STATES, exit_code
from trainctl.tui.bridge import Bridge, ClientLike
from trainctl.tui.screens.dashboard import DashboardScreen
from trainctl.tui.screens.dashboard_keys import KEYS


class TrainctlApp(App[int]):
    """``client_factory`` makes a fresh, unconnected ``AgentClient`` for each connection."""

    CSS_PATH = "trainctl.tcss"
    TITLE = "trainctl"
    ENABLE_COMMAND_PALETTE = True

    def __init__(
        self,
        client_factory: Callable[[], ClientLike],
        *,
        title_hint: str = "",
        attach_hint: str = "",
        clock: Callable[[], float] = time.time,
        bell: bool | None = None,
        runs: Any = None,
        run_key: tuple[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.attach_hint = attach_hint
        self.exit_message = ""
        self.runs = runs
        self._left: list[Bridge] = []  # bridges switched away from: closed on exit
        self.dashboard = DashboardScreen(clock=clock, title_hint=title_hint, runs=runs, run_key=run_key)
        self.dashboard.switch_run = self.switch_run
        self.dashboard.bell = _bell_wanted() if bell is None else bell
        self.bridge = Bridge(client_factory, self.dashboard)
        self.dashboard.command = self.bridge.command
        self.dashboard.bridge_restart = partial(self.bridge.start, self.dashboard)
        if title_hint:
            self.sub_title = title_hint

    def get_default_screen(self) -> Screen[Any]:
        return self.dashboard

    def on_mount(self) -> None:
        self.bridge.start(self.dashboard)

    async def on_unmount(self) -> None:
        for bridge in [*self._left, self.bridge]:
            await bridge.aclose()

    def switch_run(self, row: dict) -> None:
        """Follow the run of ``row`` (a `trainctl ls` row) from now on."""
        try:
            factory = self.runs.client_factory(row)
            hint = self.runs.attach_hint(row)
        except Exception as e:  # noqa: BLE001 - a bad ssh destination...: said, nothing switched
            self.dashboard.notify(f"cannot follow that run: {e}", severity="error")
            return
        old = self.bridge
        self._left = [b for b in self._left if b._closing] + [old]
        self.bridge = Bridge(factory, self.dashboard, gen=old.gen + 1)
        self.dashboard.reset_run(
            self.bridge.gen,
            str(row.get("job") or ""),
            (str(row.get("where") or "local"), str(row["run_dir"])),
        )
        self.dashboard.command = self.bridge.command
        self.dashboard.bridge_restart = partial(self.bridge.start, self.dashboard)
        self.attach_hint = hint
        self.sub_title = str(row.get("job") or "")
        self.bridge.start(self.dashboard)  # exclusive: the old bridge's worker is cancelled

    # ------------------------------------------------------------------ palette and quit
    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """Textual's, then every key of the screen (the dashboard's KEYS, the preset editor's
        bindings): in a browser (`trainctl serve`) the browser keeps ctrl+t and ctrl+n for
        itself, and the palette (ctrl+p) still reaches what they do."""
        yield from super().get_system_commands(screen)
        bindings = KEYS if screen is self.dashboard else getattr(screen, "BINDINGS", [])
        for binding in bindings:
            if (
                not isinstance(binding, Binding)
                or not binding.description
                or binding.action.startswith("app.")
            ):
                continue
            yield SystemCommand(
                f"{binding.description} ({binding.key_display or binding.key})",
                binding.tooltip,
                partial(screen.run_action, binding.action),
            )
        if screen is self.dashboard:
            yield SystemCommand("Leave (q)", "Quit the dashboard; the run goes on", self.action_leave)

    def come_back_hint(self) -> str:
        """How to reattach: the hint the CLI gave, else the run directory from hello."""
        target = self.attach_hint or self.dashboard.model.run_dir
        if (
            target.split(" ", 1)[0].rstrip("'").endswith("trainctl")
        ):  # `trainctl ...`, `/path/bin/trainctl ...`
            return target  # the CLI gave the whole command
        return f"trainctl attach {target}" if target else "trainctl attach"

    def action_leave(self) -> None:
        """Quit the dashboard only: the agent and the run keep going."""
        state = self.dashboard.model.state
        code = exit_code(state)  # 0 while the run goes on; 130 for a run the user stopped
        if state in FINAL_STATES:
            message = f"The run is {state}. To look at it again:\n  {self.come_back_hint()}"
        else:
            message = f"The run goes on. Come back with:\n  {self.come_back_hint()}"
        self.exit_message = message
        self.exit(result=code, return_code=code, message=message)

    async def action_quit(self) -> None:
        self.action_leave()


def _bell_wanted() -> bool:
    """alerts.toml's ``bell`` (default true); a broken file does not stop the dashboard."""
    from trainctl.alerts.settings import load_user_alerts

    try:
        return load_user_alerts().bell
    except (OSError, ValueError):
        return True


def run_dashboard(
    client_factory: Callable[[], ClientLike],
    attach_hint: str = "",
    title_hint: str = "",
    runs: Any = None,
    run_key: tuple[str, str] | None = None,
) -> int:
    """Run the dashboard in this terminal; returns the process exit code.  ``runs``: the
    user's other runs (the picker, the attention count); ``run_key``: (where, run_dir) of
    this one."""
    app = TrainctlApp(
        client_factory, attach_hint=attach_hint, title_hint=title_hint, runs=runs, run_key=run_key
    )
    app.run()
    return app.return_code or 0
