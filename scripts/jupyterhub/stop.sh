#!/usr/bin/env bash
# Stop the course's JupyterHub and its proxy. The students' servers (Slurm jobs) keep running, and the
# hub finds them again at its next start, unless --servers is given: then they are cancelled too.
# Usage: scripts/jupyterhub/stop.sh [--servers]      (same DLOKIT_HUB_* settings as start.sh)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/common.sh"
servers=0
case "${1:-}" in
    "") ;;
    --servers) servers=1 ;;
    *) echo "usage: $0 [--servers]" >&2; exit 2 ;;
esac

stop_pid() {  # stop_pid NAME PID: SIGTERM, then SIGKILL after 10 s
    local i
    kill -TERM "$2" 2>/dev/null || return 0
    for i in $(seq 100); do
        kill -0 "$2" 2>/dev/null || { log "stopped $1 ($2)"; return 0; }
        sleep 0.1
    done
    log "$1 ($2) ignored SIGTERM, sending SIGKILL"
    kill -KILL "$2" 2>/dev/null || true
}
if pid="$(hub_pid)"; then stop_pid jupyterhub "$pid"; fi
if pid="$(proxy_pid)"; then stop_pid configurable-http-proxy "$pid"; fi  # the hub stops it, unless killed
rm -f "$HUB_DIR/jupyterhub.pid" "$HUB_DIR/proxy.pid"

if ((servers)); then
    use_slurm
    jobs="$(squeue -h -n spawner-jupyterhub -o %A 2>/dev/null || true)"
    if [[ -n "$jobs" ]]; then
        # shellcheck disable=SC2086  # one id per word
        scancel $jobs && log "cancelled the servers' jobs: $(echo $jobs)"
    fi
fi
