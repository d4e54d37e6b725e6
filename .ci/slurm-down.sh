#!/bin/sh
# Stop what .ci/slurm-up.sh started: cancel every job, then slurmd, slurmctld and (when it was
# ours) munged.  Idempotent; the slurm.conf and logs stay in $TRAINCTL_SLURM_DIR.
set -u
DIR=${TRAINCTL_SLURM_DIR:-/tmp/trainctl-slurm}
export SLURM_CONF=$DIR/slurm.conf
PATH=$PATH:/usr/sbin

stop() {   # pidfile: TERM, then KILL after 10 s
    [ -s "$1" ] || return 0
    pid=$(cat "$1")
    kill "$pid" 2>/dev/null || { rm -f "$1"; return 0; }
    i=0
    while kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
    kill -9 "$pid" 2>/dev/null
    rm -f "$1"
}

[ -f "$SLURM_CONF" ] && scancel --full --quiet --user=root 2>/dev/null
[ -f "$SLURM_CONF" ] && timeout 10 scancel --full --quiet 2>/dev/null
for f in "$DIR"/slurmd*.pid; do stop "$f"; done
stop "$DIR/slurmctld.pid"
if [ -f "$DIR/munged.ours" ]; then
    [ -s /run/munge/munged.pid ] && stop /run/munge/munged.pid
    rm -f "$DIR/munged.ours"
fi
exit 0
