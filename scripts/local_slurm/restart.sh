#!/usr/bin/env bash
# Restart daemons of the local Slurm cluster of STATE_DIR (see start.sh), keeping every job:
# slurmctld saves its state on SIGTERM and recovers it at start; running jobs live on in
# slurmstepd, which reports to the new slurmctld (queued and running jobs are not lost).
# Usage: scripts/local_slurm/restart.sh [STATE_DIR] [DAEMON...]     (default DAEMON: slurmctld)
#        DAEMON: slurmctld, slurmd (every node's) or slurmd:NODE (one node's, e.g. slurmd:node2)
#        e.g. restart.sh "" slurmd    restarts slurmd of the default STATE_DIR
# A node brought back after kill_node.sh: `restart.sh STATE_DIR slurmd:node2` starts its slurmd
# again and, if Slurm still holds it DOWN, resumes it (scontrol update state=resume).
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

restart_node() {
    local node="$1" name
    has_node "$node" || die "no node '$node' in this cluster (nodes: $(node_names | tr '\n' ' '))"
    name="$(slurmd_daemon "$node")"
    stop_daemon "$name"
    launch_slurmd "$node"
    node_registered() { [[ -n "$(node_state "$node")" && "$(node_state "$node")" != *"*" ]]; }
    wait_for 30 "node $node to answer" node_registered
    if [[ "$(node_state "$node")" =~ ^(down|drain|drained|fail) ]]; then
        scontrol update nodename="$node" state=resume
    fi
    wait_for 30 "node $node to be up" node_up "$node"
    log "restarted $name ($(daemon_pid "$name"))"
}

for name in "${names[@]}"; do
    case "$name" in
    slurmctld)
        stop_daemon slurmctld
        launch_slurmctld
        wait_for 30 slurmctld ctld_up
        log "restarted slurmctld ($(daemon_pid slurmctld))"
        ;;
    slurmd)
        for node in $(node_names); do restart_node "$node"; done
        ;;
    slurmd:?*) restart_node "${name#slurmd:}" ;;
    *) die "restart.sh restarts slurmctld, slurmd or slurmd:NODE, not '$name'" ;;
    esac
done
