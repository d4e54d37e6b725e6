#!/bin/sh
# Start a real Slurm on this machine for the tests: munged, slurmctld and two slurmds
# (as root), with a minimal slurm.conf of our own in $TRAINCTL_SLURM_DIR (default
# /tmp/trainctl-slurm): two nodes, node1 and node2, each this machine (its real CPUs and
# memory; one slurmd each, on its own port: Slurm's "multiple slurmd" set-up), so a job can
# have `nodes = 2` and its node's name is not this machine's hostname (as on a cluster, where
# the login node is not the compute node); partitions `debug` (default, no time limit),
# `short` (MaxTime 5 min) and `urgent` (a higher PriorityTier: a job there preempts, that is
# requeues, the jobs of the others on its nodes), no accounting, proctrack/linuxproc and
# task/none (no cgroups needed), fast scheduling.  The system's own
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

NODES="node1 node2"
up() {   # every node idle (or running jobs)
    [ -n "$(sinfo -h -N -o %t 2>/dev/null)" ] || return 1
    ! sinfo -h -N -o %t 2>/dev/null | grep -qvE '^(idle|mix|alloc)$'
}

if alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd-node1.pid" && alive "$DIR/slurmd-node2.pid" && up; then
    echo "SLURM_CONF=$CONF"
    exit 0
fi

mkdir -p "$DIR/state" "$DIR/spool/node1" "$DIR/spool/node2"
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
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
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
NodeName=node1 NodeHostname=$NODE NodeAddr=127.0.0.1 Port=6821 $HW State=UNKNOWN
NodeName=node2 NodeHostname=$NODE NodeAddr=127.0.0.1 Port=6822 $HW State=UNKNOWN
PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES PriorityTier=1
PartitionName=short Nodes=node1,node2 MaxTime=5 State=UP OverSubscribe=YES PriorityTier=1
PartitionName=urgent Nodes=node1,node2 MaxTime=INFINITE State=UP OverSubscribe=YES PriorityTier=10
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
for n in $NODES; do alive "$DIR/slurmd-$n.pid" || slurmd -N "$n"; done

i=0
until up; do
    i=$((i + 1))
    if [ $i -gt 100 ]; then
        echo "slurm-up.sh: the nodes did not come up within 20 s:" >&2
        sinfo -N -l >&2 || true
        tail -n 5 "$DIR/slurmctld.log" "$DIR"/slurmd-node*.log >&2 || true
        exit 1
    fi
    sleep 0.2
done
echo "SLURM_CONF=$CONF"
