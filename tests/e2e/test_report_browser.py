"""`trainctl report`'s page in a real headless Chromium (the browser_page fixture): its charts
are laid out (the SVG elements are there and sized) and it asks the network for nothing."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import run_trainctl
from tests.unit.test_report import HOSTILE, write_run

pytestmark = pytest.mark.e2e


def test_the_report_renders_its_charts_and_makes_no_request(browser_page, tmp_path):
    run_dir = write_run(tmp_path / "run", job="yolo " + HOSTILE, text=HOSTILE)
    res = run_trainctl(["report", str(run_dir)], timeout=60)
    assert res.returncode == 0, res.describe()
    page_file = run_dir / "report.html"
    page = browser_page.page
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(page_file.as_uri())
    charts = page.locator("svg.chart")
    assert charts.count() >= 4  # the goodput bar, losses, rate, projected end
    for i in range(charts.count()):
        box = charts.nth(i).bounding_box()
        assert box is not None and box["width"] > 100 and box["height"] > 20, (i, box)
    lines = page.locator("svg.chart polyline")
    assert lines.count() >= 4 and all(lines.nth(i).bounding_box()["width"] > 0 for i in range(lines.count()))
    assert page.locator("svg.chart line.mark").count() >= 2  # the stall and the restart, on the time axis
    assert "<script>alert(1)</script>" in page.locator("h1").inner_text()  # shown as text, not run
    assert dialogs == [] and page.locator("script").count() == 0
    assert browser_page.requests == [page_file.as_uri()] and browser_page.external == []
