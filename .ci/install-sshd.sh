#!/bin/sh
# Install what the SSH/tmux end-to-end tests need: OpenSSH server + client and tmux.
# Idempotent and quiet; uses sudo when not root. The tests start their own sshd on a
# loopback port with keys they make (tests/helpers/sshd.py); nothing here configures or
# starts the system sshd. Then run the tests with TRAINCTL_REQUIRE_SSHD=1.
set -eu

have_all() {
    [ -x /usr/sbin/sshd ] && command -v ssh >/dev/null 2>&1 \
        && command -v ssh-keygen >/dev/null 2>&1 && command -v tmux >/dev/null 2>&1
}

if ! have_all; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        SUDO="sudo"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq >/dev/null
    $SUDO apt-get install -y -qq --no-install-recommends \
        openssh-server openssh-client tmux >/dev/null
fi

# sshd refuses to start as root without its privilege separation directory.
if [ "$(id -u)" -eq 0 ] && [ ! -d /run/sshd ]; then
    mkdir -p /run/sshd && chmod 0755 /run/sshd
fi

have_all || { echo "install-sshd.sh: sshd, ssh, ssh-keygen or tmux still missing" >&2; exit 1; }
