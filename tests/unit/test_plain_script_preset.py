"""A preset on a plain script's DataLoaders (src/trainctl/inside/plain_torch.py
``loader_overrides``, pure) and the keys a preset cannot act with on a job
(src/trainctl/config/preset.py ``keys_without_effect``)."""

from __future__ import annotations

from trainctl.config.preset import DataLoaderCfg, Preset, keys_without_effect
from trainctl.inside.plain_torch import loader_overrides

SCRIPT = {  # what DataLoader's signature gives a call with num_workers=2, prefetch_factor=4
    "num_workers": 2,
    "multiprocessing_context": "fork",
    "prefetch_factor": 4,
    "pin_memory": False,
    "persistent_workers": True,
}


def test_workers_0_drops_every_worker_only_argument_and_says_only_what_the_preset_set():
    given = dict(SCRIPT)
    changed = loader_overrides(given, DataLoaderCfg(workers=0))
    assert changed == {"num_workers": (2, 0)}
    assert given == {
        "num_workers": 0,
        "multiprocessing_context": None,
        "prefetch_factor": None,
        "pin_memory": False,
        "persistent_workers": False,
    }


def test_workers_0_gives_worker_only_arguments_this_torchs_own_defaults():
    """torch 1.13's DataLoader: prefetch_factor defaults to 2 and refuses any other value
    without workers (2.x: None); the signature's defaults are what goes back."""
    given = dict(SCRIPT)
    old = {"multiprocessing_context": None, "prefetch_factor": 2, "persistent_workers": False}
    assert loader_overrides(given, DataLoaderCfg(workers=0), old) == {"num_workers": (2, 0)}
    assert (given["prefetch_factor"], given["multiprocessing_context"], given["persistent_workers"]) == (
        2,
        None,
        False,
    )


def test_the_preset_wins_over_the_scripts_own_values():
    given = dict(SCRIPT)
    cfg = DataLoaderCfg(workers=2, multiprocessing_context="spawn", prefetch_factor=2, pin_memory=True)
    changed = loader_overrides(given, cfg)
    assert changed == {
        "multiprocessing_context": ("fork", "spawn"),
        "prefetch_factor": (4, 2),
        "pin_memory": (False, True),
    }
    assert given["persistent_workers"] is True  # not in the preset: the script's stays


def test_worker_options_wait_for_workers():
    given = {**SCRIPT, "num_workers": 0, "prefetch_factor": None, "multiprocessing_context": None}
    given["persistent_workers"] = False
    assert loader_overrides(given, DataLoaderCfg(prefetch_factor=8)) == {}
    assert given["prefetch_factor"] is None


def test_nothing_set_changes_nothing():
    given = dict(SCRIPT)
    assert loader_overrides(given, DataLoaderCfg()) == {} and given == SCRIPT


def preset(**train) -> Preset:
    return Preset("X", train=train)


def test_train_keys_that_cannot_act_are_named_with_the_reason():
    assert keys_without_effect(preset(compile=False, val=False), "ultralytics", False) == []
    assert keys_without_effect(preset(compile=False), "command", True) == []
    assert keys_without_effect(preset(val=False), "command", True) == []  # Ultralytics may attach
    assert keys_without_effect(preset(val=False), "command", True, "ultralytics") == []
    [why] = keys_without_effect(preset(val=False), "command", True, "lightning")
    assert why.startswith("preset X: [train] val: trainer arguments reach only Ultralytics"), why
    [why] = keys_without_effect(preset(compile=False), "command", False)
    assert "[train] compile: turns torch.compile off only in a Python script" in why, why
    assert len(keys_without_effect(preset(compile=False, amp=True), "torchrun", False)) == 2
