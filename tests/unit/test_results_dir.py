"""Issue 28, item 7: where a run's results go (Ultralytics' ``save_dir``).  A script that names
no project never writes into trainctl's checkout (Ultralytics takes its runs_dir from the git
checkout above its own package: the in-repo venv's); the results directory is the run's, in
its view and snapshot, and no warning row."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainctl.core import events as E
from trainctl.core.runview import RunView


class Model:
    task = "detect"


@pytest.fixture
def settings(monkeypatch):
    pytest.importorskip("ultralytics")
    from ultralytics.utils import SETTINGS

    from trainctl.inside import ultralytics as integ

    checkout = Path(integ.__file__).resolve().parents[3]  # src/trainctl/inside -> the checkout
    monkeypatch.setitem(SETTINGS, "runs_dir", str(checkout / "runs"))  # a private settings file
    return SETTINGS, checkout


def test_a_script_with_no_project_writes_to_its_cwd_or_the_run_dir_never_the_checkout(settings, tmp_path):
    from trainctl.inside.ultralytics import code_checkouts, place_results

    values, checkout = settings
    if checkout not in code_checkouts():
        pytest.skip("trainctl is not run from a git checkout here")
    run_dir = tmp_path / "run"
    kw: dict = {}
    place_results(Model(), kw, run_dir, cwd=tmp_path / "work")  # runs_dir: the checkout's
    assert kw["project"] == str((tmp_path / "work").resolve() / "runs" / "detect")
    kw = {"project": "exp"}  # relative: under it
    place_results(Model(), kw, run_dir, cwd=tmp_path / "work")
    assert kw["project"] == str((tmp_path / "work").resolve() / "runs" / "detect" / "exp")
    kw = {}
    place_results(Model(), kw, run_dir, cwd=checkout / "examples")  # started inside the checkout
    assert kw["project"] == str(run_dir / "runs" / "detect")
    kw = {"project": str(tmp_path / "mine")}  # the script's own: kept
    place_results(Model(), kw, run_dir, cwd=checkout)
    assert kw == {"project": str(tmp_path / "mine")}
    values["runs_dir"] = str(tmp_path / "my-runs")  # the user's setting: kept
    kw = {}
    place_results(Model(), kw, run_dir, cwd=checkout)
    assert kw == {}


def test_the_results_dir_is_the_runs_not_a_warning_and_survives_a_snapshot():
    view = RunView()
    view.apply_all(
        [
            E.Info(1.0, "integration attached: ultralytics 8.4.1", "instrument.attached.ultralytics"),
            E.results_info(2.0, "/home/me/proj/runs/detect/train"),
        ]
    )
    assert view.save_dir == "/home/me/proj/runs/detect/train"
    assert [w.id for w in view.warning_rows()] == ["instrument.attached.ultralytics"]
    again = RunView()
    again.load_dict(view.to_dict())
    assert again.save_dir == view.save_dir
    old = view.to_dict()
    del old["save_dir"]  # a snapshot from before it
    again.load_dict(old)
    assert again.save_dir is None
    assert E.results_path(E.Info(3.0, "results in /x", "other.key")) is None
