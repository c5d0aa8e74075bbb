#!/usr/bin/env bash
# Stop the cluster started by .ci/slurm/up.sh: slurmd, slurmctld, then munged, each by the PID in
# its pid file. Safe to call twice, or when nothing was started.
set -uo pipefail

STATE=${LONGCA_SLURM_DIR:-/var/tmp/longca-slurm}

stop() {  # stop <name> <pidfile>: TERM that PID, wait up to 10 s, then KILL
  local name=$1 pidfile=$2 pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile" 2>/dev/null)
  # Only signal a live process that still is the daemon (guards against a reused PID).
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null \
     && grep -q "$name" "/proc/$pid/comm" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    echo "slurm/down: stopped $name ($pid)"
  fi
  rm -f "$pidfile"
}

# Jobs still running would be orphaned by slurmd's exit: cancel them while the controller is up.
if [ -f "$STATE/slurmctld.pid" ] && command -v scancel >/dev/null; then
  timeout 10 scancel --user="$(id -un)" 2>/dev/null || true
fi
stop slurmd "$STATE/slurmd.pid"
stop slurmctld "$STATE/slurmctld.pid"
stop munged /run/munge/munged.pid
exit 0
