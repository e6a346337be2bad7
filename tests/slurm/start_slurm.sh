#!/bin/bash
# A one-node SLURM (Debian's slurm-wlm + munge, accounting off) for tests/test_slurm.py, as
# ../shared/FACTS.md measured it. Usage: start_slurm.sh STATE_DIR. Prints "ready" once the node is
# idle; writes the daemons' PIDs to STATE_DIR/pids (stop_slurm.sh kills exactly those).
set -euo pipefail
state="$1"
mkdir -p "$state"/{spool,ctld,log,munge} /etc/slurm /run/munge
host=$(hostname)
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 2048 ))
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
  chmod 400 /etc/munge/munge.key
fi
socket="$state/munge/munge.socket"
munged --force --socket="$socket" --pid-file="$state/munge/munged.pid" --log-file="$state/log/munged.log" \
  --seed-file="$state/munge/seed"
# SLURM's commands read /etc/slurm/slurm.conf: a copy that was there is kept for stop_slurm.sh to put
# back. (Left behind, it points every later `scontrol`, hence every `snakemake` start, whose slurm
# plugin asks `scontrol show config` at import, at a controller that is gone: 9 s each.)
if [ -e /etc/slurm/slurm.conf ] && [ ! -e "$state/slurm.conf.before" ]; then
  cp -p /etc/slurm/slurm.conf "$state/slurm.conf.before"
fi
touch "$state/slurm.conf.written"
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=softtokens-test
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$socket
CryptoType=crypto/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=300
ReturnToService=2
KillWait=30
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
slurmctld
slurmd
pids() {  # the daemons write their PID files once up: read them again at every look
  cat "$state/slurmctld.pid" "$state/slurmd.pid" "$state/munge/munged.pid" > "$state/pids" 2>/dev/null || true
}
for _ in $(seq 1 60); do
  pids
  if sinfo -h -o "%T" 2>/dev/null | grep -qE "idle|mixed"; then sleep 1; pids; echo ready; exit 0; fi
  sleep 1
done
pids
echo "the node never became idle:"; sinfo 2>&1; tail -20 "$state/log/slurmctld.log" "$state/log/slurmd.log"
exit 1
