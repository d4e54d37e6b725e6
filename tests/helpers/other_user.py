"""A second local user for the trust-boundary tests (issue 27): another user's run
directory, link or parent must never be followed.

Created by the test where it runs as root (``useradd --system``: no home, no login
shell; kept for later tests, it owns nothing outside their tmp_path); skipped with the
reason otherwise.  CI runs as root: there, with TRAINCTL_REQUIRE_SSHD=1, a root that cannot
make the user fails the test instead of skipping it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

NAME = "trainctl-probe"


def other_uid() -> int:
    """The second user's uid (made when missing), or a skip/fail saying why not."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second local user (the CI and the dev machines run as root)")
    try:
        return pwd.getpwnam(NAME).pw_uid
    except KeyError:
        pass
    why = ""
    useradd = shutil.which("useradd")
    if useradd is None:
        why = "no useradd on this machine"
    else:
        r = subprocess.run(
            [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", NAME],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if r.returncode == 0 or "already exists" in r.stderr:
            return pwd.getpwnam(NAME).pw_uid
        why = f"useradd {NAME} failed: {r.stderr.strip()}"
    if os.environ.get("TRAINCTL_REQUIRE_SSHD") == "1":
        pytest.fail(
            f"cannot create a second local user as root ({why}) and TRAINCTL_REQUIRE_SSHD=1", pytrace=False
        )
    pytest.skip(why)


def give(path: Path, uid: int) -> None:
    """``path`` and everything under it now belong to ``uid`` (links themselves too)."""
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, -1)
    os.lchown(path, uid, -1)
