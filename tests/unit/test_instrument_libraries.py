"""The Transformers and Lightning integrations' parts that need neither library: version
ranges, the progress throttle, the preset onto TrainingArguments and onto a real torch
DataLoader, who owns SIGUSR1, and the agent's resume rules over real checkpoint files."""

from __future__ import annotations

import json
import signal
import types
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainctl.agent.launch import INTEGRATION_RESUME
from trainctl.core import events as E
from trainctl.inside import Refused
from trainctl.inside import lightning as L
from trainctl.inside import transformers as T
from trainctl.inside.callback_support import Throttle, in_range, version_tuple
from trainctl.inside.save_requests import SaveRequests
from trainctl.inside.session import TrainerSession
from trainctl.store.paths import RunFiles
from trainctl.store.spec import RunSpec


def test_versions():
    assert version_tuple("5.24.0") == (5, 24, 0)
    assert version_tuple("2.6.0.post0") == (2, 6, 0)
    assert version_tuple("5.0.0rc1") == (5, 0, 0)
    assert version_tuple("dev") == ()
    assert in_range("5.0.0", (5, 0), (6,)) and not in_range("4.57.6", (5, 0), (6,))
    assert not in_range("6.0.0", (5, 0), (6,)) and not in_range("weird", (5, 0), (6,))


@pytest.mark.parametrize("integration, version", [(T, "4.57.6"), (T, "6.0.0"), (L, "1.9.5"), (L, "3.0.0")])
def test_a_version_outside_the_tested_range_is_refused_and_nothing_is_patched(integration, version):
    def init(self):
        pass

    trainer = type("Trainer", (), {"__init__": init, "fit": None, "save_checkpoint": None, "train": None})
    module = types.SimpleNamespace(__version__=version, __name__="lib", Trainer=trainer, Callback=object)
    with pytest.raises(Refused, match="outside the tested range"):
        integration.attach(module)
    assert trainer.__init__ is init


def test_throttle_lets_the_first_steps_through_then_one_per_interval():
    now = [0.0]
    t = Throttle(0.5, clock=lambda: now[0])
    assert [t.due() for _ in range(4)] == [True, True, True, False]  # the first steps go out
    now[0] = 0.6
    assert t.due() and not t.due()
    t.restart()  # after a save
    assert t.due() and t.due() and t.due() and not t.due()
    assert t.due(force=True)


def session(tmp_path: Path, preset: str | None) -> tuple[TrainerSession, Path]:
    side = tmp_path / "side.jsonl"
    side.touch()
    env = {"TRAINCTL_EVENTS_PATH": str(side), "TRAINCTL_RUN_DIR": str(tmp_path)}
    if preset is not None:
        (tmp_path / "P.toml").write_text(preset)
        env["TRAINCTL_PRESET_FILE"] = str(tmp_path / "P.toml")
    return TrainerSession.from_env(env), side


def said(side: Path) -> list[E.Event]:
    return [E.decode(line) for line in side.read_bytes().splitlines()]


def test_the_preset_goes_onto_trainingarguments_and_says_what_it_overrode(tmp_path):
    s, side = session(tmp_path, "[dataloader]\nworkers = 0\n")
    args = types.SimpleNamespace(
        dataloader_num_workers=4, dataloader_persistent_workers=True, dataloader_prefetch_factor=2
    )
    changed = T.apply_preset(args, {"workers": 0}, s)
    assert (
        args.dataloader_num_workers,
        args.dataloader_persistent_workers,
        args.dataloader_prefetch_factor,
    ) == (0, False, None)  # what PyTorch accepts without workers
    assert changed["dataloader_num_workers"] == (4, 0)
    T.apply_preset(args, {"workers": 2, "multiprocessing_context": "spawn"}, s)
    events = said(side)
    over = [e for e in events if e.id == "trainctl.preset_overrides"][0]
    assert "dataloader_num_workers 4 -> 0" in over.text
    [lost] = [e for e in events if e.id == "trainctl.preset_not_applied"]
    assert "multiprocessing_context" in lost.text  # the Trainer has no such argument


def test_nothing_is_said_when_the_script_already_has_the_presets_values(tmp_path):
    s, side = session(tmp_path, "[dataloader]\nworkers = 2\n")
    args = types.SimpleNamespace(
        dataloader_num_workers=2, dataloader_persistent_workers=False, dataloader_prefetch_factor=None
    )
    assert T.apply_preset(args, {"workers": 2}, s) == {}
    assert said(side) == []


def _loader(**kw) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2, **kw)


def test_a_dataloader_made_with_workers_runs_in_process_under_workers_0():
    dl = _loader(num_workers=2, persistent_workers=True, prefetch_factor=4)
    changed = L.set_loader(dl, {"workers": 0})
    assert changed == {"num_workers": (2, 0)}
    assert (dl.num_workers, dl.persistent_workers, dl.prefetch_factor) == (0, False, None)
    assert type(iter(dl)).__name__ == "_SingleProcessDataLoaderIter"
    assert sum(len(b[0]) for b in dl) == 8


def test_a_dataloader_gets_the_presets_workers_and_context():
    dl = _loader()
    changed = L.set_loader(
        dl,
        {"workers": 1, "prefetch_factor": 3, "multiprocessing_context": "fork", "persistent_workers": False},
    )
    assert changed == {
        "num_workers": (0, 1),
        "prefetch_factor": (None, 3),
        "multiprocessing_context": (None, "fork"),
    }
    assert sum(len(b[0]) for b in dl) == 8  # one forked worker loaded them
    assert dl.multiprocessing_context.get_start_method() == "fork"


def test_save_requests_never_take_a_sigusr1_handler_that_is_someone_elses(tmp_path, monkeypatch):
    side = tmp_path / "side.jsonl"
    side.touch()
    reports_to(monkeypatch, side)
    before = signal.getsignal(signal.SIGUSR1)
    try:
        theirs = lambda signum, frame: None  # noqa: E731 - a SLURM requeue handler, say
        signal.signal(signal.SIGUSR1, theirs)
        requests = SaveRequests()
        assert not requests.claim() and not requests.declare()
        assert signal.getsignal(signal.SIGUSR1) is theirs
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        assert requests.claim() and requests.declare() and requests.declare()
        keys = [e.key for e in said(side)]
        assert keys == ["instrument.no_save_on_request", "runner.save_on_request"], keys  # each once
    finally:
        signal.signal(signal.SIGUSR1, before)


def reports_to(monkeypatch, side: Path) -> None:
    """src/trainctl/inside/report.py's channel (opened once a process) to ``side`` for this test."""
    monkeypatch.setenv("TRAINCTL_EVENTS_PATH", str(side))
    monkeypatch.setattr("trainctl.inside.report._opened", False)
    monkeypatch.setattr("trainctl.inside.report._fd", None)


def test_a_restart_resumes_from_the_agents_checkpoint_over_the_scripts_own(tmp_path, monkeypatch):
    from trainctl.inside.callback_support import resume_argument

    s, side = session(tmp_path, None)
    reports_to(monkeypatch, side)
    good = trainer_dir(tmp_path / "out", 8)
    refuse = T._not_a_trainer_dir
    assert (
        resume_argument(s, "out/checkpoint-2", refuse, "resume_from_checkpoint") == "out/checkpoint-2"
    )  # no restart
    s.resume_from = good
    assert resume_argument(s, None, refuse, "resume_from_checkpoint") == str(good)
    assert resume_argument(s, True, refuse, "resume_from_checkpoint") == str(good)
    s.resume_from = tmp_path / "model.ckpt"  # not of this library's shape: the script's own
    assert resume_argument(s, None, refuse, "resume_from_checkpoint") is None
    texts = [(e.key, e.text) for e in said(side)]
    assert texts[0] == ("runner.resume", f"resuming from {good} (resume_from_checkpoint)")
    assert texts[1][1].endswith("the script's resume_from_checkpoint=True is replaced"), texts
    assert texts[2][0] == "runner.resume_failed" and "no trainer_state.json" in texts[2][1], texts


# ---------------------------------------------------------------------- the agent's rules
def journal(files: RunFiles, paths: list[str]) -> None:
    files.dir.mkdir(parents=True, exist_ok=True)
    with open(files.events, "w") as f:
        for p in paths:
            f.write(E.encode(E.Checkpoint(0.0, p, 1, True, "", 4, "periodic")) + "\n")


def trainer_dir(root: Path, step: int, whole: bool = True) -> Path:
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (d / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    torch.save({"state": {}}, d / "optimizer.pt")
    if whole:
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


def rule_pick(name: str, tmp_path: Path, reported: list[str]) -> tuple[str | None, list[str]]:
    files = RunFiles(tmp_path / "run")
    journal(files, reported)
    skipped: list[str] = []
    spec = RunSpec(job_name="t", kind="command", command=["python", "train.py"], cwd=str(tmp_path))
    chosen = INTEGRATION_RESUME[name](spec, files, None, lambda p, why: skipped.append(f"{p.name}: {why}"))
    return chosen, skipped


def test_transformers_rule_skips_a_checkpoint_the_trainer_did_not_finish(tmp_path):
    good = trainer_dir(tmp_path / "out", 4)
    cut = trainer_dir(tmp_path / "out", 8, whole=False)  # killed before trainer_state.json
    stray = tmp_path / "model.pt"
    torch.save({}, stray)
    chosen, skipped = rule_pick("transformers", tmp_path, [str(good), str(cut), str(stray)])
    assert chosen == str(good)
    assert any(s.startswith("model.pt: not a Transformers Trainer checkpoint") for s in skipped), skipped
    assert any(s.startswith("checkpoint-8:") and "cut short" in s for s in skipped), skipped


def test_lightning_rule_skips_a_truncated_ckpt(tmp_path):
    older, newer = tmp_path / "a.ckpt", tmp_path / "b.ckpt"
    torch.save({"state_dict": {"w": torch.ones(64)}}, older)
    torch.save({"state_dict": {"w": torch.ones(64)}}, newer)
    newer.write_bytes(newer.read_bytes()[:200])  # killed mid-write
    chosen, skipped = rule_pick("lightning", tmp_path, [str(older), str(newer)])
    assert chosen == str(older)
    assert [s.split(":")[0] for s in skipped] == ["b.ckpt"], skipped


def test_a_callback_error_of_trainctls_is_said_once_and_never_reaches_the_training(tmp_path, monkeypatch):
    from trainctl.inside.callback_support import guarded

    side = tmp_path / "side.jsonl"
    side.touch()
    reports_to(monkeypatch, side)

    @guarded
    class Broken:
        def on_step_end(self, *args):
            raise ZeroDivisionError("oops")

        def helper(self):
            raise ZeroDivisionError("not a hook")

    cb = Broken()
    assert cb.on_step_end(1) is None and cb.on_step_end(2) is None
    [info] = said(side)
    assert info.key == "instrument.failed" and "on_step_end (ZeroDivisionError: oops)" in info.text
    with pytest.raises(ZeroDivisionError):
        cb.helper()
