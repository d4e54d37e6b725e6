"""The preset on a plain PyTorch script, no line of it changed: attached when the script
imports ``torch`` (the bootstrap's hook, src/trainctl/inside/bootstrap/).

* ``torch.utils.data.DataLoader.__init__`` is wrapped: every DataLoader the script builds
  (a subclass's too) gets the preset's ``[dataloader]`` ``workers``, ``multiprocessing_context``,
  ``prefetch_factor``, ``pin_memory`` and ``persistent_workers`` over the script's own values
  (the worker-only ones dropped with 0 workers, as PyTorch demands); one warning
  (``trainctl.preset_overrides``) says each distinct change, once.
* ``torch.compile`` is wrapped: the preset's ``[train] compile = false`` makes it give the
  function or module back as it is (said once, info ``preset.compile_off``).

Both read the attempt's preset (``TRAINCTL_PRESET_FILE``) when they are called, never at
import: a warm spare that imported torch under preset A and was released for a B attempt
builds B's DataLoaders.  When a library integration that applies the preset its own way has
attached (Ultralytics, Lightning, Transformers: ``trainctl.inside.attached``), both stand
aside: the library's own settings are the preset's there.
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any

from trainctl.inside import PRESET_FILE_ENV, attached, report

KEY = "plain_torch"
ATTACHED_AS = "instrument.preset_override"  # not instrument.attached.*: no library integration
OVERRIDES_ID = "trainctl.preset_overrides"
COMPILE_OFF_KEY = "preset.compile_off"
_LOADER_ARGS = {  # the preset's [dataloader] key -> DataLoader's argument
    "workers": "num_workers",
    "multiprocessing_context": "multiprocessing_context",
    "prefetch_factor": "prefetch_factor",
    "pin_memory": "pin_memory",
    "persistent_workers": "persistent_workers",
}
_WORKER_ONLY = {"multiprocessing_context": None, "prefetch_factor": None, "persistent_workers": False}
_said: set[str] = set()
_cache: dict[str, Any] = {"key": None, "preset": None}


def attach(torch: Any) -> str:
    from torch.utils.data import DataLoader

    if not getattr(DataLoader.__init__, "_trainctl", False):
        DataLoader.__init__ = _wrap_init(DataLoader.__init__)  # type: ignore[method-assign]
    if hasattr(torch, "compile") and not getattr(torch.compile, "_trainctl", False):
        torch.compile = _wrap_compile(torch.compile)
    return f"torch {getattr(torch, '__version__', '?')}: the preset on its DataLoaders"


def current_preset() -> Any:
    """This attempt's preset (None: none, or another integration applies it), read now."""
    if attached - {KEY}:
        return None
    path = os.environ.get(PRESET_FILE_ENV, "")
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_mtime_ns, st.st_size)
    if _cache["key"] != key:
        from trainctl.config import ConfigError, load_preset

        try:
            _cache["preset"] = load_preset(path)
        except ConfigError as e:
            _say_once(f"preset not applied to DataLoaders: it does not load ({e})", "instrument.failed")
            _cache["preset"] = None
        _cache["key"] = key
    return _cache["preset"]


def loader_overrides(
    given: dict[str, Any], dataloader: Any, defaults: dict[str, Any] | None = None
) -> dict[str, tuple[Any, Any]]:
    """What the preset's ``dataloader`` (a DataLoaderCfg) changes in a DataLoader's bound
    arguments ``given`` (its defaults filled in): argument -> (the script's, the preset's);
    ``given`` is changed in place.  Without workers, a worker-only argument goes back to
    this torch's own default (``defaults``, from its signature: torch 1.x refuses any
    prefetch_factor but its default 2, torch 2.x any but None).  Pure."""
    changed: dict[str, tuple[Any, Any]] = {}

    def put(arg: str, value: Any, say: bool) -> None:
        if given.get(arg) != value:
            if say:
                changed[arg] = (given.get(arg), value)
            given[arg] = value

    for key, arg in _LOADER_ARGS.items():
        value = getattr(dataloader, key, None)
        if value is not None and (key == "workers" or key == "pin_memory" or given.get("num_workers")):
            put(arg, value, True)
    if not given.get("num_workers"):  # PyTorch refuses these without workers
        for arg, empty in _WORKER_ONLY.items():
            put(arg, (defaults or {}).get(arg, empty), False)
    return changed


def _wrap_init(init: Any) -> Any:
    signature = inspect.signature(init)
    defaults = {n: p.default for n, p in signature.parameters.items() if p.default is not p.empty}

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        preset = current_preset()
        if preset is None:
            return init(self, *args, **kwargs)
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return init(self, *args, **kwargs)  # the call is wrong: PyTorch says how
        bound.apply_defaults()
        given = dict(bound.arguments)
        given.pop("self")
        extra = given.pop(
            next((n for n, p in signature.parameters.items() if p.kind is p.VAR_KEYWORD), ""), {}
        )
        changed = loader_overrides(given, preset.dataloader, defaults)
        if changed:
            from trainctl.inside.session import said_changes

            text = f"preset {preset.name} changes the script's DataLoader: {said_changes(changed)}"
            if text not in _said:
                _said.add(text)
                report.report_warning(
                    OVERRIDES_ID,
                    text,
                    f"Under trainctl the preset wins: `trainctl presets edit {preset.name}` changes what it sets.",
                )
        return init(self, **given, **extra)

    __init__._trainctl = True  # type: ignore[attr-defined]
    return __init__


def _wrap_compile(compile_: Any) -> Any:
    @functools.wraps(compile_)
    def compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
        preset = current_preset()
        if preset is None or preset.train.get("compile") is not False:
            return compile_(model, *args, **kwargs)
        _say_once(f"preset {preset.name}: compile = false, torch.compile is off", COMPILE_OFF_KEY)
        if model is None:  # @torch.compile(mode=...) as a decorator factory
            return lambda fn: fn
        return model

    compile._trainctl = True  # type: ignore[attr-defined]
    return compile


def _say_once(text: str, key: str) -> None:
    if text not in _said:
        _said.add(text)
        report.report_info(text, key)
