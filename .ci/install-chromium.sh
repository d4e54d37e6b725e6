#!/bin/sh
# Install what the browser end-to-end tests need: the distribution's Chromium (Debian:
# `chromium`). Idempotent and quiet; uses sudo when not root. Playwright (the `test` extra)
# drives it through its executable_path; Playwright's own browser download is never used.
# Then run the tests with TRAINCTL_REQUIRE_BROWSER=1 (tests/e2e/browser.py).
set -eu

have_chromium() {
    command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1
}

if ! have_chromium; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        SUDO="sudo"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq >/dev/null
    $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi

have_chromium || { echo "install-chromium.sh: chromium still missing" >&2; exit 1; }
