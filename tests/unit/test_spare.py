"""The warm spare's pure rules (which environment decides, which commands run on one, how the
journal says it) and the parked process itself with a light import (no torch): released by a
real FIFO, or ended by its EOF."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainctl.agent.spare import (
    SpareCommand,
    describe_start,
    env_differences,
    imports_for,
    launch_argv,
    launch_env,
    script_of,
)
from trainctl.core import events as E
from trainctl.inside.spare import BadRequest, decode_request, encode_request, final_env

BASE = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "2", "TRAINCTL_ATTEMPT": "2", "HOME": "/h"}


def test_the_same_environment_matches_whatever_the_attempt_facts_say():
    wanted = dict(BASE, TRAINCTL_ATTEMPT="3", TRAINCTL_PRESET="B", TRAINCTL_EVENTS_PATH="/r/side-3.jsonl")
    assert env_differences(BASE, wanted) == []


@pytest.mark.parametrize(
    "change",
    [
        {"OMP_NUM_THREADS": "1"},
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        {"PYTORCH_HIP_ALLOC_CONF": "garbage_collection_threshold:0.8"},
        {"MIOPEN_USER_DB_PATH": "/tmp/db"},
        {"HIP_VISIBLE_DEVICES": "1"},
        {"CUDA_VISIBLE_DEVICES": "0"},
        {"MY_PRESET_VAR": "x"},  # a preset's [env]: any name counts
    ],
)
def test_a_difference_before_import_torch_does_not_match_and_is_named(change):
    assert env_differences(BASE, dict(BASE, **change)) == sorted(change)
    gone = dict(BASE)
    gone.pop("OMP_NUM_THREADS")
    assert env_differences(BASE, gone) == ["OMP_NUM_THREADS"]


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["python", "train.py", "--x", "1"], SpareCommand("python", (), ("path", "train.py", ["--x", "1"]))),
        (["/v/bin/python3", "-u", "t.py"], SpareCommand("/v/bin/python3", ("-u",), ("path", "t.py", []))),
        (["python", "-m", "pkg.mod", "a"], SpareCommand("python", (), ("module", "pkg.mod", ["a"]))),
        (["python", "-I", "-u", "t.py"], SpareCommand("python", ("-I", "-u"), ("path", "t.py", []))),
        (["python", "-Es", "-P", "-m", "m"], SpareCommand("python", ("-Es", "-P"), ("module", "m", []))),
        (["python", "-X", "dev", "t.py"], None),  # options a spare cannot take: cold
        (["python", "-O", "t.py"], None),
        (["python", "-c", "print(1)"], None),
        (["torchrun", "--nproc-per-node", "2", "t.py"], None),
        (["bash", "t.sh"], None),
        (["python"], None),
    ],
)
def test_only_a_python_script_or_module_runs_on_a_spare(argv, expected):
    assert script_of(argv) == expected


def test_the_runner_spare_imports_ultralytics_too():
    torch_first = ["torch", "torch._dynamo", "torch.utils.data"]  # what a first optimizer step imports
    assert imports_for(("module", "trainctl.inside.ultralytics_runner", [])) == [*torch_first, "ultralytics"]
    assert imports_for(("path", "train.py", [])) == torch_first


def test_the_journal_says_how_an_attempt_started():
    assert describe_start(2, [], None, 12.34) == "attempt 2 started on the warm spare (parked 12.3 s)"
    assert describe_start(3, ["OMP_NUM_THREADS", "X"], None, 0) == (
        "attempt 3 started cold: the spare's environment differs in OMP_NUM_THREADS, X"
    )
    assert describe_start(2, [], "the spare had ended", 0) == "attempt 2 started cold: the spare had ended"


def test_the_released_environment_keeps_what_the_bootstrap_took_out():
    launch = {"PYTHONPATH": "/boot:/user", "TRAINCTL_INSTRUMENT": "{}", "TRAINCTL_ATTEMPT": "2", "A": "1"}
    current = {"PYTHONPATH": "/user", "TRAINCTL_ATTEMPT": "2", "A": "1", "SPARE_ONLY": "x"}
    wanted = dict(launch, TRAINCTL_ATTEMPT="3")
    assert final_env(current, launch, wanted) == {"PYTHONPATH": "/user", "TRAINCTL_ATTEMPT": "3", "A": "1"}


def _park(
    cwd: Path, argv: list[str], imports: str, env: dict | None = None
) -> tuple[subprocess.Popen, Path, int]:
    """A spare for ``argv`` parked in ``cwd`` as the agent starts one (its flags, its
    environment), importing ``imports``: (process, FIFO, the FIFO's writer fd)."""
    command = script_of(argv)
    assert command is not None
    fifo = cwd.parent / f"spare-{time.monotonic_ns()}.fifo"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDWR)
    launch = dict(
        launch_env(command, os.environ if env is None else env, fifo), TRAINCTL_SPARE_IMPORTS=imports
    )
    proc = subprocess.Popen(launch_argv(command, argv), env=launch, cwd=cwd, stdout=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not Path(f"{fifo}.ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the spare never said it was ready"
        time.sleep(0.02)
    return proc, fifo, fd


def _release(proc: subprocess.Popen, fd: int, argv: list[str], cwd: Path, env: dict) -> str:
    command = script_of(argv)
    assert command is not None
    os.write(fd, encode_request(command.run, argv, env, {}, str(cwd)))
    os.close(fd)
    out, _ = proc.communicate(timeout=30)
    return out.decode()


def test_a_parked_spare_runs_the_script_as_main_with_its_argv_cwd_and_env(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    script = work / "train.py"
    script.write_text(
        "import os, sys\n"
        "print(__name__, sys.argv, os.getcwd(), os.environ.get('WANTED'), sys.path[0], __file__, flush=True)\n"
        "sys.exit(3)\n"
    )
    argv = [sys.executable, "train.py", "--a", "1"]
    proc, fifo, fd = _park(work, argv, "json,no_such_module_here")
    ready = json.loads(Path(f"{fifo}.ready").read_text())
    assert ready["pid"] == proc.pid and ready["modules"] == ["json", "no_such_module_here"]
    assert ready["cuda_initialized"] is False
    out = _release(proc, fd, argv, work, dict(os.environ, WANTED="yes"))
    assert proc.returncode == 3
    assert out.split() == [
        "__main__",
        "['train.py',",
        "'--a',",
        "'1']",
        str(work),
        "yes",
        str(work),
        str(script),
    ]


def test_a_parked_spare_ends_when_its_fifo_closes(tmp_path):
    (tmp_path / "w").mkdir()
    proc, _fifo, fd = _park(tmp_path / "w", [sys.executable, "t.py"], "json")
    os.close(fd)
    assert proc.wait(timeout=30) == 0
    assert proc.stdout is not None and proc.stdout.read() == b""


def test_a_spare_told_something_it_cannot_run_says_so_and_never_exits_0(tmp_path):
    (tmp_path / "w").mkdir()
    proc, _fifo, fd = _park(tmp_path / "w", [sys.executable, "t.py"], "")
    os.write(fd, b"7\nnot one")
    os.close(fd)
    assert proc.wait(timeout=30) == 2


def test_the_release_request_carries_any_argv_and_environment():
    env = {"A": "line\nbreak", "B": "x=y", "C": "", "D": "caf\u00e9 \udcff"}
    data = encode_request(("path", "t.py", ["--a", "", "b c"]), ["py", "t.py"], env, {"L": "1"}, "/w")
    head, _, payload = data.partition(b"\n")
    assert int(head) == len(payload)
    assert decode_request(payload) == {
        "run": ["path", "t.py", ["--a", "", "b c"]],
        "argv": ["py", "t.py"],
        "env": env,
        "launch_env": {"L": "1"},
        "cwd": "/w",
    }
    for bad in (b"", b"path\0t.py", b"path\0t.py\0/w\x009\0", b"run\0t\0/w\x000\x000\x000\x000\0"):
        with pytest.raises(BadRequest):
            decode_request(bad)


def test_the_spares_own_code_imports_only_what_is_built_in_or_frozen():
    """Nothing of its own is looked up on sys.path: nothing planted in the cwd or the script's
    folder runs in it (json, fcntl... would)."""
    import _imp
    import ast

    import trainctl.inside.spare as inside

    tree = ast.parse(Path(inside.__file__).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names == {"os", "sys", "time", "runpy"}
    assert [m for m in names if m not in sys.builtin_module_names and not _imp.is_frozen(m)] == []


def test_a_parked_spares_status_file_is_no_attempts(tmp_path):
    from trainctl.holder.handle import last_status, spare_fifo

    for n in (1, 2):
        (tmp_path / f"trainer-{n}.json").write_text(json.dumps({"attempt": n}))
    os.mkfifo(spare_fifo(tmp_path, 2))
    assert last_status(tmp_path)["attempt"] == 1
    spare_fifo(tmp_path, 2).unlink()  # released: the attempt's own
    assert last_status(tmp_path)["attempt"] == 2


async def test_the_spare_is_warmed_once_the_attempt_has_trained_spare_after_s(tmp_path, monkeypatch):
    from trainctl.agent.holder_spawner import HeldSpawner

    monkeypatch.setenv("TRAINCTL_SPARE_AFTER", "30")
    spawner = HeldSpawner(tmp_path, spare=True)
    warmed: list[int] = []

    async def warm(argv, env, cwd, log_path, attempt):
        warmed.append(attempt)

    monkeypatch.setattr(spawner, "_warm", warm)
    spawner._to_warm = (["python", "t.py"], {}, str(tmp_path), tmp_path / "train.log", 2)
    spawner.on_journaled(E.Progress(100.0, 1, 1, 1, 10))
    spawner.on_journaled(E.Progress(129.9, 1, 1, 2, 10))
    await asyncio.sleep(0)
    assert warmed == []  # 29.9 s of training: not yet
    spawner.on_journaled(E.Progress(130.0, 1, 1, 3, 10))
    await asyncio.sleep(0)
    assert warmed == [2]


# ---------------------------------------------------------------- imports as in a cold start
OWN = ["json", "fcntl", "runpy", "os"]  # what a spare imported of its own before issue 38
WARMED = ["torch", "torch._dynamo", "torch.utils.data", "ultralytics"]  # what it warms
REPORT = """
import sys
for name in sys.argv[1].split(","):
    try:
        __import__(name)
        print(name, getattr(sys.modules[name], "__file__", None) or "(no file)")
    except Exception as e:
        print(name, "failed:", type(e).__name__)
"""


def _package(where: Path, name: str, body: str) -> None:
    """Module ``name`` in ``where``: a file, or for a dotted name its packages."""
    *parents, leaf = name.split(".")
    d = where
    for part in parents:
        d = d / part
        d.mkdir(exist_ok=True)
        if not (d / "__init__.py").exists():
            (d / "__init__.py").write_text(body)
    if parents or leaf == "torch":
        (d / leaf).mkdir(exist_ok=True)
        (d / leaf / "__init__.py").write_text(body)
    else:
        (d / f"{leaf}.py").write_text(body)


@pytest.mark.parametrize(
    "kind, flags, plant, names",
    [
        ("path", [], "cwd", OWN + WARMED),  # `python -c` put the cwd first: a planted torch ran
        ("path", [], "script", OWN + WARMED),  # the script's folder is first in a cold start too
        ("link", [], "script", OWN + WARMED),  # a symlinked script: its real folder
        ("path", ["-P"], "script", OWN + WARMED),
        ("path", ["-E", "-u"], "cwd", OWN),  # -E / -I: PYTHONPATH (the stand-ins) ignored, so
        ("path", ["-E"], "script", OWN),  # the real torch would be imported: stdlib names only
        ("path", ["-I"], "script", OWN),
        ("module", [], "cwd", OWN + WARMED),  # -m: the cwd first
    ],
)
def test_a_spare_imports_the_same_files_as_a_cold_start(tmp_path, kind, flags, plant, names):
    """A module named like each import the spare makes, planted in the cwd or the script's
    folder: the released spare's script and a cold start of the same command import the same
    files, and the same planted ones ran.  torch and ultralytics are stand-in packages on
    PYTHONPATH (the real ones' imports would take seconds; where they come from is the test)."""
    cwd, scripts, site, marks = (tmp_path / d for d in ("cwd", "scripts", "site", "marks"))
    for d in (cwd, scripts, site):
        d.mkdir()
    (scripts / "report.py").write_text(REPORT)
    (cwd / "report_mod.py").write_text(REPORT)
    (cwd / "linked").symlink_to(scripts)
    for name in WARMED:
        _package(site, name, "")
    said = f"open({str(marks)!r}, 'a').write(__name__ + ' ' + __file__ + '\\n')\n"
    for name in names:
        _package(cwd if plant == "cwd" else scripts, name, said)
    target = {
        "path": [str(scripts / "report.py")],
        "link": ["linked/report.py"],
        "module": ["-m", "report_mod"],
    }
    argv = [sys.executable, *flags, *target[kind], ",".join(names)]
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("PYTHONSAFEPATH", None)

    cold = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    cold_marks = sorted(marks.read_text().splitlines()) if marks.exists() else []
    marks.unlink(missing_ok=True)
    proc, _fifo, fd = _park(cwd, argv, ",".join(n for n in WARMED if n in names), env)
    warm = _release(proc, fd, argv, cwd, env)
    warm_marks = sorted(marks.read_text().splitlines()) if marks.exists() else []

    assert cold.returncode == 0 and proc.returncode == 0, cold.stderr
    assert warm.splitlines() == cold.stdout.splitlines()
    assert warm_marks == cold_marks
    on_cold_path = {"cwd": kind == "module", "script": not ({"-P", "-I"} & set(flags))}[plant]
    planted_ran = {line.split()[0] for line in cold_marks}
    frozen = {"os", "runpy"}  # frozen in the interpreter: never looked up on sys.path
    assert planted_ran == (
        {n for n in names if n not in frozen} | ({"torch.utils"} if "torch" in names else set())
        if on_cold_path
        else set()
    )


def test_a_released_spare_shows_the_attempts_argv_as_its_command_line(tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "train.py").write_text(
        "import os\nprint(open(f'/proc/{os.getpid()}/cmdline', 'rb').read().rstrip(b'\\0').split(b'\\0'))\n"
    )
    argv = [
        sys.executable,
        "-u",
        "train.py",
        "--epochs",
        "2",
        "--out",
        "d" * 300,
    ]  # longer than the spare's own
    proc, _fifo, fd = _park(tmp_path / "w", argv, "")
    spare = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    assert b"trainctl-warm-spare" in spare and b"train.py" not in spare
    out = _release(proc, fd, argv, tmp_path / "w", dict(os.environ))
    assert out.strip() == repr([os.fsencode(a) for a in argv])
