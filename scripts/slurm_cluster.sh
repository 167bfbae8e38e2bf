#!/usr/bin/env bash
# A private Slurm cluster on this machine for the tests: slurmctld + 3 slurmd nodes (n1, n2, n3), 4 fake GPUs each
# (gres on character devices, so scheduling of --gpus-per-node is real). Needs root and Debian's slurm-wlm
# (scripts/install_system_packages.sh installs it).
#
#   scripts/slurm_cluster.sh start [DIR]   write DIR/slurm.conf, start the daemons, wait until every node is idle
#   scripts/slurm_cluster.sh stop  [DIR]   stop the daemons started from DIR (by their recorded PIDs)
#
# Clients find the cluster with SLURM_CONF=DIR/slurm.conf. Every wait is bounded.
set -euo pipefail
action=${1:?usage: slurm_cluster.sh start|stop [DIR]}
DIR=$(realpath -m "${2:-${GRPO_SLURM_DIR:-/tmp/grpo-launch-slurm}}")
CONF=$DIR/slurm.conf
NODES=(n1 n2 n3)
CTLD_PORT=${GRPO_SLURM_CTLD_PORT:-16817}

stop() {
  for pidfile in "$DIR"/pids/*.pid; do
    [ -e "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill -TERM "$pid" 2>/dev/null || true
  done
  # slurmctld may take ~10 s to stop on SIGTERM; then SIGKILL what is left.
  for _ in $(seq 1 150); do
    alive=0
    for pidfile in "$DIR"/pids/*.pid; do
      [ -e "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null && alive=1
    done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pidfile in "$DIR"/pids/*.pid; do
    [ -e "$pidfile" ] || continue
    kill -KILL "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
}

if [ "$action" = stop ]; then
  stop
  exit 0
fi
[ "$action" = start ] || { echo "usage: slurm_cluster.sh start|stop [DIR]" >&2; exit 2; }
command -v slurmctld >/dev/null || { echo "slurmctld not found: run scripts/install_system_packages.sh" >&2; exit 1; }

stop  # a cluster left from an earlier run in the same DIR
mkdir -p "$DIR"/{state,spool,log,pids,dev}
for n in "${NODES[@]}"; do mkdir -p "$DIR/spool/$n"; done
for i in 0 1 2 3; do
  [ -c "$DIR/dev/nvidia$i" ] || mknod "$DIR/dev/nvidia$i" c 195 "$i"
done

cat >"$CONF" <<CONF
ClusterName=grpotest
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmdPort=17000
AuthType=auth/none
CredType=cred/none
# A requeued job waits out the credential lifetime before it starts again (120 s by default); slurmd refuses to
# relaunch it sooner ("Job credential revoked"). 10 s keeps the preemption test short.
AuthInfo=cred_expire=10
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SchedulerType=sched/backfill
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ReturnToService=2
KillWait=5
MinJobAge=300
JobRequeue=1
# Preemption as a cluster does it: a job of the urgent partition (PriorityTier 10) takes the nodes of a debug job,
# which is requeued. GraceTime: Slurm first sends SIGTERM to the preempted job's step tasks (the trainers), which
# save a checkpoint at the end of their step within it; then it ends the job (SIGTERM to all, SIGKILL after KillWait).
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
GresTypes=gpu
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=17001 CPUs=2 RealMemory=2000 Gres=gpu:4 State=UNKNOWN
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=17002 CPUs=2 RealMemory=2000 Gres=gpu:4 State=UNKNOWN
NodeName=n3 NodeHostname=localhost NodeAddr=127.0.0.1 Port=17003 CPUs=2 RealMemory=2000 Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes=n1,n2,n3 Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=30
PartitionName=urgent Nodes=n1,n2,n3 MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
CONF
cat >"$DIR/gres.conf" <<CONF
AutoDetect=off
NodeName=n1 Name=gpu File=$DIR/dev/nvidia[0-3]
NodeName=n2 Name=gpu File=$DIR/dev/nvidia[0-3]
NodeName=n3 Name=gpu File=$DIR/dev/nvidia[0-3]
CONF

slurmctld -D -i -f "$CONF" >"$DIR/log/slurmctld.out" 2>&1 &
echo $! >"$DIR/pids/slurmctld.pid"
for n in "${NODES[@]}"; do
  slurmd -D -f "$CONF" -N "$n" >"$DIR/log/slurmd-$n.out" 2>&1 &
  echo $! >"$DIR/pids/slurmd-$n.pid"
done

export SLURM_CONF=$CONF
for _ in $(seq 1 300); do
  idle=$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
  [ "$idle" -ge "${#NODES[@]}" ] && { echo "slurm cluster up: SLURM_CONF=$CONF (nodes ${NODES[*]} idle)"; exit 0; }
  sleep 0.1
done
echo "slurm cluster did not come up within 30 s; logs in $DIR/log:" >&2
tail -n 20 "$DIR"/log/* >&2 || true
stop
exit 1
