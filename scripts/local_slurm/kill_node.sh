#!/usr/bin/env bash
# A node that dies: SIGKILL every process of NODE of the multi-node local Slurm in STATE_DIR (see
# start.sh --nodes): its slurmd, the job steps it runs and their tasks, i.e. everything in the node's
# UTS namespace. Slurm finds the node unresponsive within seconds (SlurmdTimeout) and ends its jobs
# NODE_FAIL (--no-requeue) or requeues them. Bring it back: restart.sh STATE_DIR slurmd:NODE
# Usage: scripts/local_slurm/kill_node.sh STATE_DIR NODE
set -euo pipefail
if [[ "$(id -u)" != 0 ]]; then
    echo "[local_slurm] ERROR: must run as root; try: sudo $0 $*" >&2
    exit 1
fi
if (($# != 2)); then
    echo "usage: $0 STATE_DIR NODE   (e.g. $0 .state/slurm node2)" >&2
    exit 2
fi
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$1"
node="$2"
has_node "$node" || die "no node '$node' in $STATE_DIR (nodes: $(node_names | tr '\n' ' '))"
name="$(slurmd_daemon "$node")"
[[ "$name" != slurmd ]] || die "$STATE_DIR has a single node: kill_node.sh needs a cluster of several (start.sh --nodes 2)"
[[ -s "$RUN/$name.uts" ]] || die "node $node is not running (no $RUN/$name.uts)"
kill_namespace "$(cat "$RUN/$name.uts")" || die "could not kill every process of node $node"
rm -f "$RUN/$name.pid"
log "killed node $node (every process in its namespace)"
