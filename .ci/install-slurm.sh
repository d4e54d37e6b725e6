#!/bin/sh
# Install what the Slurm end-to-end tests need: Slurm (slurmctld, slurmd, sbatch, ...) and
# munge, from the distribution's packages.  Idempotent and quiet; uses sudo when not root.
# Nothing here configures or starts a daemon: .ci/slurm-up.sh does, with its own slurm.conf.
set -eu

have_all() {
    for c in slurmctld slurmd sbatch squeue scancel scontrol munged; do
        command -v "$c" >/dev/null 2>&1 || [ -x "/usr/sbin/$c" ] || return 1
    done
}

if ! have_all; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        SUDO="sudo"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq >/dev/null
    $SUDO apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
fi

have_all || { echo "install-slurm.sh: slurmctld, slurmd, sbatch, squeue, scancel, scontrol or munged still missing" >&2; exit 1; }
