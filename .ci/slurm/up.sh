#!/usr/bin/env bash
# Start a real one-node SLURM cluster on this machine (Debian 12, root, no systemd needed).
# Installs Debian's slurmctld/slurmd/slurm-client/munge, writes /etc/slurm/slurm.conf from this
# machine's CPUs, memory and hostname, starts munged, slurmctld and slurmd (pid files under
# $LONGCA_SLURM_DIR) and waits until the node is idle. Stop it with .ci/slurm/down.sh.
set -euo pipefail

STATE=${LONGCA_SLURM_DIR:-/var/tmp/longca-slurm}
CONF=/etc/slurm/slurm.conf

if [ "$(id -u)" != 0 ]; then
  echo "slurm/up: needs root (installs packages, runs the daemons)" >&2
  exit 1
fi

# Already up (a second call, or a developer machine that ran it before): nothing to do.
if [ -f "$STATE/slurmctld.pid" ] && kill -0 "$(cat "$STATE/slurmctld.pid")" 2>/dev/null \
   && [ -f "$STATE/slurmd.pid" ] && kill -0 "$(cat "$STATE/slurmd.pid")" 2>/dev/null \
   && timeout 10 sinfo -h >/dev/null 2>&1; then
  echo "slurm/up: already running: $(sinfo -h -o '%P %D %c %m %t' | head -1)"
  exit 0
fi

t0=$(date +%s)
missing=()
for b in slurmctld slurmd sinfo munged; do command -v "$b" >/dev/null || missing+=("$b"); done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Without recommends: 8 packages instead of about 40 (slurm-wlm-doc, mailutils, ...).
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi

# --- munge: the key is made by the package's postinst; make one if it is missing.
if [ ! -s /etc/munge/munge.key ]; then
  if command -v mungekey >/dev/null; then mungekey --create --force; else
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
fi
# munged refuses group/world-writable folders; the socket folder must be 0755 for clients.
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
mkdir -p "$STATE"/{spool,state,log}
chmod 0755 "$STATE"

# --- slurm.conf from this machine
HOST=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
# A little under MemTotal: slurmd drains a node whose RealMemory exceeds what it finds.
REAL_MB=$(( MEM_MB * 95 / 100 ))
mkdir -p /etc/slurm
cat >"$CONF" <<EOF
# Written by .ci/slurm/up.sh: a one-node test cluster. Not for production.
ClusterName=longca
# The address is given so no DNS lookup of the hostname is needed.
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
# No cgroups, systemd or slurmdbd on a CI container.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Finished jobs stay visible to squeue/scontrol for an hour: the plugin's squeue status check
# needs them, and the tests read their records after a run (there is no accounting database).
MinJobAge=3600
ReturnToService=2
SchedulerType=sched/backfill
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$REAL_MB State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF

# --- daemons (each daemonises and writes its pid file)
# munged runs as the munge user, so its pid file lives in its own /run/munge.
if ! { [ -f /run/munge/munged.pid ] && kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; }; then
  runuser -u munge -- munged
fi
# Wait for the munge socket (a credential round trip proves it works).
for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
munge -n | unmunge >/dev/null

# -i: ignore state left by an earlier cluster in $STATE (old jobs, old node state).
slurmctld -i
slurmd -N "$HOST"

# --- wait until the node is idle (slurmd registers within a few seconds)
deadline=$(( $(date +%s) + 90 ))
until timeout 10 sinfo -h -N -o %t 2>/dev/null | grep -qx idle; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "slurm/up: node not idle after 90 s" >&2
    sinfo -N -l >&2 || true
    tail -n 20 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 || true
    exit 1
  fi
  # A node that came up DOWN/DRAINED from a stale state gets resumed once.
  st=$(timeout 10 sinfo -h -N -o %t 2>/dev/null || true)
  case "$st" in down*|drain*) scontrol update NodeName="$HOST" State=RESUME 2>/dev/null || true ;; esac
  sleep 0.5
done

echo "slurm/up: node $HOST idle with $CPUS CPUs, ${REAL_MB} MB, partition debug" \
     "(slurm $(sinfo -V | awk '{print $2}'), $(( $(date +%s) - t0 )) s)"
