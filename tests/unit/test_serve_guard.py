"""`trainctl serve`'s web server without a browser or a run (src/trainctl/tui/serve.py): every
URL without the token is refused, the page it serves names nothing off the server and builds
its websocket's address from the one the browser used (an `ssh -L` on another local port).
The browser, a real run and the dashboard processes: tests/e2e/test_serve.py."""

from __future__ import annotations

import re

import pytest
from aiohttp.test_utils import TestClient, TestServer

from trainctl.tui.serve import DashboardServer

TOKEN = "tok_EN-0123456789abcdefghij"


@pytest.fixture
async def client():
    server = DashboardServer(["true"], title="trainctl: <run & co>", token=TOKEN, host="127.0.0.1", port=0)
    async with TestClient(TestServer(server.app())) as c:
        yield c


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/ws",
        "/static/js/textual.js",
        "/favicon.ico",
        f"/{TOKEN[:-1]}/",
        f"/{TOKEN}x/",
        f"/{TOKEN[:-1]}/static/js/textual.js",
        f"/x/{TOKEN}/",
        f"/{TOKEN.upper()}/",
    ],
)
async def test_without_the_token_every_url_is_refused(client, path):
    response = await client.get(path, allow_redirects=False)
    assert response.status == 403
    assert TOKEN not in await response.text()
    assert response.headers["Cache-Control"] == "no-store"


async def test_with_the_token_the_page_and_its_files(client):
    moved = await client.get(f"/{TOKEN}", allow_redirects=False)
    assert moved.status == 302 and moved.headers["Location"] == f"/{TOKEN}/"
    page = await client.get(f"/{TOKEN}/", headers={"Host": "127.0.0.1:9000"})
    assert page.status == 200
    assert page.headers["Cache-Control"] == "no-store" and page.headers["Referrer-Policy"] == "no-referrer"
    html = await page.text()
    assert f'data-session-websocket-url="ws://127.0.0.1:9000/{TOKEN}/ws"' in html
    assert "trainctl: &lt;run &amp; co&gt;" in html  # the title escaped
    # Every URL the page names is relative (under the token) or the websocket's: no CDN.
    urls = re.findall(r'(?:href|src)="([^"]+)"|url\("([^"]+)"\)', html)
    assert urls and all(not (a or b).startswith(("http:", "https:", "//")) for a, b in urls), urls
    for a, b in urls:
        asset = await client.get(f"/{TOKEN}/{a or b}")
        assert asset.status == 200, a or b
    assert (await client.get(f"/{TOKEN}/static/")).status in (403, 404)  # no listing
