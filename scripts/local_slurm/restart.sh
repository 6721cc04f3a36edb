#!/usr/bin/env bash
# Restart daemons of the local Slurm cluster of STATE_DIR (see start.sh), keeping every job:
# slurmctld saves its state on SIGTERM and recovers it at start; running jobs live on in
# slurmstepd, which reports to the new slurmctld (queued and running jobs are not lost).
# Usage: scripts/local_slurm/restart.sh [STATE_DIR] [DAEMON...]     (default DAEMON: slurmctld)
#        e.g. restart.sh "" slurmd    restarts slurmd of the default STATE_DIR
set -euo pipefail
if [[ "$(id -u)" != 0 ]]; then
    echo "[local_slurm] ERROR: must run as root (the cluster uses SlurmUser=root); try: sudo $0 $*" >&2
    exit 1
fi
HERE="$(dirname "${BASH_SOURCE[0]}")"
source "$HERE/common.sh" "${1:-}"
shift || true
names=("$@")
((${#names[@]})) || names=(slurmctld)
[[ -f "$SLURM_CONF" ]] || die "no cluster in $STATE_DIR (run start.sh first)"

for name in "${names[@]}"; do
    case "$name" in
    slurmctld)
        stop_daemon slurmctld
        launch_slurmctld
        wait_for 30 slurmctld ctld_up
        ;;
    slurmd)
        stop_daemon slurmd
        launch_slurmd
        node_up() { [[ "$(sinfo -h -n "$(hostname -s)" -o %T)" =~ ^(idle|mixed|allocated)$ ]]; }
        wait_for 30 "node $(hostname -s) to be up" node_up
        ;;
    *) die "restart.sh restarts slurmctld or slurmd, not '$name'" ;;
    esac
    log "restarted $name ($(daemon_pid "$name"))"
done
