"""Checkpoints a script writes itself: which written file is one (core/checkpoint_names.py),
a folder checked as a whole (store/checkpoint_accept.py), the copy a restart keeps
(store/checkpoint_copy.py: never a hard link), the resume arguments only with a good
checkpoint (agent/launch.py), the inotify watch (system/inotify.py) and the words."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from trainctl.agent.launch import CommandRunner
from trainctl.config import ConfigError, load_job
from trainctl.core import events as E
from trainctl.core.checkpoint_names import CheckpointNames
from trainctl.core.resumed import resumed, resumed_phrase
from trainctl.store.checkpoint_accept import accept_script_checkpoint
from trainctl.store.checkpoint_copy import keep_copy
from trainctl.store.paths import RunFiles
from trainctl.store.spec import RunSpec
from trainctl.system.inotify import TreeWatch


@pytest.mark.parametrize(
    "rel, owner",
    [
        ("out/ckpt.pt", "out/ckpt.pt"),
        ("model.pth.tar", "model.pth.tar"),
        ("runs/a/last.ckpt", "runs/a/last.ckpt"),
        ("w/model.safetensors", "w/model.safetensors"),
        ("output/checkpoint-500/optimizer.pt", "output/checkpoint-500"),
        ("output/checkpoint-500/trainer_state.json", "output/checkpoint-500"),
        ("ckpt_12/sub/x.bin", "ckpt_12"),
        ("out/ckpt.pt.tmp", None),
        ("out/.ckpt.pt", None),
        ("train.log", None),
        ("checkpoint-final/model.json", None),
        ("data/images.npy", None),
    ],
)
def test_default_names(rel, owner):
    assert CheckpointNames().owner(rel) == owner


@pytest.mark.parametrize(
    "rel, owner",
    [
        ("out/a.pt", "out/a.pt"),
        ("out/sub/a.pt", None),  # * stays within a folder
        ("other/a.pt", None),
        ("output/checkpoint-3/model.pt", "output/checkpoint-3"),
        ("deep/x/y/state.bin", "deep/x/y/state.bin"),
        ("model.safetensors", None),  # globs given: the default names no longer count
    ],
)
def test_job_globs(rel, owner):
    names = CheckpointNames(["out/*.pt", "output/checkpoint-*", "deep/**/*.bin"])
    assert names.owner(rel) == owner


def test_the_job_key_and_its_refusals(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('kind = "command"\ncommand = ["python", "t.py"]\ncheckpoints = ["out/*.pt"]\n')
    assert load_job(job).checkpoints == ("out/*.pt",)
    for bad in ('"out/*.pt"', '["/abs/*.pt"]', '["../x/*.pt"]', '[""]'):
        job.write_text(f'kind = "command"\ncommand = ["python", "t.py"]\ncheckpoints = {bad}\n')
        with pytest.raises(ConfigError, match="checkpoints"):
            load_job(job)


def test_a_folder_is_whole_only_when_every_checkpoint_file_in_it_is(tmp_path):
    d = tmp_path / "checkpoint-4"
    d.mkdir()
    torch.save({"w": torch.ones(3)}, d / "model.pt")
    torch.save({"o": 1}, d / "optim.pt")
    v = accept_script_checkpoint(d)
    assert v.ok and "2 checkpoint files complete" in v.detail, v
    data = (d / "optim.pt").read_bytes()
    (d / "optim.pt").write_bytes(data[: len(data) // 2])  # torn mid-save
    v = accept_script_checkpoint(d)
    assert v.status == "bad" and v.detail.startswith("optim.pt:"), v


def test_the_kept_copy_does_not_change_when_the_script_rewrites_its_file(tmp_path):
    src = tmp_path / "ckpt.pt"
    torch.save({"step": 5}, src)
    how = keep_copy(src, tmp_path / "kept" / "ckpt.pt")
    assert how in ("reflink", "copy")
    copy = tmp_path / "kept" / "ckpt.pt"
    assert (
        os.stat(copy).st_ino != os.stat(src).st_ino and os.stat(copy).st_mtime_ns == os.stat(src).st_mtime_ns
    )
    with open(src, "r+b") as f:  # torch.save's way: the same inode, truncated and rewritten
        f.truncate(0)
    torch.save({"step": 10}, src)
    assert torch.load(copy)["step"] == 5 and torch.load(src)["step"] == 10
    folder = tmp_path / "checkpoint-2"
    (folder / "sub").mkdir(parents=True)
    torch.save({"a": 1}, folder / "sub" / "m.pt")
    keep_copy(folder, tmp_path / "kept" / "checkpoint-2")
    assert torch.load(tmp_path / "kept" / "checkpoint-2" / "sub" / "m.pt") == {"a": 1}
    assert [p.name for p in (tmp_path / "kept").iterdir() if p.name.startswith(".")] == []
    with pytest.raises(FileExistsError):
        keep_copy(src, copy)


def test_resume_arguments_only_with_a_good_checkpoint(tmp_path):
    files = RunFiles(tmp_path / "run")
    runner = CommandRunner()
    for resume_args in (["--resume", "{checkpoint}"], ["--resume"]):
        spec = RunSpec(job_name="j", kind="command", command=["python", "t.py"], resume_args=resume_args)
        assert runner.argv(spec, files, None, None, None, 2) == ["python", "t.py"]
        assert runner.argv(spec, files, None, None, "/c/x.pt", 2)[2:] == [
            a.replace("{checkpoint}", "/c/x.pt") for a in resume_args
        ]


def test_the_watch_sees_files_written_and_moved_in_and_new_folders(tmp_path):
    (tmp_path / ".venv" / "lib").mkdir(parents=True)
    (tmp_path / "old.pt").write_bytes(b"x")
    tree = TreeWatch(str(tmp_path), lambda parent, name: name.startswith("."))
    try:
        assert tree.add_tree(str(tmp_path)) == [str(tmp_path / "old.pt")]
        assert tree.folders == 1 and tree.read() == []
        (tmp_path / "a.pt").write_bytes(b"1")
        (tmp_path / ".venv" / "lib" / "b.pt").write_bytes(b"2")  # not watched
        (tmp_path / "t.tmp").write_bytes(b"3")
        os.rename(tmp_path / "t.tmp", tmp_path / "c.pt")
        (tmp_path / "out").mkdir()
        seen = [(Path(c.path).name, c.is_dir) for c in tree.read()]
        (tmp_path / "out" / "d.pt").write_bytes(b"4")
        seen += [(Path(c.path).name, c.is_dir) for c in tree.read()]
    finally:
        tree.close()
    assert seen == [("a.pt", False), ("t.tmp", False), ("c.pt", False), ("out", True), ("d.pt", False)]


def test_the_words_say_which_file_its_age_and_the_work_redone():
    e = E.Restart(0.0, 3, "stall", None, "/run/checkpoints/script/3/ckpt.pt", 1.0)
    e = E.Restart(0.0, 3, "stall", None, e.resume_from, 1.0, "/w/out/ckpt.pt", e.resume_from, 125.0, 40)
    assert resumed_phrase(resumed(e)) == (
        "resumed from the copy /run/checkpoints/script/3/ckpt.pt of /w/out/ckpt.pt "
        "(written 2 m 5 s before, 40 batches redone)"
    )
    own = E.Restart(0.0, 3, "stall", None, "/w/out/ckpt.pt", 1.0, "/w/out/ckpt.pt", "/r/c.pt", 5.0, None)
    assert resumed_phrase(resumed(own)) == (
        "resumed from /w/out/ckpt.pt (the script's own file; a copy is kept as /r/c.pt) (written 5 s before)"
    )
    assert resumed_phrase(resumed(E.Restart(0.0, 2, "stall", None))) == "started over: no good checkpoint yet"
