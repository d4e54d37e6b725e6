"""The checkpoint gate against real checkpoints (none refused) and hostile ones (every one
refused, naming its global, and nothing executed: a marker file is never written).

Real here: torch's own state dicts from a plain training loop, and a YOLO11n in
Ultralytics' checkpoint format (the YOLOv8n trained by the runner, with its mid-epoch
saves, is tests/e2e/test_checkpoint_gate.py).  Hostile: pickles written opcode by opcode,
and torch.save of objects whose ``__reduce__`` runs a command, as zips and legacy files;
a control test unpickles each one for real and sees its marker written.
"""

from __future__ import annotations

import argparse
import functools
import os
import pickle
import struct
import subprocess
import sys
import time
import zipfile
from copy import deepcopy
from pathlib import Path

import pytest

from trainctl.store.checkpoint import inspect_checkpoint, pick_resume_checkpoint
from trainctl.store.checkpoint_gate import (
    ALLOWED,
    GateRefusal,
    checkpoint_refusal,
    file_globals,
    load_checkpoint,
    python3_name,
    script_checkpoint_refusal,
)
from trainctl.store.checkpoint_verify import verify_path

torch = pytest.importorskip("torch")


# ------------------------------------------------------------------ real checkpoints


def plain_loop_checkpoint(path: Path, optimizer_kind: str) -> Path:
    """A plain loop's checkpoint: model, optimizer, two schedulers, GradScaler, RNG."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    momentum = {"momentum": 0.9} if optimizer_kind == "SGD" else {}  # SGD keeps state only so
    opt = getattr(torch.optim, optimizer_kind)(model.parameters(), lr=0.01, **momentum)
    step = torch.optim.lr_scheduler.StepLR(opt, 1)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10)
    for _ in range(2):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        step.step()
        opt.zero_grad()
    torch.save(
        {
            "epoch": 2,
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "scheduler": step.state_dict(),
            "cosine": cosine.state_dict(),
            "scaler": torch.amp.GradScaler("cpu").state_dict(),
            "rng": torch.get_rng_state(),
        },
        path,
    )
    return path


@pytest.mark.parametrize("optimizer_kind", ["SGD", "Adam", "AdamW"])
def test_a_plain_loops_checkpoint_passes_and_loads_weights_only(tmp_path, optimizer_kind):
    path = plain_loop_checkpoint(tmp_path / "ckpt.pt", optimizer_kind)
    assert checkpoint_refusal(path) is None
    assert script_checkpoint_refusal(path) is None
    loaded = load_checkpoint(path)
    assert loaded["epoch"] == 2 and loaded["optimizer"]["state"], loaded.keys()


def test_a_yolo11n_checkpoint_in_ultralytics_format_passes(tmp_path):
    pytest.importorskip("ultralytics")
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel("yolo11n.yaml", nc=2, verbose=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e-3)
    opt.step()
    path = tmp_path / "last.pt"
    torch.save(
        {
            "epoch": 0,
            "ema": deepcopy(model).half(),
            "optimizer": opt.state_dict(),
            "train_args": {"epochs": 2},
            "version": "8.4.190",
        },
        path,
    )
    assert checkpoint_refusal(path) is None
    check = inspect_checkpoint(path, load=True)  # weights_only=True, the model's classes allowed
    assert check.ok and "resumable (torch.load" in check.detail, check.detail
    names = {python3_name(n) for p in file_globals(path) for n in p.names}
    assert "ultralytics.nn.modules.block.C3k2" in names and names <= ALLOWED


# ------------------------------------------------------------------ hostile checkpoints


def _s(text: str) -> bytes:
    """SHORT_BINUNICODE ``text``."""
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


def _touch(marker: Path) -> str:
    return f"touch {marker}"


def hostile_pickles(marker: Path) -> dict[str, tuple[bytes, str]]:
    """name -> (pickle bytes, the global the gate must name); each writes ``marker``."""
    cmd = _touch(marker)
    arg = cmd.encode()
    short_cmd = _s(cmd)
    return {
        "GLOBAL os.system, protocol 0": (b"cos\nsystem\n(S'" + arg + b"'\ntR.", "os.system"),
        "GLOBAL posix.system, protocol 2": (
            b"\x80\x02cposix\nsystem\nq\x00X" + struct.pack("<I", len(arg)) + arg + b"\x85R.",
            "posix.system",
        ),
        "__builtin__.exec, protocol 2's name": (
            b"\x80\x02c__builtin__\nexec\nX"
            + struct.pack("<I", len(f"import os; os.system({cmd!r})"))
            + f"import os; os.system({cmd!r})".encode()
            + b"\x85R.",
            "__builtin__.exec",
        ),
        "commands.getoutput: Python 2's name of subprocess.getoutput": (
            b"\x80\x02ccommands\ngetoutput\nX" + struct.pack("<I", len(arg)) + arg + b"\x85R.",
            "commands.getoutput",
        ),
        "builtins.eval via REDUCE": (
            b"\x80\x02cbuiltins\neval\n"
            + b"X"
            + struct.pack("<I", len(f"__import__('os').system({cmd!r})"))
            + f"__import__('os').system({cmd!r})".encode()
            + b"\x85R.",
            "builtins.eval",
        ),
        "STACK_GLOBAL subprocess.Popen": (
            b"\x80\x04"
            + _s("subprocess")
            + _s("Popen")
            + b"\x93"
            + b"("
            + _s("sh")
            + _s("-c")
            + short_cmd
            + b"l"  # MARK, 3 strings, LIST
            + b"\x85R"
            + _s("wait")  # never called: the unpickling already ran it
            + b"0.",
            "subprocess.Popen",
        ),
        "INST os.system": (b"(S'" + arg + b"'\nios\nsystem\n.", "os.system"),
        "memo trick: STACK_GLOBAL of memoized strings": (
            b"\x80\x04"
            + _s("os")
            + b"\x94"
            + _s("decoy")
            + b"\x94"
            + b"0"
            + b"0"  # memo 0 = "os"
            + b"h\x00"
            + _s("system")
            + b"\x93"
            + short_cmd
            + b"\x85R.",
            "os.system",
        ),
        "damaged after the call (no STOP)": (b"cos\nsystem\n(S'" + arg + b"'\ntR\xff\xff", "os.system"),
    }


class RunsCommand:
    """An object whose unpickling runs a shell command (``os.system``: posix.system)."""

    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


def hostile_files(d: Path) -> list[tuple[Path, str, Path]]:
    """(file, the global it must be refused for, its marker), every kind of container."""
    out = []
    for i, what in enumerate(hostile_pickles(d)):
        marker = d / f"marker-{i}"
        data, name = hostile_pickles(marker)[what]
        path = d / f"raw-{i}.pkl"
        path.write_bytes(data)
        out.append((path, name, marker))
        # the same pickle as a torch zip's data.pkl (a real torch.save, its pickle swapped)
        zpath = d / f"zip-{i}.pt"
        torch.save({"epoch": 0}, zpath)
        with zipfile.ZipFile(zpath) as zf:
            members = {n: zf.read(n) for n in zf.namelist()}
        with zipfile.ZipFile(zpath, "w") as zf:
            for n, raw in members.items():
                zf.writestr(n, data if n.endswith("/data.pkl") else raw)
        out.append((zpath, name, marker))
    real = d / "nested.pt"  # a whole torch.save, the command deep inside the dict
    torch.save({"epoch": 0, "optimizer": {"state": {0: RunsCommand(_touch(d / "marker-nested"))}}}, real)
    out.append((real, "posix.system", d / "marker-nested"))
    legacy = d / "legacy.pt"  # torch's legacy (non-zip) format: the object pickle is the 4th
    torch.save(
        {"epoch": 0, "x": RunsCommand(_touch(d / "marker-legacy"))},
        legacy,
        _use_new_zipfile_serialization=False,
    )
    out.append((legacy, "posix.system", d / "marker-legacy"))
    proto0 = d / "proto0.pt"  # a plain protocol 0 pickle (torch.load reads it as legacy)
    proto0.write_bytes(pickle.dumps({"epoch": 0, "x": RunsCommand(_touch(d / "marker-p0"))}, protocol=0))
    out.append((proto0, "posix.system", d / "marker-p0"))
    extra = d / "second-pkl.pt"  # a second pickle member in the zip
    torch.save({"epoch": 0}, extra)
    with zipfile.ZipFile(extra, "a") as zf:
        zf.writestr(
            "second-pkl/extra/data.pkl", pickle.dumps(RunsCommand(_touch(d / "marker-extra")), protocol=2)
        )
    out.append((extra, "posix.system", d / "marker-extra"))
    return out


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> list[tuple[Path, str, Path]]:
    return hostile_files(tmp_path_factory.mktemp("hostile"))


def test_every_hostile_file_is_refused_naming_its_global_and_nothing_runs(hostile):
    for path, name, marker in hostile:
        for refusal in (checkpoint_refusal(path), script_checkpoint_refusal(path)):
            assert refusal is not None and f"imports {name}" in refusal, (path.name, refusal)
            assert "\n" not in refusal and "--trust-checkpoint" in refusal
        for load in (False, True):
            check = inspect_checkpoint(path, load=load)
            assert not check.ok and "resumable" not in check.detail, (path.name, check.detail)
        with pytest.raises(GateRefusal):
            load_checkpoint(path)
        verify_path(path)
        assert pick_resume_checkpoint([path]) is None
        assert not marker.exists(), f"{path.name} ran"


def test_control_each_hostile_file_does_run_when_unpickled(hostile, tmp_path):
    """Without the gate each one runs its command: the test above could fail."""
    ran = 0
    for path, _name, marker in hostile:
        if path.name.startswith("second-pkl"):
            with zipfile.ZipFile(path) as zf:
                pickle.loads(zf.read("second-pkl/extra/data.pkl"))
        elif path.suffix == ".pkl":
            try:
                with open(path, "rb") as f:
                    pickle.load(f)
            except pickle.UnpicklingError:
                pass  # the damaged one: it ran before the damage
        else:
            try:
                torch.load(path, weights_only=False)
            except Exception:  # noqa: BLE001 - a swapped data.pkl may not be a valid checkpoint after running
                pass
        deadline = time.monotonic() + 10  # subprocess.Popen runs its command in the background
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        ran += marker.exists()
        assert marker.exists(), f"{path.name} did not run when unpickled"
    assert ran == len(hostile)


def test_an_unknown_class_is_refused_for_trainctl_but_passes_in_a_scripts_checkpoint(tmp_path):
    path = tmp_path / "own.pt"
    args = argparse.Namespace(lr=0.1, out=Path("runs/x"), act=functools.partial(max, 0))
    torch.save({"epoch": 0, "args": args, "optimizer": {}}, path)
    why = checkpoint_refusal(path)
    assert why is not None and "imports argparse.Namespace" in why, why
    assert script_checkpoint_refusal(path) is None  # scripts save their arguments
    assert not inspect_checkpoint(path).ok


def test_trust_checkpoint_lets_the_users_own_file_through(tmp_path):
    path = tmp_path / "own.pt"
    torch.save(
        {"epoch": 0, "args": argparse.Namespace(lr=0.1), "optimizer": {}, "train_args": {"epochs": 3}}, path
    )
    other = tmp_path / "other.pt"
    other.write_bytes(path.read_bytes())
    link = tmp_path / "link.pt"
    link.symlink_to(path)
    assert checkpoint_refusal(path, trusted=[str(link)]) is None  # compared resolved
    assert checkpoint_refusal(other, trusted=[str(path)]) is not None  # that file only
    check = inspect_checkpoint(path, load=True, trusted=[path])
    assert check.ok, check.detail
    assert load_checkpoint(path, [path])["args"].lr == 0.1


def test_a_scripts_directory_checkpoint_is_judged_by_its_files(tmp_path):
    d = tmp_path / "checkpoint-10"
    d.mkdir()
    (d / "config.json").write_text("{}")
    torch.save({"w": torch.zeros(2)}, d / "pytorch_model.bin")
    assert script_checkpoint_refusal(d) is None
    torch.save({"x": RunsCommand("true")}, d / "optimizer.pt")
    why = script_checkpoint_refusal(d)
    assert why is not None and "optimizer.pt" in why and "posix.system" in why, why


def test_the_cli_refuses_a_hostile_resume_file_with_exit_2(tmp_path):
    """``trainctl run --resume-from evil.pt -- CMD``: refused before anything starts, the
    global named, nothing run."""
    marker, path, name = tmp_path / "ran", tmp_path / "evil.pt", "posix.system"
    torch.save({"epoch": 0, "optimizer": {"state": {0: RunsCommand(_touch(marker))}}}, path)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainctl",
            "run",
            "--no-tmux",
            "--resume-from",
            str(path),
            "--resume-arg=--resume",
            "--resume-arg={checkpoint}",
            "--",
            "true",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert f"imports {name}" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not marker.exists()


def test_a_checkpoint_a_script_wrote_itself_is_refused_when_its_pickle_runs_code(tmp_path):
    """The watch, the copy before a restart and the command's resume rule accept a script's
    own checkpoint through one place: a file whose pickle runs code is BAD there, its
    global named, and never given to the script; the user's trust lets it through."""
    from trainctl.store.checkpoint_accept import accept_script_checkpoint

    hostile = hostile_files(tmp_path)  # its own: the control test above runs the shared ones
    for path, name, marker in hostile:
        verdict = accept_script_checkpoint(path)
        assert not verdict.usable and f"imports {name}" in verdict.detail, (path.name, verdict)
        assert not marker.exists()
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    (folder / "model.pt").write_bytes(hostile[1][0].read_bytes())
    assert not accept_script_checkpoint(folder).usable
    good = plain_loop_checkpoint(tmp_path / "good.pt", "Adam")
    assert accept_script_checkpoint(good).usable
    nested = next(p for p, _n, _m in hostile if p.name == "nested.pt")
    assert accept_script_checkpoint(nested, trusted={os.path.realpath(nested)}).usable
