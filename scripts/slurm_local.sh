#!/usr/bin/env bash
# A one-node SLURM cluster on this machine (Debian's slurm 22.05 packages: slurmctld + slurmd + munge),
# for the tests of `leap-finetune slurm` and for trying it out. Idempotent; needs root. No systemd:
# the daemons are started by hand, as documented in ../shared/ENVIRONMENT.md.
#   bash scripts/slurm_local.sh        # install if missing, configure, start, wait until the node is idle
set -euo pipefail
if ! command -v slurmctld >/dev/null || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q slurmctld slurmd slurm-client munge >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q slurmctld slurmd slurm-client munge >/dev/null; }
fi
if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
  echo "slurm: already running ($(sinfo -h -o '%N %T'))"; exit 0
fi
node_line=$(slurmd -C | head -1)   # NodeName=... CPUs=... RealMemory=...
node=$(hostname -s)
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /var/lib/munge
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=leap
SlurmctldHost=${node}
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmUser=root
MpiDefault=none
# SIGKILL 10 s after a job's SIGTERM (default 30 s): a cancelled run saves its checkpoint well within it, and the
# tests' cancelled jobs end sooner
KillWait=10
${node_line}
PartitionName=debug Nodes=${node} Default=YES MaxTime=INFINITE State=UP
CONF
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
chmod 400 /etc/munge/munge.key
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd
for _ in $(seq 1 60); do
  if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed)'; then
    echo "slurm: running ($(sinfo -h -o '%N %T %c CPUs'))"; exit 0
  fi
  scontrol update nodename="${node}" state=resume >/dev/null 2>&1 || true
  sleep 1
done
echo "slurm: the node did not become idle; see /var/log/slurm/" >&2
sinfo >&2 || true
exit 1
