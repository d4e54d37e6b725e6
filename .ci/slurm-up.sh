#!/bin/sh
# Start a real single-node Slurm on this machine for the tests: munged, slurmctld and slurmd
# (as root), with a minimal slurm.conf of our own in $TRAINCTL_SLURM_DIR (default
# /tmp/trainctl-slurm): one node (this machine, its real CPUs and memory), partitions
# `debug` (default, no time limit) and `short` (MaxTime 5 min), no accounting,
# proctrack/linuxproc and task/none (no cgroups needed), fast scheduling.  The system's own
# /etc/slurm is not touched: clients find this one through SLURM_CONF (printed last; the tests
# look in the default directory too).  Idempotent: a Slurm of ours already up is left as is.
# .ci/slurm-down.sh stops what this started.  Needs root (slurmd runs jobs as their users).
set -eu

DIR=${TRAINCTL_SLURM_DIR:-/tmp/trainctl-slurm}
CONF=$DIR/slurm.conf
export SLURM_CONF=$CONF
[ "$(id -u)" -eq 0 ] || { echo "slurm-up.sh: must run as root (slurmd starts jobs as their users)" >&2; exit 1; }
for c in munged slurmctld slurmd sbatch; do
    command -v "$c" >/dev/null 2>&1 || [ -x "/usr/sbin/$c" ] || { echo "slurm-up.sh: $c missing: run .ci/install-slurm.sh" >&2; exit 1; }
done
PATH=$PATH:/usr/sbin

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

if alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid" && sinfo -h >/dev/null 2>&1; then
    echo "SLURM_CONF=$CONF"
    exit 0
fi

mkdir -p "$DIR/state" "$DIR/spool"
chmod 0755 "$DIR"
NODE=$(hostname -s)
# This machine as slurmd sees it: CPUs=..., Boards, sockets, cores, threads, RealMemory
HW=$(slurmd -C | head -1 | sed 's/^NodeName=[^ ]* //')
cat >"$CONF" <<CONF
# trainctl tests: a single-node Slurm (made by .ci/slurm-up.sh)
ClusterName=trainctl
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=sched_interval=1,batch_sched_delay=0,sched_min_interval=100000,default_queue_depth=100
EnforcePartLimits=ALL
MinJobAge=5
KillWait=10
OverTimeLimit=0
InactiveLimit=0
Waittime=0
MessageTimeout=5
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=$NODE NodeAddr=127.0.0.1 $HW State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
PartitionName=short Nodes=$NODE MaxTime=5 State=UP OverSubscribe=YES
CONF

# munged: the system's when it runs, else ours (as the munge user, as munge wants).
if ! pgrep -x munged >/dev/null 2>&1; then
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    [ -s /etc/munge/munge.key ] || { mungekey --create >/dev/null 2>&1 || true; chown munge:munge /etc/munge/munge.key; }
    runuser -u munge -- /usr/sbin/munged
    touch "$DIR/munged.ours"
fi
alive "$DIR/slurmctld.pid" || slurmctld -i
alive "$DIR/slurmd.pid" || slurmd

i=0
until [ "$(sinfo -h -o %t 2>/dev/null)" = idle ] || [ "$(sinfo -h -o %t 2>/dev/null)" = mix ]; do
    i=$((i + 1))
    if [ $i -gt 100 ]; then
        echo "slurm-up.sh: the node did not come up within 20 s:" >&2
        sinfo -N -l >&2 || true
        tail -n 5 "$DIR/slurmctld.log" "$DIR/slurmd.log" >&2 || true
        exit 1
    fi
    sleep 0.2
done
echo "SLURM_CONF=$CONF"
