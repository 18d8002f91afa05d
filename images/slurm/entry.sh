#!/bin/sh
# Entry of the Slurm simulation's containers: entry.sh slurmctld|slurmd
# The shared munge key (made on the host, mounted read-only at /etc/simcluster/munge.key) is
# copied into place for the munge user (mode 0400); munged runs as munge; then the Slurm daemon
# is exec'd in the foreground as PID 1 (stop: ~1 s). slurm.conf is mounted at /etc/slurm/slurm.conf.
set -e
install -o munge -g munge -m 0400 /etc/simcluster/munge.key /etc/munge/munge.key
mkdir -p /run/munge /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
chown munge:munge /run/munge
runuser -u munge -- /usr/sbin/munged
case "$1" in
  slurmctld) exec /usr/sbin/slurmctld -D -i ;;
  slurmd) exec /usr/sbin/slurmd -D ;;
  *) exec "$@" ;;
esac
