"""A real headless Chromium for the e2e tests, driven by Playwright.

    def test_x(browser_page):             # the fixture (tests/e2e/conftest.py)
        browser_page.page.goto(url)       # a playwright.sync_api.Page
        assert browser_page.external == [] # nothing left the machine

The browser is the distribution's Chromium (`apt-get install chromium`; .ci/install-chromium.sh),
launched through Playwright with ``executable_path``: Playwright's own browser download is never
used (it needs its CDN).  ``TRAINCTL_CHROMIUM`` names another binary.  Without a Chromium the test
is skipped with the reason, unless TRAINCTL_REQUIRE_BROWSER=1 (CI) makes that a failure.

Every request the page makes is recorded (``requests``); one to a host other than the loopback
or a ``file:``/``data:`` URL is aborted and listed in ``external``: a page under test must work
with no network, and a test can assert that it asked for none.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Page, Route

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}


def find_chromium() -> str | None:
    """The Chromium binary: TRAINCTL_CHROMIUM, else the first of CANDIDATES on PATH."""
    named = os.environ.get("TRAINCTL_CHROMIUM")
    if named:
        return named if os.access(named, os.X_OK) else None
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def require_browser() -> str:
    """The Chromium binary, or skip (fail under TRAINCTL_REQUIRE_BROWSER=1) with the reason."""
    chromium = find_chromium()
    reason = "Chromium not installed (run .ci/install-chromium.sh, or `apt-get install chromium`)"
    if chromium is not None:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            reason = "the Python package playwright is missing (pip install -e '.[test]')"
        else:
            return chromium
    if os.environ.get("TRAINCTL_REQUIRE_BROWSER") == "1":
        pytest.fail(reason + " and TRAINCTL_REQUIRE_BROWSER=1", pytrace=False)
    pytest.skip(reason)


def is_local(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("file", "data", "blob", "about") or parts.hostname in LOCAL_HOSTS


@dataclass
class BrowserPage:
    """One page of a fresh headless Chromium, and every request it made."""

    page: Page
    requests: list[str] = field(default_factory=list)
    external: list[str] = field(default_factory=list)  # aborted: not the loopback, not a file

    def _route(self, route: Route) -> None:
        url = route.request.url
        self.requests.append(url)
        if is_local(url):
            route.continue_()
        else:
            self.external.append(url)
            route.abort("internetdisconnected")


@contextmanager
def headless_page(width: int = 1280, height: int = 800) -> Iterator[BrowserPage]:
    """A page of a headless Chromium; the browser and Playwright's driver end when this does."""
    chromium = require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium,
            headless=True,
            # a container's /dev/shm is small, and CI runs as root (no user namespaces for the sandbox)
            args=["--disable-dev-shm-usage", "--no-sandbox"],
        )
        try:
            context = browser.new_context(viewport={"width": width, "height": height})
            page = context.new_page()
            bp = BrowserPage(page)
            context.route("**/*", bp._route)
            yield bp
        finally:
            browser.close()
