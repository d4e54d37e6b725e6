"""What the Transformers and Lightning integrations share besides save requests: the
version check, the session (preset, resume checkpoint) and a progress throttle."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from trainctl.core import events as E
from trainctl.inside import Refused, report
from trainctl.inside.session import ConfigError, TrainerSession


def version_tuple(version: str) -> tuple[int, ...]:
    """``"5.24.0.dev0"`` -> (5, 24, 0): the leading numbers."""
    out: list[int] = []
    for part in version.split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
        if len(digits) != len(part):
            break
    return tuple(out)


def in_range(version: str, low: tuple[int, ...], high: tuple[int, ...]) -> bool:
    """``low <= version < high``."""
    v = version_tuple(version)
    return bool(v) and low <= v < high


def guarded(cls: type) -> type:
    """Every ``on_*`` hook of a callback class: an error of trainctl's is said once
    (info ``instrument.failed``) and swallowed, never raised into the user's training."""
    for name, fn in list(vars(cls).items()):
        if name.startswith("on_") and callable(fn):
            setattr(cls, name, _guard(fn))
    return cls


def _guard(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def hook(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the training goes on
            if not getattr(self, "_trainctl_failed", False):
                self._trainctl_failed = True
                report.report_info(
                    f"trainctl's callback failed in {fn.__name__} ({type(e).__name__}: {e}); "
                    "training goes on",
                    "instrument.failed",
                )
            return None

    return hook


def open_session(library: str) -> TrainerSession:
    """The agent's facts for this attempt; a preset that does not load refuses the integration."""
    try:
        return TrainerSession.from_env()
    except ConfigError as e:
        raise Refused(f"the preset does not load ({e})") from None


def preset_dataloader(session: TrainerSession) -> dict[str, Any]:
    """The preset's ``[dataloader]`` values this attempt runs with (only those set)."""
    if session.preset is None:
        return {}
    dl = session.preset.dataloader
    return {
        k: getattr(dl, k)
        for k in (
            "workers",
            "persistent_workers",
            "prefetch_factor",
            "multiprocessing_context",
            "sharing_strategy",
            "pin_memory",
        )
        if getattr(dl, k) is not None
    }


def warn_not_applied(session: TrainerSession, library: str, keys: list[str], where: str) -> None:
    """The preset's settings the library offers no place for."""
    if keys:
        session.sink.emit(
            E.Warning(
                time.time(),
                "trainctl.preset_not_applied",
                "warning",
                f"{library}: the preset's [dataloader] {', '.join(keys)} could not be applied ({where})",
                "Set it in the script, or leave it out of the preset.",
                source="trainctl",
            )
        )


def resume_argument(
    session: TrainerSession | None, given: Any, refuse: Callable[[str], str | None], arg: str
) -> Any:
    """What the first ``train``/``fit`` of a restart resumes from: the checkpoint the agent
    chose (this run's newest that verifies) over what the script wrote (a fixed path, or
    "latest", would go back to it, or to a save cut short), said in info ``runner.resume``;
    the script's own value when there is none, or when it is not of the library's shape
    (``refuse(path)`` says why, info ``runner.resume_failed``)."""
    path = str(session.resume_from) if session is not None and session.resume_from else None
    if not path:
        return given
    why = refuse(path)
    if why is not None:
        report.report_info(
            f"not resuming from {path}: {why}; training starts as the script says", "runner.resume_failed"
        )
        return given
    text = f"resuming from {path} ({arg})"
    if given not in (None, False) and str(given) != path:
        text += f"; the script's {arg}={given!r} is replaced"
    report.report_info(text, "runner.resume")
    return path


def apply_sharing_strategy(settings: dict[str, Any]) -> str | None:
    """``sharing_strategy`` is process-wide: set it now.  What was set, or None."""
    strategy = settings.get("sharing_strategy")
    if not strategy:
        return None
    import torch.multiprocessing

    torch.multiprocessing.set_sharing_strategy(strategy)
    return strategy


class Throttle:
    """At most one progress report per ``every_s``, except the first :data:`FRESH` steps
    after a (re)start: training begins, an epoch begins, a save or validation ends.  The
    stall detector learns its warm-up gaps from those, and a step after a save is what
    tells it the save is over (until then a hang reads as a slow save)."""

    FRESH = 3

    def __init__(self, every_s: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self.last = float("-inf")
        self.fresh = self.FRESH

    def restart(self) -> None:
        self.fresh = self.FRESH

    def due(self, force: bool = False) -> bool:
        now = self.clock()
        if force or self.fresh > 0 or now - self.last >= self.every_s:
            self.fresh = max(0, self.fresh - 1)
            self.last = now
            return True
        return False
