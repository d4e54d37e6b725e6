#!/bin/sh
# Install the old stack the seeds' box trained on: Debian's python3-torch (1.13.1, for the
# system Python 3.11 at /usr/bin/python3), beside the venv's torch. Idempotent and quiet;
# uses sudo when not root; bounded to 10 minutes. Then run the tests with
# TRAINCTL_REQUIRE_OLD_TORCH=1 (tests/e2e/test_old_torch.py).
set -eu

have_old_torch() {
    /usr/bin/python3 -c "import torch" >/dev/null 2>&1
}

if ! have_old_torch; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        SUDO="sudo"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO timeout 600 apt-get update -qq >/dev/null
    $SUDO timeout 600 apt-get install -y -qq --no-install-recommends python3-torch >/dev/null
fi

have_old_torch || { echo "install-old-torch.sh: /usr/bin/python3 still has no torch" >&2; exit 1; }
/usr/bin/python3 -c "import torch; print('install-old-torch.sh: torch', torch.__version__, 'for /usr/bin/python3')"
