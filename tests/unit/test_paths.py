"""Run-directory safety (issue 14, 5): new and private, never chmodded when not ours, files
opened without following links, names checked."""

from __future__ import annotations

import os
import stat

import pytest

from trainctl.core.events import Info
from trainctl.store.journal import Journal
from trainctl.store.paths import (
    MAX_NAME,
    BadNameError,
    UnsafePathError,
    check_name,
    check_run_dir,
    create_run_dir,
    make_private_dir,
    open_private,
)


def mode(p):
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_create_run_dir_is_new_and_private(tmp_path):
    d = create_run_dir(tmp_path / "a" / "run")
    assert mode(d) == 0o700
    with pytest.raises(UnsafePathError, match="already exists"):
        create_run_dir(d)


def test_make_private_dir_never_chmods_a_directory_it_did_not_make(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp
    with pytest.raises(UnsafePathError, match="writable by group or others"):
        make_private_dir(shared)
    assert mode(shared) == 0o1777
    os.chmod(shared, 0o755)
    assert make_private_dir(shared) == shared and mode(shared) == 0o755
    made = make_private_dir(tmp_path / "new")
    assert mode(made) == 0o700


def test_check_run_dir(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    assert check_run_dir(empty) == empty
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "events.jsonl").write_text("")
    (run / "other").write_text("")
    assert check_run_dir(run) == run
    stuff = tmp_path / "stuff"
    stuff.mkdir(mode=0o700)
    (stuff / "notes.txt").write_text("x")
    with pytest.raises(UnsafePathError, match="not empty and not a trainctl run"):
        check_run_dir(stuff)
    (stuff / "events.jsonl").symlink_to(stuff / "notes.txt")  # a link is no marker
    with pytest.raises(UnsafePathError, match="not empty"):
        check_run_dir(stuff)
    os.chmod(empty, 0o770)
    with pytest.raises(UnsafePathError, match="writable by group"):
        check_run_dir(empty)
    link = tmp_path / "link"
    link.symlink_to(run)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        check_run_dir(link)
    with pytest.raises(UnsafePathError, match="not a directory"):
        check_run_dir(run / "other")
    with pytest.raises(UnsafePathError, match="no such directory"):
        check_run_dir(tmp_path / "missing")
    if os.geteuid() != 0 and os.path.isdir("/") and os.stat("/").st_uid != os.geteuid():
        with pytest.raises(UnsafePathError, match="not by you"):
            check_run_dir("/")


def test_open_private_creates_exclusively_and_refuses_links(tmp_path):
    p = tmp_path / "f"
    fd = open_private(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    os.close(fd)
    assert mode(p) == 0o600
    with pytest.raises(FileExistsError):
        open_private(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    os.close(open_private(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND))  # reopen: ours
    target = tmp_path / "victim"
    target.write_text("keep")
    planted = tmp_path / "planted"
    planted.symlink_to(target)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        open_private(planted, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    with pytest.raises(FileExistsError):
        open_private(planted, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    assert target.read_text() == "keep"
    os.chmod(p, 0o666)
    with pytest.raises(UnsafePathError, match="writable by group or others"):
        open_private(p, os.O_WRONLY | os.O_APPEND)


def test_journal_refuses_a_planted_link_and_reopens_its_own(tmp_path):
    target = tmp_path / "victim"
    target.write_text("")
    (tmp_path / "events.jsonl").symlink_to(target)
    with pytest.raises(UnsafePathError):
        Journal(tmp_path / "events.jsonl")
    run = tmp_path / "run"
    run.mkdir()
    j = Journal(run / "events.jsonl")
    j.append(Info(ts=1.0, text="a"))
    j.close()
    j = Journal(run / "events.jsonl")  # an adopting agent goes on counting
    assert j.next_seq == 1
    j.close()


@pytest.mark.parametrize(
    "name",
    [
        "..",
        ".",
        "a/b",
        "../x",
        "-rf",
        ".hidden",
        "a\x1b]0;t\x07",
        "tab\tname",
        "x" * (MAX_NAME + 1),
        "",
        "a..b",
        "a\\b",
    ],
)
def test_check_name_refuses(name):
    with pytest.raises(BadNameError) as e:
        check_name(name, "job name")
    assert str(e.value).startswith("job name")
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("name", ["yolo-boxes", "a.b", "run_2", "x" * MAX_NAME, "ĳob"])
def test_check_name_accepts(name):
    assert check_name(name) == name
