"""Issue 28, item 7: the CLI as a newcomer meets it.  `--help` lists no internal command and
shows the one exit-code table the README holds; presets are listed, validated and edited
without breaking the table or touching the shipped files; a closed pipe ends every command
quietly; `alerts test URL` says the URL once.

Real `python -m trainctl` processes (and `cli.main` in this process where the output alone is
looked at); private config and runs directories (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import PYTHON, ROOT
from trainctl.cli import main as cli
from trainctl.cli import parser

pytestmark = pytest.mark.e2e


def test_help_hides_internal_commands_and_shows_the_readme_exit_codes(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "SUPPRESS" not in out
    for hidden in parser.HIDDEN_COMMANDS:  # neither in the {...} list nor a line of its own
        assert f",{hidden}" not in out and f"\n    {hidden} " not in out, hidden
    for shown in ("run", "demo", "attach", "status", "ls", "report", "presets", "scan", "ctl", "alerts"):
        assert f"\n    {shown} " in out, shown
    assert parser.EXIT_CODES in out
    readme = (ROOT / "docs" / "cli.md").read_text()
    assert f"```text\n{parser.EXIT_CODES}\n```" in readme  # the same table, every code (3 too)
    for code in ("0", "1", "2", "3", "4", "5", "130", "141"):
        assert f"\n  {code} " in "\n" + parser.EXIT_CODES, code


def test_presets_list_validate_and_edit_a_copy(tmp_path, monkeypatch, capsys):
    work = tmp_path / "project"
    (work / "presets").mkdir(parents=True)
    (work / "presets" / "bad.toml").write_text('name = "x"\n[dataloader]\nworkers = "two"\n')
    (work / "presets" / "mine.toml").write_text('description = "my own"\n[dataloader]\nworkers = 1\n')
    monkeypatch.chdir(work)

    assert cli.main(["presets", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "FILE", "WHAT"]
    rows = {ln.split()[0]: ln for ln in lines[1:]}
    assert set(rows) == {"A", "B", "bad", "mine"}, lines  # one line each: the table holds
    assert "INVALID (2 problems: trainctl presets validate presets/bad.toml)" in rows["bad"]
    assert rows["mine"].endswith("my own")
    col = lines[0].index("FILE")
    assert all(ln[col - 2 : col] == "  " and ln[col] != " " for ln in lines), lines

    assert cli.main(["presets", "validate"]) == 2  # no name: every preset, bad too
    out, err = capsys.readouterr()
    assert out.count(": ok") == 3 and "bad.toml" in err and "workers" in err

    shipped = ROOT / "src" / "trainctl" / "presets" / "A.toml"
    before = shipped.read_bytes()
    monkeypatch.setenv("VISUAL", "")
    monkeypatch.setenv("EDITOR", f"{PYTHON} -c \"import sys; open(sys.argv[1], 'a').write('# edited\\n')\"")
    assert cli.main(["presets", "edit", "A"]) == 0
    copy = Path(os.environ["TRAINCTL_CONFIG_DIR"]) / "presets" / "A.toml"
    out, err = capsys.readouterr()
    assert shipped.read_bytes() == before  # the checkout's file is untouched
    assert copy.read_bytes() == before + b"# edited\n"
    assert f"{copy}: ok" in out and "shipped with trainctl" in err
    assert cli.main(["presets", "show", "A"]) == 0  # the copy is the one found now
    assert capsys.readouterr().out.startswith(f"# {copy}\n")


def _closed_pipe_run(args: list[str], cwd) -> subprocess.Popen:
    """`trainctl ARGS` with stdout a pipe whose reader has already gone."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.Popen(
            [PYTHON, "-m", "trainctl", *args],
            cwd=cwd,
            stdout=w,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
    finally:
        os.close(w)


def test_every_command_ends_quietly_on_a_closed_pipe(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(
        "".join(f"epoch 1/2 {i}/900 loss=0.5\n" for i in range(900))
        + "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    commands = [
        ["--help"],
        ["--version"],
        ["presets", "list"],
        ["presets", "show", "A"],
        ["presets", "validate"],
        ["scan", str(log)],
        ["scan", "--explain", str(log)],
        ["scan", "--json", str(log)],
        ["ls", "--here"],
        ["ls", "--here", "--json"],
        ["status", "--help"],
    ]
    procs = [(c, _closed_pipe_run(c, tmp_path)) for c in commands]
    for c, p in procs:
        err = p.stderr.read().decode()
        code = p.wait(60)
        assert err == "" and code in (0, 141), (c, code, err)


def test_alerts_test_says_a_url_once(tmp_path):
    r = subprocess.run(
        [PYTHON, "-m", "trainctl", "alerts", "test", "json://127.0.0.1:9/hook"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1, r
    assert r.stdout.count("json://127.0.0.1:9/") == 1 and "NOT accepted" in r.stdout, r.stdout
