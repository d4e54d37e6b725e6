"""Presets and job files: the shipped presets, validation messages, lookup, tomlkit edits."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import tomlkit

from trainctl import config
from trainctl.config import ConfigError, load_job, load_preset

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "src" / "trainctl" / "presets"
DATA = REPO / "tests" / "data" / "config"

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No ./presets and no user presets unless a test makes them."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("TRAINCTL_CONFIG_DIR", str(tmp_path / "config"))
    return cwd


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- shipped presets


def test_preset_a_carries_solution_a():
    a = load_preset("A")
    assert a.name == "A" and a.path == SHIPPED / "A.toml"
    assert a.dataloader == config.DataLoaderCfg(
        workers=2,
        persistent_workers=False,
        prefetch_factor=2,
        multiprocessing_context="spawn",
        sharing_strategy="file_system",
    )
    assert a.threads == config.ThreadsCfg(omp_num_threads=2, torch_num_threads=2)
    assert a.train == {}  # validation stays on
    assert a.description and a.expected_rate == 2.4


def test_preset_b_carries_solution_b():
    b = load_preset("B")
    assert b.dataloader.workers == 0
    assert b.dataloader.prefetch_factor is None and b.dataloader.multiprocessing_context is None
    assert b.threads.omp_num_threads == 2
    assert b.train == {}
    assert b.description


@pytest.mark.parametrize("name", ["A", "B"])
def test_shipped_presets_round_trip_through_tomlkit(name):
    text = (SHIPPED / f"{name}.toml").read_text()
    assert text.count("#") > 5, "the shipped presets explain themselves"
    assert tomlkit.dumps(tomlkit.parse(text)) == text
    assert config.preset_problems(text, f"presets/{name}.toml") == []


def test_child_env_of_a_exports_every_set_value():
    a = load_preset("A")
    assert a.child_env() == {
        "OMP_NUM_THREADS": "2",
        "TRAINCTL_PRESET": "A",
        "TRAINCTL_PRESET_FILE": str(SHIPPED / "A.toml"),
        "TRAINCTL_WORKERS": "2",
        "TRAINCTL_PERSISTENT_WORKERS": "0",
        "TRAINCTL_PREFETCH_FACTOR": "2",
        "TRAINCTL_MP_CONTEXT": "spawn",
        "TRAINCTL_SHARING_STRATEGY": "file_system",
        "TRAINCTL_TORCH_THREADS": "2",
    }


def test_child_env_has_preset_env_and_only_set_values(tmp_path):
    path = write(
        tmp_path / "p" / "mine.toml",
        '[dataloader]\nworkers = 3\npersistent_workers = true\n[env]\nMIOPEN_USER_DB_PATH = "/tmp/db"\n',
    )
    env = load_preset(path).child_env()
    assert env == {
        "MIOPEN_USER_DB_PATH": "/tmp/db",
        "TRAINCTL_PRESET": "mine",
        "TRAINCTL_PRESET_FILE": str(path),
        "TRAINCTL_WORKERS": "3",
        "TRAINCTL_PERSISTENT_WORKERS": "1",
    }
    assert "OMP_NUM_THREADS" not in env


def test_dataloader_kwargs_of_a_and_b():
    assert load_preset("A").dataloader_kwargs() == {
        "num_workers": 2,
        "persistent_workers": False,
        "prefetch_factor": 2,
        "multiprocessing_context": "spawn",
    }
    assert load_preset("B").dataloader_kwargs() == {"num_workers": 0}
    assert config.Preset(name="empty").dataloader_kwargs() == {}


LOADER_SCRIPT = """
import sys, torch
from torch.utils.data import DataLoader, TensorDataset
from trainctl.config import load_preset

if __name__ == "__main__":
    preset = load_preset(sys.argv[1])
    if preset.dataloader.sharing_strategy:
        torch.multiprocessing.set_sharing_strategy(preset.dataloader.sharing_strategy)
    loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2, **preset.dataloader_kwargs())
    print(sorted(int(x) for (batch,) in loader for x in batch))
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", ["A", "B"])
def test_shipped_kwargs_drive_a_real_dataloader(tmp_path, name):
    """A's spawned workers and B's in-process loading both deliver every sample.

    Runs in a child process (its own session, killed whole on the way out): spawn
    workers leave a resource tracker and torch_shm_manager behind in their parent.
    """
    pytest.importorskip("torch")
    script = write(tmp_path / "loader.py", LOADER_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), name],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=80)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 0, out
    assert out.strip().splitlines()[-1] == str(list(range(8)))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_workers": 0, "prefetch_factor": 2},
        {"num_workers": 0, "persistent_workers": True},
        {"num_workers": 0, "multiprocessing_context": "spawn"},
    ],
)
def test_combinations_refused_here_are_refused_by_pytorch_too(kwargs):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    toml = "\n".join(
        f"{k.replace('num_workers', 'workers')} = {tomlkit.item(v).as_string()}" for k, v in kwargs.items()
    )
    problems = config.preset_problems("[dataloader]\n" + toml + "\n", "p.toml")
    assert len(problems) == 1 and "workers > 0" in problems[0].message
    with pytest.raises(ValueError):
        DataLoader(TensorDataset(torch.arange(4.0)), **kwargs)


# --------------------------------------------------------------------------- preset mistakes

PRESET_MISTAKES = {
    "negative workers": (
        "[dataloader]\nworkers = -1\n",
        2,
        "[dataloader] workers",
        ["integer >= 0", "got -1"],
    ),
    "float workers": ("[dataloader]\nworkers = 2.0\n", 2, "[dataloader] workers", ["integer >= 0"]),
    "prefetch with workers 0": (
        "[dataloader]\nworkers = 0\nprefetch_factor = 2\n",
        3,
        "[dataloader] prefetch_factor",
        ["workers > 0", "got workers = 0"],
    ),
    "prefetch without workers": (
        "[dataloader]\nprefetch_factor = 2\n",
        2,
        "[dataloader] prefetch_factor",
        ["workers > 0", "not set"],
    ),
    "prefetch zero": (
        "[dataloader]\nworkers = 2\nprefetch_factor = 0\n",
        3,
        "[dataloader] prefetch_factor",
        ["integer >= 1"],
    ),
    "persistent with workers 0": (
        "[dataloader]\nworkers = 0\npersistent_workers = true\n",
        3,
        "[dataloader] persistent_workers",
        ["workers > 0"],
    ),
    "context with workers 0": (
        '[dataloader]\nworkers = 0\nmultiprocessing_context = "spawn"\n',
        3,
        "[dataloader] multiprocessing_context",
        ["workers > 0"],
    ),
    "bad context": (
        '[dataloader]\nworkers = 2\nmultiprocessing_context = "spwan"\n',
        3,
        "[dataloader] multiprocessing_context",
        ['"fork", "spawn", "forkserver"', '"spwan"'],
    ),
    "bad sharing strategy": (
        '[dataloader]\nsharing_strategy = "shm"\n',
        2,
        "[dataloader] sharing_strategy",
        ['"file_descriptor", "file_system"'],
    ),
    "string for bool": (
        '[dataloader]\nworkers = 2\npersistent_workers = "true"\n',
        3,
        "[dataloader] persistent_workers",
        ["true or false", "no quotes", '"true"'],
    ),
    "string for train bool": ('[train]\nval = "false"\n', 2, "[train] val", ["true or false"]),
    "unknown dataloader key": (
        "[dataloader]\nworker = 2\n",
        2,
        "[dataloader] worker",
        ["unknown key", "workers, persistent_workers, prefetch_factor", "did you mean workers"],
    ),
    "unknown section": (
        "[dataloaders]\nworkers = 2\n",
        1,
        "[dataloaders]",
        ["unknown section", "[dataloader], [threads], [train], [env]"],
    ),
    "unknown top-level key": (
        'descripton = "x"\n',
        1,
        "descripton",
        ["unknown key", "description, expected_rate, args", "did you mean description"],
    ),
    "section as a value": ("threads = 2\n", 1, "threads", ["must be a table", "[threads]"]),
    "zero threads": ("[threads]\nomp_num_threads = 0\n", 2, "[threads] omp_num_threads", ["integer >= 1"]),
    "bad env key": ('[env]\n"MY-VAR" = "1"\n', 2, "[env] MY-VAR", ["environment variable name"]),
    "env value not a string": (
        "[env]\nHIP_VISIBLE_DEVICES = 0\n",
        2,
        "[env] HIP_VISIBLE_DEVICES",
        ["must be a string", 'HIP_VISIBLE_DEVICES = "0"'],
    ),
    "reserved env key": ('[env]\nTRAINCTL_WORKERS = "3"\n', 2, "[env] TRAINCTL_WORKERS", ["set by trainctl"]),
    "omp twice": (
        '[threads]\nomp_num_threads = 2\n[env]\nOMP_NUM_THREADS = "4"\n',
        4,
        "[env] OMP_NUM_THREADS",
        ["[threads] omp_num_threads"],
    ),
    "workers in train": ("[train]\nworkers = 2\n", 2, "[train] workers", ["[dataloader] workers"]),
    "bad batch": ("[train]\nbatch = 0\n", 2, "[train] batch", [">= 1", "-1"]),
    "list in train": (
        "[train]\nclasses = [0, 1]\n",
        2,
        "[train] classes",
        ["string, number or boolean", "[0, 1]"],
    ),
    "args not a list": ('args = "--amp"\n', 1, "args", ["list of strings"]),
    "args item not a string": ('args = ["--epochs", 3]\n', 1, "args", ["item 2 is 3"]),
    "zero expected rate": ("expected_rate = 0\n", 1, "expected_rate", ["number > 0"]),
    "bool expected rate": ("expected_rate = true\n", 1, "expected_rate", ["number > 0"]),
    "description not a string": ("description = 3\n", 1, "description", ["must be a string"]),
}


@pytest.mark.parametrize("text,line,key,allowed", PRESET_MISTAKES.values(), ids=PRESET_MISTAKES.keys())
def test_each_preset_mistake_names_file_key_and_what_is_allowed(text, line, key, allowed):
    [problem] = config.preset_problems(text, "presets/X.toml")
    assert (problem.file, problem.key, problem.line) == ("presets/X.toml", key, line)
    assert str(problem).startswith(f"presets/X.toml: {key}: ")
    for fragment in allowed:
        assert fragment in problem.message


def test_the_message_reads_like_the_design():
    [problem] = config.preset_problems("[dataloader]\nworkers = -1\n", "presets/A.toml")
    assert str(problem) == "presets/A.toml: [dataloader] workers: must be an integer >= 0 (got -1)"


def test_bad_toml_syntax_gives_the_line(tmp_path):
    path = write(tmp_path / "bad.toml", "# ok\n[dataloader]\nworkers = = 2\n")
    with pytest.raises(ConfigError) as info:
        load_preset(path)
    assert info.value.file == str(path) and info.value.line == 3
    assert "invalid TOML" in str(info.value) and "line 3" in str(info.value)
    [problem] = config.preset_problems(path.read_text(), path)
    assert problem.line == 3


def test_load_preset_reports_every_problem_in_file_order(tmp_path):
    path = write(tmp_path / "bad.toml", '[dataloader]\nworkers = -1\n[train]\nval = "no"\n[foo]\n')
    with pytest.raises(ConfigError) as info:
        load_preset(path)
    err = info.value
    assert [p.key for p in err.problems] == ["[dataloader] workers", "[train] val", "[foo]"]
    assert (err.key, err.line) == ("[dataloader] workers", 2)
    lines = str(err).splitlines()
    assert len(lines) == 3 and all(line.startswith(f"{path}: ") for line in lines)


def test_preset_problems_accepts_a_parsed_table():
    [problem] = config.preset_problems({"dataloader": {"workers": -2}}, "p.toml")
    assert problem.key == "[dataloader] workers" and problem.line is None


# --------------------------------------------------------------------------- lookup


def test_unknown_preset_name_lists_the_ones_that_exist(tmp_path):
    write(tmp_path / "extra" / "C.toml", "[dataloader]\nworkers = 1\n")
    with pytest.raises(ConfigError) as info:
        load_preset("D", [tmp_path / "extra"])
    assert info.value.key == "preset"
    assert '"D"' in str(info.value) and "available: A, B, C" in str(info.value)


def test_lookup_order_search_dirs_then_cwd_then_user_then_packaged(tmp_path, isolated):
    user = tmp_path / "config" / "presets"
    write(user / "A.toml", "[dataloader]\nworkers = 7\n")
    write(user / "U.toml", "")
    assert load_preset("A").dataloader.workers == 7
    write(isolated / "presets" / "A.toml", "[dataloader]\nworkers = 5\n")
    assert load_preset("A").dataloader.workers == 5
    write(tmp_path / "job" / "A.toml", "[dataloader]\nworkers = 3\n")
    assert load_preset("A", [tmp_path / "job"]).dataloader.workers == 3
    assert load_preset("B").path == SHIPPED / "B.toml"
    names = {p.stem: p for p in config.list_presets([tmp_path / "job"])}
    assert names == {"A": tmp_path / "job" / "A.toml", "B": SHIPPED / "B.toml", "U": user / "U.toml"}


def test_a_path_ref_is_read_as_a_path(tmp_path):
    write(tmp_path / "mine.toml", "[dataloader]\nworkers = 1\n")
    assert load_preset(str(tmp_path / "mine.toml")).name == "mine"
    with pytest.raises(ConfigError, match="no such file"):
        load_preset("missing.toml")


# --------------------------------------------------------------------------- editing


def test_update_keeps_comments_and_order(tmp_path):
    path = write(tmp_path / "A.toml", (SHIPPED / "A.toml").read_text())
    old = path.read_text()
    new = config.update_preset_values(
        path,
        {
            "dataloader": {
                "workers": 0,
                "prefetch_factor": None,
                "persistent_workers": None,
                "multiprocessing_context": None,
            },
            "description": "tried with workers 0",
        },
    )
    assert path.read_text() == old, "update only returns the text"
    assert "workers = 0                        # down from 4" in new
    assert "prefetch_factor" not in new and "multiprocessing_context" not in new
    assert "# Preset A" in new and "Validation stays on" in new
    assert config.preset_problems(new, path) == []
    diff = config.diff_text(old, new, path)
    assert diff.startswith(f"--- {path} (saved)\n+++ {path} (edited)\n")
    assert "-workers = 2" in diff and "+workers = 0" in diff
    assert "-# Preset A" not in diff


def test_update_adds_missing_sections_and_keys():
    new = config.update_preset_text(
        "# mine\n[dataloader]\nworkers = 1\n", {"threads": {"omp_num_threads": 1}, "expected_rate": 1.5}
    )
    preset = config.preset_from_text(new, "m.toml")
    assert preset.threads.omp_num_threads == 1 and preset.expected_rate == 1.5
    assert new.startswith("# mine\n")


def test_save_refuses_invalid_text_and_keeps_the_file(tmp_path):
    path = write(tmp_path / "A.toml", "[dataloader]\nworkers = 2\n")
    with pytest.raises(ConfigError, match=r"\[dataloader\] workers"):
        config.save_preset_text(path, "[dataloader]\nworkers = -1\n")
    assert path.read_text() == "[dataloader]\nworkers = 2\n"


def test_save_writes_atomically_and_keeps_the_mode(tmp_path):
    path = write(tmp_path / "presets" / "A.toml", "[dataloader]\nworkers = 2\n")
    path.chmod(0o640)
    with path.open() as reader:  # a reader of the old file never sees a half-written one
        preset = config.save_preset_text(path, "# safer\n[dataloader]\nworkers = 0\n")
        assert reader.read() == "[dataloader]\nworkers = 2\n"
    assert preset.dataloader.workers == 0 and preset.path == path
    assert path.read_text() == "# safer\n[dataloader]\nworkers = 0\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [p.name for p in path.parent.iterdir()] == ["A.toml"]


def test_new_preset_from_copies_comments_and_never_overwrites(tmp_path):
    dest_dir = tmp_path / "presets"
    dest_dir.mkdir()
    copy = config.new_preset_from(SHIPPED / "A.toml", dest_dir, "A2")
    assert copy.name == "A2" and copy.dataloader == load_preset("A").dataloader
    text = (dest_dir / "A2.toml").read_text()
    assert text.startswith("# Copied from A.toml.\n") and "# down from 4" in text
    with pytest.raises(ConfigError, match="already exists"):
        config.new_preset_from(SHIPPED / "B.toml", dest_dir / "A2.toml")
    with pytest.raises(ConfigError, match="name"):
        config.new_preset_from(SHIPPED / "B.toml", dest_dir, "bad name")


# --------------------------------------------------------------------------- job files


def test_ultralytics_job_fixture():
    job = load_job(DATA / "yolo-demo")
    job_dir = DATA / "yolo-demo"
    assert (job.name, job.kind, job.path) == ("yolo-demo", "ultralytics", job_dir / "trainctl.toml")
    assert job.ultralytics == {
        "model": "yolov8n.yaml",
        "data": str(job_dir / "data" / "synthetic.yaml"),
        "epochs": 50,
        "imgsz": 640,
        "batch": 16,
        "device": "0",
        "val": False,
    }
    assert (job.preset, job.fallback) == ("A", "B")
    assert job.deadline == dt.datetime(2025, 11, 28, 17, 0, tzinfo=dt.UTC).timestamp()
    assert (job.cost_per_hour, job.budget, job.currency) == (0.79, 150.0, "€")
    assert job.run_dir == job_dir / "runs" / "trainctl"
    assert job.max_restarts == 5 and job.host is None
    assert job.stall == {"startup_timeout": 900.0, "train_timeout": 120.0}
    assert job.load_preset().name == "A" and job.load_fallback().dataloader.workers == 0


@pytest.mark.parametrize(
    "value,seconds",
    [
        (None, 600.0),
        ("0", 0.0),
        ("90", 90.0),
        ("15s", 15.0),
        ('"15s"', 15.0),
        ('"10m"', 600.0),
        ('"1.5h"', 5400.0),
        ("2.5", 2.5),
    ],
)
def test_checkpoint_every(tmp_path, value, seconds):
    line = "" if value is None else f"checkpoint_every = {value}\n"
    if value == "15s":
        line = 'checkpoint_every = " 15s "\n'
    path = write(
        tmp_path / "trainctl.toml", f'kind = "ultralytics"\n{line}[ultralytics]\nmodel = "m"\ndata = "d"\n'
    )
    assert load_job(path).checkpoint_every == seconds


def test_command_job_fixture():
    job_dir = DATA / "generic"
    job = load_job(job_dir / "trainctl.toml")
    assert (job.name, job.kind) == ("resnet-ft", "command")
    assert job.command == ("python", "train.py", "--epochs", "30")
    assert job.resume_args == ("--resume", "{checkpoint}")
    assert job.deadline == dt.datetime(2025, 11, 28, 18, 0).timestamp()
    assert job.host == {"destination": "me@gpu-box", "workdir": "~/train"}
    assert (job.preset, job.fallback, job.max_restarts, job.currency) == (
        str(job_dir / "presets" / "fast.toml"),
        None,
        3,
        "$",
    )
    preset = job.load_preset()
    assert preset.args == ("--amp",) and preset.child_env()["TRAINCTL_WORKERS"] == "4"


def test_job_presets_are_found_next_to_the_job_first(tmp_path):
    write(tmp_path / "presets" / "A.toml", "[dataloader]\nworkers = 1\n")
    job_path = write(tmp_path / "job.toml", 'kind = "command"\ncommand = ["true"]\npreset = "A"\n')
    job = load_job(job_path)
    assert job.name == "job" and job.load_preset().dataloader.workers == 1
    assert job.load_preset("B").path == SHIPPED / "B.toml"


def test_a_bad_preset_of_a_job_is_refused_with_its_own_file(tmp_path):
    bad = write(tmp_path / "presets" / "X.toml", "[dataloader]\nworkers = -1\n")
    job_path = write(tmp_path / "trainctl.toml", 'kind = "command"\ncommand = ["true"]\nfallback = "X"\n')
    with pytest.raises(ConfigError) as info:
        load_job(job_path)
    assert (info.value.file, info.value.key) == (str(bad), "[dataloader] workers")


JOB_MISTAKES = {
    "missing kind": ('command = ["true"]\n', None, "kind", ['"ultralytics", "command"']),
    "bad kind": ('kind = "yolo"\n', 1, "kind", ['"ultralytics", "command"', '"yolo"']),
    "missing model": (
        'kind = "ultralytics"\n[ultralytics]\ndata = "d.yaml"\n',
        None,
        "[ultralytics] model",
        ["required", "model ="],
    ),
    "missing ultralytics section": ('kind = "ultralytics"\n', None, "[ultralytics]", ["model", "data"]),
    "empty command": ('kind = "command"\ncommand = []\n', 2, "command", ["must not be empty"]),
    "command missing": ('kind = "command"\n', None, "command", ["list of strings"]),
    "command as a string": (
        'kind = "command"\ncommand = "python train.py --lr 0.1"\n',
        2,
        "command",
        ['["python", "train.py", "--lr", "0.1"]'],
    ),
    "bad deadline": (
        'kind = "command"\ncommand = ["true"]\ndeadline = "next friday"\n',
        3,
        "deadline",
        ["ISO 8601", "2025-11-28T18:00", '"next friday"'],
    ),
    "bad name": (
        'name = "my run"\nkind = "command"\ncommand = ["true"]\n',
        1,
        "name",
        ["letters, digits, '.', '_' and '-'", '"my run"'],
    ),
    "unknown preset": (
        'kind = "command"\ncommand = ["true"]\npreset = "Z"\n',
        3,
        "preset",
        ['"Z"', "available: A, B"],
    ),
    "missing preset file": (
        'kind = "command"\ncommand = ["true"]\nfallback = "p/safe.toml"\n',
        3,
        "fallback",
        ["no such preset file"],
    ),
    "negative budget": ('kind = "command"\ncommand = ["true"]\nbudget = -5\n', 3, "budget", ["number >= 0"]),
    "negative restarts": (
        'kind = "command"\ncommand = ["true"]\nmax_restarts = -1\n',
        3,
        "max_restarts",
        ["integer >= 0"],
    ),
    "bad placeholder": (
        'kind = "command"\ncommand = ["true"]\nresume_args = ["--resume={ckpt}"]\n',
        3,
        "resume_args",
        ["{checkpoint}"],
    ),
    "unknown stall key": (
        'kind = "command"\ncommand = ["true"]\n[stall]\ntrain = 60\n',
        4,
        "[stall] train",
        ["startup_timeout, train_timeout, val_timeout"],
    ),
    "zero stall timeout": (
        'kind = "command"\ncommand = ["true"]\n[stall]\ntrain_timeout = 0\n',
        4,
        "[stall] train_timeout",
        ["number > 0"],
    ),
    "host without destination": (
        'kind = "command"\ncommand = ["true"]\n[host]\nworkdir = "/w"\n',
        None,
        "[host] destination",
        ["required", "user@gpu-box"],
    ),
    "workers in ultralytics": (
        'kind = "ultralytics"\n[ultralytics]\nmodel = "m.pt"\ndata = "d.yaml"\nworkers = 8\n',
        5,
        "[ultralytics] workers",
        ["[dataloader] workers"],
    ),
    "bad epochs": (
        'kind = "ultralytics"\n[ultralytics]\nmodel = "m.pt"\ndata = "d.yaml"\nepochs = 0\n',
        5,
        "[ultralytics] epochs",
        ["integer >= 1"],
    ),
    "command with ultralytics kind": (
        'kind = "ultralytics"\ncommand = ["x"]\n[ultralytics]\nmodel = "m"\ndata = "d"\n',
        2,
        "command",
        ['kind = "command"'],
    ),
    "bad checkpoint_every": (
        'kind = "ultralytics"\ncheckpoint_every = "10 minutes"\n[ultralytics]\nmodel = "m"\ndata = "d"\n',
        2,
        "checkpoint_every",
        ['"15s"', '"10m"', "0 = off"],
    ),
    "instrument for ultralytics": (
        'kind = "ultralytics"\ninstrument = false\n[ultralytics]\nmodel = "m.yaml"\ndata = "d.yaml"\n',
        2,
        "instrument",
        ['kind = "command"'],
    ),
    "instrument not a boolean": (
        'kind = "command"\ncommand = ["true"]\ninstrument = "no"\n',
        3,
        "instrument",
        ["true or false"],
    ),
    "spare not a boolean": (
        'kind = "command"\ncommand = ["true"]\nspare = "off"\n',
        3,
        "spare",
        ["true or false"],
    ),
    "unknown job key": (
        'kind = "command"\ncommand = ["true"]\nretries = 2\n',
        3,
        "retries",
        ["unknown key", "max_restarts"],
    ),
    "progress bad regex": (
        'kind = "command"\ncommand = ["true"]\n[progress]\npattern = "it (?P<batch>"\n',
        4,
        "[progress] pattern",
        ["not a valid regular expression"],
    ),
    "progress unknown group": (
        'kind = "command"\ncommand = ["true"]\n[progress]\n'
        "pattern = 'it (?P<batch>\\d+) (?P<speed>\\d+)'\n",
        4,
        "[progress] pattern",
        ["unknown group name(s) speed", "loss_<name>"],
    ),
    "progress without position": (
        'kind = "command"\ncommand = ["true"]\n[progress]\npattern = \'loss (?P<loss>[.\\d]+)\'\n',
        4,
        "[progress] pattern",
        ["(?P<batch>"],
    ),
    "progress losses not groups": (
        'kind = "command"\ncommand = ["true"]\n[progress]\n'
        "pattern = 'it (?P<batch>\\d+)'\nlosses = [\"acc\"]\n",
        5,
        "[progress] losses",
        ["acc: not a named group"],
    ),
    "progress without pattern": (
        'kind = "command"\ncommand = ["true"]\n[progress]\nlosses = []\n',
        None,
        "[progress] pattern",
        ["required"],
    ),
}


def test_spare_is_on_unless_the_job_says_false(tmp_path):
    on = load_job(write(tmp_path / "a.toml", 'kind = "command"\ncommand = ["true"]\n'))
    off = load_job(write(tmp_path / "b.toml", 'kind = "command"\ncommand = ["true"]\nspare = false\n'))
    assert (on.spare, off.spare) == (True, False)


def test_progress_table_is_read_into_the_job(tmp_path):
    path = write(
        tmp_path / "trainctl.toml",
        'kind = "command"\ncommand = ["true"]\n[progress]\n'
        "pattern = 'E(?P<epoch>\\d+) it (?P<batch>\\d+)/(?P<batches>\\d+) acc=(?P<acc>[.\\d]+)'\n"
        'losses = ["acc"]\n',
    )
    job = load_job(path)
    assert job.progress == {
        "pattern": r"E(?P<epoch>\d+) it (?P<batch>\d+)/(?P<batches>\d+) acc=(?P<acc>[.\d]+)",
        "losses": ["acc"],
    }


@pytest.mark.parametrize("text,line,key,allowed", JOB_MISTAKES.values(), ids=JOB_MISTAKES.keys())
def test_each_job_mistake_names_file_key_and_what_is_allowed(tmp_path, text, line, key, allowed):
    path = write(tmp_path / "trainctl.toml", text)
    with pytest.raises(ConfigError) as info:
        load_job(path)
    [problem] = info.value.problems
    assert (problem.file, problem.key, problem.line) == (str(path), key, line)
    assert str(problem).startswith(f"{path}: {key}: ")
    for fragment in allowed:
        assert fragment in problem.message
    assert [str(p) for p in config.job_problems(text, path)] == [str(problem)]


def test_default_job_name_is_the_directory_made_safe(tmp_path):
    path = write(tmp_path / "my run (v2)" / "trainctl.toml", 'kind = "command"\ncommand = ["true"]\n')
    assert load_job(path.parent).name == "my-run-v2"


def test_missing_job_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_job(tmp_path / "nope.toml")


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    "text,expected",
    [
        ("2025-11-28T18:00", dt.datetime(2025, 11, 28, 18, 0).timestamp()),
        ("2025-11-28 18:00:30", dt.datetime(2025, 11, 28, 18, 0, 30).timestamp()),
        ("2025-11-28T17:00:00Z", dt.datetime(2025, 11, 28, 17, tzinfo=dt.UTC).timestamp()),
        ("2025-11-28T18:00+01:00", dt.datetime(2025, 11, 28, 17, tzinfo=dt.UTC).timestamp()),
        ("2025-11-28", dt.datetime(2025, 11, 28).timestamp()),
        (dt.date(2025, 11, 28), dt.datetime(2025, 11, 28).timestamp()),
    ],
)
def test_parse_deadline(text, expected):
    assert config.parse_deadline(text) == expected


@pytest.mark.parametrize("bad", ["tomorrow", "28/11/2025", "", dt.time(18, 0)])
def test_parse_deadline_refuses_with_an_example(bad):
    with pytest.raises(ValueError, match="ISO 8601.*2025-11-28T18:00"):
        config.parse_deadline(bad)


def test_expand_resume_args():
    args = ("--resume", "{checkpoint}", "--note={{x}}")
    assert config.expand_resume_args(args, Path("/r/last.pt")) == ("--resume", "/r/last.pt", "--note={x}")
    assert config.expand_resume_args(args, None) == ()
    assert config.expand_resume_args(("--resume",), None) == ("--resume",)


def test_a_runner_kind_is_one_entry_in_the_job_tables(tmp_path, monkeypatch):
    """A kind added to JOB_TABLES is accepted with its own keys and section; the other
    kinds' keys are refused for it, and its own are refused for the others."""

    def parse(p, data, table, job_dir):
        nproc = p.int_("torchrun", "nproc", table.get("nproc", 1), 1) if table is not None else 1
        return {"command": tuple(data.get("command", ())), "settings": {"nproc": nproc}}

    entry = config.JobTable(parse, keys=("command",), section="torchrun")
    monkeypatch.setitem(config.JOB_TABLES, "torchrun", entry)
    job = load_job(
        write(tmp_path / "t.toml", 'kind = "torchrun"\ncommand = ["train.py"]\n[torchrun]\nnproc = 4\n')
    )
    assert (job.kind, job.command, job.settings, job.ultralytics) == (
        "torchrun",
        ("train.py",),
        {"nproc": 4},
        {},
    )
    problems = config.job_problems(
        'kind = "torchrun"\nresume_args = ["--r"]\n[torchrun]\nnproc = 0\n', tmp_path / "t.toml"
    )
    assert [(e.key, e.message) for e in problems] == [
        ("resume_args", 'only for kind = "command"'),
        ("[torchrun] nproc", "must be an integer >= 1 (got 0)"),
    ]
    problems = config.job_problems(
        'kind = "ultralytics"\ncommand = ["x"]\n[ultralytics]\nmodel = "m"\ndata = "d"\n[torchrun]\n',
        tmp_path / "t.toml",
    )
    assert [(e.key, e.message) for e in problems] == [
        ("command", 'only for kind = "command" or "torchrun"; use [ultralytics] model and data'),
        ("[torchrun]", 'only for kind = "torchrun"'),
    ]
    assert '"torchrun"' in config.job_problems('kind = "yolo"\n', tmp_path / "t.toml")[0].message


def test_config_error_is_an_exception_with_fields():
    err = ConfigError("presets/A.toml", "[threads] omp_num_threads", "must be an integer >= 1 (got 0)")
    assert isinstance(err, Exception) and err.line is None and err.problems == (err,)
    assert str(err) == "presets/A.toml: [threads] omp_num_threads: must be an integer >= 1 (got 0)"
    assert str(ConfigError("", "preset", 'no preset named "Z"')) == 'preset: no preset named "Z"'


def test_the_readme_job_file_example_is_a_valid_job(tmp_path):
    """The job file example (docs/job-file.md) loads as written (with the project's presets beside it)."""
    root = Path(__file__).resolve().parents[2]
    readme = (root / "docs" / "job-file.md").read_text(encoding="utf-8")
    example = readme.split("## Job file", 1)[1].split("```toml", 1)[1].split("```", 1)[0]
    (tmp_path / "presets").mkdir()
    for name in ("A.toml", "B.toml"):
        (tmp_path / "presets" / name).write_text((root / "src" / "trainctl" / "presets" / name).read_text())
    (tmp_path / "trainctl.toml").write_text(example)
    job = load_job(tmp_path / "trainctl.toml")
    assert (job.kind, job.name, job.preset, job.fallback) == ("ultralytics", "yolo-boxes", "A", "B")
    assert job.host == {
        "destination": "me@gpu-box",
        "workdir": "~/trainctl",
        "setup": "source ~/venv/bin/activate",
    }
    assert job.stall == {
        "train_timeout": 120.0,
        "startup_timeout": 900.0,
        "startup_idle": 90.0,
        "silence_floor": 60.0,
    }
    assert job.load_preset().dataloader.workers == 2 and job.load_fallback().dataloader.workers == 0


def test_stall_startup_idle_and_silence_floor_are_job_settings(tmp_path):
    path = tmp_path / "trainctl.toml"
    path.write_text('kind = "command"\ncommand = ["true"]\n[stall]\nstartup_idle = 10\nsilence_floor = 5\n')
    assert load_job(path).stall == {"startup_idle": 10.0, "silence_floor": 5.0}
    path.write_text('kind = "command"\ncommand = ["true"]\n[stall]\nstartup_idle = 0\n')
    with pytest.raises(ConfigError, match="startup_idle"):
        load_job(path)
