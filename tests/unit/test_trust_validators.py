"""Issue 27: the validators at each input, as pure functions (the e2e side is
tests/e2e/test_trust_boundary.py): the trust walk of a path, side-channel events against
their schema, spec.json, control characters in config files, user patterns in RE2."""

from __future__ import annotations

import os
import stat
import time

import pytest

from trainctl.config import preset_problems
from trainctl.config.job import job_problems
from trainctl.core import events as E
from trainctl.core.user_pattern import PatternError, compile_user_pattern
from trainctl.store.paths import (
    UnsafePathError,
    make_trusted_parents,
    read_private,
    trusted_run_dir,
    write_private,
)
from trainctl.store.spec import RunSpec, SpecError


# ---------------------------------------------------------------- the trust walk of a path
def test_a_run_directory_under_a_shared_writable_parent_is_not_trusted(tmp_path):
    run = tmp_path / "shared" / "run"
    run.mkdir(parents=True, mode=0o700)
    assert trusted_run_dir(run) == run
    os.chmod(tmp_path / "shared", 0o777)
    with pytest.raises(UnsafePathError, match="shared: writable by group or others"):
        trusted_run_dir(run)
    os.chmod(tmp_path / "shared", 0o1777)  # sticky, as /tmp: nobody else replaces ours
    assert trusted_run_dir(run) == run
    os.chmod(run, 0o770)  # the run directory itself: never shared
    with pytest.raises(UnsafePathError, match="writable by group"):
        trusted_run_dir(run)


def test_a_parent_writable_only_by_the_users_private_group_is_trusted(tmp_path):
    """umask 002 with user private groups (Debian): ~/.local 0775, group = the user alone."""
    import grp
    import pwd

    me = pwd.getpwuid(os.geteuid())
    mine = grp.getgrgid(me.pw_gid)
    if mine.gr_name != me.pw_name or any(m != me.pw_name for m in mine.gr_mem):
        pytest.skip(f"the user's primary group {mine.gr_name} is not a private one")
    run = tmp_path / "home" / "run"
    run.mkdir(parents=True, mode=0o700)
    os.chown(tmp_path / "home", -1, me.pw_gid)
    os.chmod(tmp_path / "home", 0o775)
    assert trusted_run_dir(run) == run
    shared = next((g for g in grp.getgrall() if g.gr_gid != me.pw_gid), None)
    if shared is None or os.geteuid() != 0:
        return  # (chown to another group needs root or membership)
    os.chown(tmp_path / "home", -1, shared.gr_gid)  # a group others may be in
    with pytest.raises(UnsafePathError, match="chmod go-w"):
        trusted_run_dir(run)


def test_links_are_followed_as_the_kernel_does_and_checked_on_the_way(tmp_path):
    real = tmp_path / "real" / "run"
    real.mkdir(parents=True)
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    (tmp_path / "latest").symlink_to(real)
    assert trusted_run_dir(tmp_path / "alias" / "run") == real
    assert trusted_run_dir(tmp_path / "latest") == real
    os.chmod(tmp_path / "real", 0o777)  # the link leads through a shared directory
    with pytest.raises(UnsafePathError, match="real: writable"):
        trusted_run_dir(tmp_path / "alias" / "run")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(UnsafePathError, match="too many levels"):
        trusted_run_dir(loop / "run")


def test_missing_parents_are_made_private_and_a_shared_one_stops_it(tmp_path):
    target = tmp_path / "a" / "b" / "run"
    make_trusted_parents(target)
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o700 and not target.exists()
    os.chmod(tmp_path / "a", 0o777)
    with pytest.raises(UnsafePathError, match="writable by group or others"):
        make_trusted_parents(tmp_path / "a" / "c" / "run")
    assert not (tmp_path / "a" / "c").exists()


def test_files_are_written_0600_whatever_the_umask_and_read_only_when_private(tmp_path):
    old = os.umask(0)
    try:
        write_private(tmp_path / "f.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f.json").stat().st_mode) == 0o600
    assert read_private(tmp_path / "f.json") == "{}"
    os.chmod(tmp_path / "f.json", 0o666)
    with pytest.raises(UnsafePathError, match="writable by group or others"):
        read_private(tmp_path / "f.json")
    (tmp_path / "link.json").symlink_to(tmp_path / "f.json")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        read_private(tmp_path / "link.json")


# ---------------------------------------------------------------- side-channel events
@pytest.mark.parametrize(
    "line,field",
    [
        (
            '{"type": "progress", "ts": 1, "epoch": "x", "epochs": 4, "batch": 1, "batches": 2}',
            "progress.epoch",
        ),
        (
            '{"type": "progress", "ts": 1, "epoch": true, "epochs": 4, "batch": 1, "batches": 2}',
            "progress.epoch",
        ),
        (
            '{"type": "progress", "ts": 1, "epoch": 1, "epochs": 4, "batch": 1, "batches": 2, "losses": {"l": "a"}}',
            "progress.losses",
        ),
        ('{"type": "checkpoint", "ts": 1, "path": 5}', "checkpoint.path"),
        ('{"type": "checkpoint", "ts": 1}', "path"),
        ('{"type": "info", "ts": "now", "text": "x"}', "info.ts"),
        ('{"type": ["x"], "ts": 1}', "unhashable"),
        ("[1, 2]", "not a JSON object"),
        ('{"type": "nope", "ts": 1}', "unknown event type"),
    ],
)
def test_a_side_event_that_does_not_fit_its_schema_is_named(line, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        E.decode_checked(line)


def test_well_typed_side_events_pass_as_they_are():
    ev = E.decode_checked(
        '{"type": "progress", "ts": 1.5, "epoch": 1, "epochs": 4, "batch": null, '
        '"batches": null, "losses": {"loss": "nan"}, "rate": 2}'
    )
    assert ev.epoch == 1 and ev.losses["loss"] != ev.losses["loss"]  # NaN survives
    for event in (
        E.Start(1.0, 1, 42, None, ("python", "t.py")),
        E.Exit(2.0, None, "SIGKILL"),
        E.Stall(3.0, "train", 9.0, "spin", ranks=(1,)),
        E.Projection(4.0, *[None] * 6),
    ):
        assert E.decode_checked(E.encode(event)) == event


# ---------------------------------------------------------------- spec.json
@pytest.mark.parametrize(
    "data,says",
    [
        ([1, 2], "not a run spec"),
        ({"job_name": "j", "kind": "command", "command": "rm -rf"}, "command: must be a list of strings"),
        ({"job_name": "j", "kind": "command", "max_restarts": True}, "max_restarts: must be an integer"),
        (
            {"job_name": "j", "kind": "command", "stall": {"train_timeout": "x"}},
            "stall: must be an object of numbers",
        ),
        ({"kind": "command"}, "job_name: missing"),
    ],
)
def test_a_spec_that_is_not_one_is_one_line(data, says):
    with pytest.raises(SpecError, match=says):
        RunSpec.from_dict(data)


def test_a_saved_spec_loads_back_and_a_bad_file_is_a_spec_error(tmp_path):
    spec = RunSpec(job_name="j", kind="command", command=["true"], stall={"train_timeout": 5.0})
    spec.save(tmp_path / "spec.json")
    assert RunSpec.load(tmp_path / "spec.json") == spec
    (tmp_path / "spec.json").write_text("{not json")
    with pytest.raises(SpecError, match="not JSON"):
        RunSpec.load(tmp_path / "spec.json")


# ---------------------------------------------------------------- config strings
def test_control_characters_anywhere_in_a_preset_are_refused_by_name():
    problems = [
        p.describe()
        for p in preset_problems(
            'description = "two\\nlines are fine"\nargs = ["--a\\u001b[31m"]\n'
            '[env]\nFOO = "a\\u0000b"\nTAB = "a\\tb"\nPEM = "line1\\nline2"\nCR = "a\\rb"\n',
            "p.toml",
        )
    ]
    assert sorted(problems) == [
        "p.toml: [env] CR: holds a control character (U+000D): not allowed in a value",
        "p.toml: [env] FOO: holds a control character (U+0000): not allowed in a value",
        "p.toml: args[0]: holds a control character (U+001B): not allowed in a value",
    ]


def test_control_characters_in_a_job_are_refused(tmp_path):
    text = 'kind = "command"\ncommand = ["python", "t\\u0000.py"]\n'
    assert [p.key for p in job_problems(text, tmp_path / "trainctl.toml")] == ["command[1]"]


# ---------------------------------------------------------------- user patterns in RE2
def test_a_catastrophic_pattern_matches_in_linear_time():
    up = compile_user_pattern(r"^(?P<batch>\d*)(a+)+$")
    t0 = time.perf_counter()
    for n in (26, 1000, 100_000):
        assert up.read("a" * n + "!") is None
    assert time.perf_counter() - t0 < 2.0  # a backtracking engine: hours for n = 40 already
    assert up.read("12aaa").batch == 12


@pytest.mark.parametrize(
    "pattern", [r"(?P<batch>\d+) \1", r"(?=step)(?P<batch>\d+)", r"(?<!x)(?P<batch>\d+)"]
)
def test_a_pattern_re2_cannot_match_in_linear_time_is_refused_saying_why(pattern):
    with pytest.raises(PatternError, match="RE2.*no backreferences, no lookaround"):
        compile_user_pattern(pattern)
