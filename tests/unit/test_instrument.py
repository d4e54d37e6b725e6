"""The zero-code integrations' pure parts and their bootstrap, in real interpreters.

The bootstrap runs in real ``python`` subprocesses (no torch: each takes ~50 ms); the
"other interpreter" cases run in a fresh venv of the base Python, which has neither trainctl
nor tomlkit; a watched library is a tiny package made here (``fakelib``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv

import pytest

from trainctl.agent.launch import CommandRunner, integration_of
from trainctl.agent.zero_code import build_lib, instrument_env, python_command
from trainctl.core import events as E
from trainctl.inside import INSTRUMENT_ENV, RESUME_ENV, attached_integration
from trainctl.inside.session import script_is_guarded
from trainctl.store.paths import RunFiles
from trainctl.store.spec import RunSpec


# ---------------------------------------------------------------------- python_command
@pytest.mark.parametrize(
    "argv",
    [
        ["python", "train.py"],
        ["python3", "-u", "train.py"],
        ["/venv/bin/python3.11", "train.py"],
        ["pypy3", "t.py"],
        ["env", "CUDA_VISIBLE_DEVICES=0", "python", "t.py"],
        ["/usr/bin/env", "-i", "python3", "-m", "x"],
    ],
)
def test_python_interpreters_are_python_commands(argv):
    assert python_command(argv)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bash", "-c", "python train.py"],
        ["torchrun", "train.py"],
        ["accelerate", "launch", "t.py"],
        ["pythonista"],
        ["env", "X=1"],
        ["./missing.py"],
        ["my-python-tool"],
    ],
)
def test_launchers_shells_and_others_are_not(argv):
    assert not python_command(argv)


def test_a_launcher_that_is_a_python_console_script_is_still_a_launcher(tmp_path):
    """torch installs torchrun as a console script (#! python) in a venv's bin, Debian's
    python3-torch in /usr/bin: found on the PATH it is still no trainer."""
    for name in ("torchrun", "accelerate", "my-tool"):
        (tmp_path / name).write_text("#!/usr/bin/python3\nimport sys\n")
        (tmp_path / name).chmod(0o755)
    assert not python_command(["torchrun", "--nproc-per-node", "2", "train.py"], path=str(tmp_path))
    assert not python_command([str(tmp_path / "accelerate"), "launch", "t.py"], path=str(tmp_path))
    assert python_command(["my-tool", "x"], path=str(tmp_path))  # any other Python script is one


def test_a_script_is_python_by_its_shebang(tmp_path):
    (tmp_path / "a.py").write_text("#!/usr/bin/env -S python3 -u\nprint(1)\n")
    (tmp_path / "b.sh").write_text("#!/bin/bash\necho 1\n")
    (tmp_path / "c").write_bytes(b"\x7fELF\x02\x01")
    assert python_command(["./a.py", "--x"], cwd=tmp_path)
    assert not python_command(["./b.sh"], cwd=tmp_path)
    assert not python_command(["./c"], cwd=tmp_path)
    tool = tmp_path / "bin" / "yolo"  # an entry point on the trainer's PATH
    tool.parent.mkdir()
    tool.write_text("#!/venv/bin/python3.11\nimport sys\n")
    tool.chmod(0o755)
    assert python_command(["yolo", "train"], path=str(tool.parent))
    assert not python_command(["yolo", "train"], path=str(tmp_path))


@pytest.mark.parametrize(
    "source,guarded",
    [
        ("if __name__ == '__main__':\n    main()\n", True),
        ("if '__main__' == __name__:\n    main()\n", True),
        ("from x import y\nmodel.train(workers=2)\n", False),
        ("def f():\n    if __name__ == '__main__':\n        pass\nf()\n", False),
        ("this is not python(", True),
    ],
)
def test_script_guard_detection(source, guarded):
    assert script_is_guarded(source) is guarded


# ---------------------------------------------------------------------- the bootstrap
FAKELIB = '__version__ = "{version}"\nprint("fakelib imported", flush=True)\n'
SCRIPT = """\
import os, sys
import fakelib
print("script ran:", fakelib.__version__)
print("trainctl:", sorted(m for m in sys.modules if m.split('.')[0] == 'trainctl'))
print("PYTHONPATH:", os.environ.get("PYTHONPATH"))
print("sys.path has bootstrap:", any(p.endswith("bootstrap") for p in sys.path))
print("instrument env:", "TRAINCTL_INSTRUMENT" in os.environ)
"""


@pytest.fixture
def world(tmp_path):
    """A run directory with its side channel, a script that imports ``fakelib`` 7.0 and a
    user PYTHONPATH entry holding fakelib and the user's own sitecustomize."""
    user = tmp_path / "user"
    (user / "fakelib").mkdir(parents=True)
    (user / "fakelib" / "__init__.py").write_text(FAKELIB.format(version="7.0"))
    (user / "sitecustomize.py").write_text("import builtins\nbuiltins.USER_SITECUSTOMIZE = True\n")
    run = tmp_path / "run"
    run.mkdir()
    side = run / "side-1.jsonl"
    side.write_text("")
    script = tmp_path / "script.py"
    script.write_text(
        SCRIPT
        + "import builtins\nprint('user sitecustomize:', getattr(builtins, 'USER_SITECUSTOMIZE', False))\n"
    )
    return {"user": user, "run": run, "side": side, "script": script, "tmp": tmp_path}


def run_script(world, python=sys.executable, watch=None, raw=None, strip_links=False):
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAINCTL_")}
    base.update(
        PYTHONPATH=str(world["user"]),
        TRAINCTL_EVENTS_PATH=str(world["side"]),
        TRAINCTL_RUN_DIR=str(world["run"]),
    )
    env = instrument_env(base, world["run"])
    if strip_links:  # trainctl's code not where the bootstrap is told it is
        for part in ("lib", "fallback"):
            shutil.rmtree(world["run"] / "instrument" / part)
            (world["run"] / "instrument" / part).mkdir()
    if watch is not None or raw is not None:
        data = json.loads(env[INSTRUMENT_ENV])
        if watch is not None:
            data["watch"] = watch
        env[INSTRUMENT_ENV] = raw if raw is not None else json.dumps(data)
    r = subprocess.run([python, str(world["script"])], env=env, capture_output=True, text=True, timeout=60)
    infos = [E.decode(line) for line in world["side"].read_text().splitlines()]
    return r, infos


def test_a_script_without_watched_imports_is_unaltered_and_the_user_sitecustomize_runs(world):
    direct = subprocess.run(
        [sys.executable, str(world["script"])],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(world["user"])},
    )
    r, infos = run_script(world)
    assert r.returncode == 0, r.stderr
    assert r.stdout == direct.stdout and r.stderr == direct.stderr == ""
    assert f"PYTHONPATH: {world['user']}" in r.stdout and "user sitecustomize: True" in r.stdout
    assert "trainctl: []" in r.stdout and "sys.path has bootstrap: False" in r.stdout
    assert "instrument env: False" in r.stdout and infos == []


def test_a_version_out_of_range_is_refused_with_a_reason_and_the_script_runs(world):
    r, infos = run_script(world, watch={"fakelib": "ultralytics"})
    assert r.returncode == 0, r.stderr
    assert "script ran: 7.0" in r.stdout and "user sitecustomize: True" in r.stdout
    assert [(i.key, i.text) for i in infos] == [
        (
            "instrument.refused",
            "ultralytics integration not attached: Ultralytics 7.0 is outside the "
            "tested range (8.3.x or 8.4.x); console parsing",
        )
    ]


def test_an_attach_that_fails_leaves_the_script_running(world):
    (world["user"] / "fakelib" / "__init__.py").write_text(FAKELIB.format(version="8.4.0"))
    r, infos = run_script(world, watch={"fakelib": "nosuchintegration"})
    assert r.returncode == 0 and "script ran: 8.4.0" in r.stdout, r.stderr
    assert [i.key for i in infos] == ["instrument.failed"]
    assert "cannot be imported" in infos[0].text and "nosuchintegration" in infos[0].text


def test_a_broken_bootstrap_setting_is_said_and_the_script_runs_unaltered(world):
    r, infos = run_script(world, raw="{not json")
    assert r.returncode == 0 and "script ran: 7.0" in r.stdout and "user sitecustomize: True" in r.stdout
    assert [i.key for i in infos] == ["instrument.failed"]
    assert "bootstrap failed" in infos[0].text and "runs unaltered" in infos[0].text


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """Another interpreter, as a user's venv: the base Python, no trainctl, no tomlkit."""
    where = tmp_path_factory.mktemp("bare-venv")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    python = str(where / "bin" / "python")
    probe = subprocess.run([python, "-c", "import trainctl"], capture_output=True, timeout=30, cwd=where)
    assert probe.returncode != 0, "the bare venv should not see trainctl"
    return python


def test_another_interpreter_imports_trainctl_through_the_bootstrap_only(world, bare_python):
    """trainctl's code reaches the integration (its refusal is trainctl's own text, tomlkit
    from the fallback) while the script itself sees no trainctl module."""
    r, infos = run_script(world, python=bare_python, watch={"fakelib": "ultralytics"})
    assert r.returncode == 0, r.stderr
    assert [i.key for i in infos] == ["instrument.refused"], infos
    assert "outside the tested range" in infos[0].text


def test_another_interpreter_without_trainctl_s_links_says_why(world, bare_python):
    r, infos = run_script(world, python=bare_python, watch={"fakelib": "ultralytics"}, strip_links=True)
    assert r.returncode == 0 and "script ran: 7.0" in r.stdout, r.stderr
    assert [i.key for i in infos] == ["instrument.failed"]
    assert bare_python in infos[0].text and "No module named 'trainctl'" in infos[0].text


def test_the_lib_holds_trainctl_alone_and_is_rebuilt(tmp_path):
    lib, fallback = build_lib(tmp_path)
    assert sorted(p.name for p in lib.iterdir()) == ["trainctl"]
    assert (lib / "trainctl" / "inside" / "__init__.py").is_file()
    assert sorted(p.name for p in fallback.iterdir()) == ["tomlkit"]
    build_lib(tmp_path)  # again over the old one: same result, no leftovers
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fallback", "lib"]


# ---------------------------------------------------------------------- the agent's side
def spec(tmp_path, command, **kw) -> RunSpec:
    return RunSpec(job_name="t", kind="command", command=command, cwd=str(tmp_path), **kw)


def journal(files: RunFiles, *events: E.Event) -> None:
    files.dir.mkdir(parents=True, exist_ok=True)
    with open(files.events, "a") as f:
        for ev in events:
            f.write(E.encode(ev) + "\n")


def test_the_command_runner_instruments_python_commands_only(tmp_path):
    files = RunFiles(tmp_path / "run")
    files.dir.mkdir()
    runner = CommandRunner()
    base = {"PYTHONPATH": "/mine"}
    env = runner.env(spec(tmp_path, ["python", "t.py"]), files, base, ["python", "t.py"], None)
    assert env["PYTHONPATH"].endswith(os.pathsep + "/mine") and INSTRUMENT_ENV in env
    assert runner.env(spec(tmp_path, ["bash", "x"]), files, base, ["bash", "x"], None) == base
    off = spec(tmp_path, ["python", "t.py"], instrument=False)
    assert runner.env(off, files, base, ["python", "t.py"], None) == base


def test_once_an_integration_attached_the_restart_resumes_through_it(tmp_path):
    files = RunFiles(tmp_path / "run")
    s = spec(tmp_path, ["python", "t.py"], resume_args=["--resume", "{checkpoint}"])
    runner = CommandRunner()
    journal(files, E.Info(0.5, "x", "instrument.refused"))
    assert integration_of(files) is None
    journal(
        files, E.Info(1.0, "integration attached: ultralytics 8.4.190", "instrument.attached.ultralytics")
    )
    with open(files.events, "a") as f:  # a line being written is not read yet
        f.write('{"ts": 2, "type": "info", "text": "", "key": "instrument.attached.light')
    assert integration_of(files) == "ultralytics" and attached_integration("instrument.refused") is None
    with open(files.events, "a") as f:
        f.write('ning"}\n')
    assert integration_of(files) == "lightning"  # read on from where it was
    journal(
        files, E.Info(3.0, "integration attached: ultralytics 8.4.190", "instrument.attached.ultralytics")
    )
    env = runner.env(s, files, {}, ["python", "t.py"], "/ck/mid.pt")
    assert env[RESUME_ENV] == "/ck/mid.pt"
    assert runner.argv(s, files, None, None, "/ck/mid.pt", 2) == ["python", "t.py"]  # no --resume
    skipped = []
    bad = files.dir / "checkpoints" / "last_good.pt"
    bad.parent.mkdir()
    bad.write_bytes(b"PK\x03\x04 cut short")
    assert runner.resume_checkpoint(s, files, None, on_skip=lambda p, why: skipped.append(p)) is None
    assert skipped == [bad]  # the Ultralytics rule: last_good.pt is a candidate, and verified
    # Without an integration the generic rule stands: resume args appended.
    other = RunFiles(tmp_path / "other")
    journal(other, E.Info(1.0, "x", "instrument.refused"))
    assert runner.argv(s, other, None, None, "/ck/a.pt", 2) == ["python", "t.py", "--resume", "/ck/a.pt"]
    assert RESUME_ENV not in runner.env(s, other, {}, ["python", "t.py"], "/ck/a.pt")


# ---------------------------------------------------------------------- the Ultralytics plan
def test_the_preset_replaces_the_script_s_keywords_and_the_warning_names_them(tmp_path):
    import dataclasses

    from trainctl.config import load_preset
    from trainctl.inside.session import TrainerSession
    from trainctl.inside.ultralytics import TrainPlan
    from trainctl.inside.ultralytics_runner import EventSink

    side = tmp_path / "side.jsonl"
    fd = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        session = TrainerSession(EventSink(fd), None, 1, load_preset("B"), None, 600.0)
        plan = TrainPlan(session, "8.4.190")
        assert plan.arguments({"workers": 2, "epochs": 3}) == {"workers": 0, "epochs": 3}
        assert plan.arguments({"workers": 0, "epochs": 3}) == {"workers": 0, "epochs": 3}  # no key replaced
        # A key the script did not pass is said too, beside what Ultralytics would have used.
        no_val = dataclasses.replace(load_preset("B"), train={"val": False})
        TrainPlan(TrainerSession(EventSink(fd), None, 1, no_val, None, 600.0), "8.4.190").arguments(
            {"workers": 0}
        )
        # Preset A's DataLoader settings reach Ultralytics' loaders: said beside its own.
        TrainPlan(TrainerSession(EventSink(fd), None, 1, load_preset("A"), None, 600.0), "8.4.190").arguments(
            {"workers": 2}
        )
    finally:
        os.close(fd)
    said = [E.decode(line) for line in side.read_text().splitlines()]
    assert [w.id for w in said] == ["trainctl.preset_overrides"] * 4
    assert said[0].text == (
        "preset B changes the script's model.train(): workers 2 -> 0; and sets OMP_NUM_THREADS=2"
    )
    assert said.pop(1).text == "preset B sets OMP_NUM_THREADS=2"  # its threads, all the same
    assert said[1].text == (
        "preset B changes the script's model.train(): val True (Ultralytics' default) "
        "-> False; and sets OMP_NUM_THREADS=2"
    )
    assert said[2].text.startswith(
        "preset A changes Ultralytics' DataLoaders: prefetch_factor 4 -> 2, multiprocessing_context "
    )
    assert "-> 'spawn'" in said[2].text and "presets edit A" in said[2].advice


def test_a_command_job_may_turn_instrumentation_off_and_set_mid_epoch_saves(tmp_path):
    from trainctl.config import load_job

    job = tmp_path / "trainctl.toml"
    job.write_text(
        'kind = "command"\ncommand = ["python", "t.py"]\ninstrument = false\ncheckpoint_every = "2m"\n'
    )
    loaded = load_job(job)
    assert loaded.instrument is False and loaded.checkpoint_every == 120.0
    job.write_text('kind = "command"\ncommand = ["python", "t.py"]\n')
    assert load_job(job).instrument is True
