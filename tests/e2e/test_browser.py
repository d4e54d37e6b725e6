"""The browser fixture itself (tests/e2e/browser.py): a real headless Chromium lays out a page,
and a request that would leave the machine is aborted and listed, so the tests that assert "no
network request" (the served dashboard, the report) can trust an empty ``external``."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e


def test_browser_page_lays_out_and_lists_external_requests(browser_page, tmp_path):
    page_file = tmp_path / "page.html"
    page_file.write_text(
        "<html><body><svg id='chart' width='120' height='40'><rect width='60' height='20'/></svg>"
        "<img src='https://example.com/pixel.png'></body></html>"
    )
    browser_page.page.goto(page_file.as_uri())
    box = browser_page.page.locator("#chart").bounding_box()
    assert box is not None and (box["width"], box["height"]) == (120, 40)
    assert browser_page.external == ["https://example.com/pixel.png"]
    assert browser_page.requests[0] == page_file.as_uri()
