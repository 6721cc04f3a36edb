# Shared settings of start.sh and stop.sh (sourced, not executed).
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HUB_DIR="$(realpath -m -- "${DLOKIT_HUB_DIR:-$REPO/.state/jupyterhub}")"
VENV="$(realpath -m -- "${DLOKIT_HUB_VENV:-$REPO/.state/jupyterhub/venv}")"
# the class's shared run records (and in them the race's leaderboard), writable by the course's group
CLASS_DIR="$(realpath -m -- "${DLOKIT_HUB_CLASS_DIR:-$REPO/.state/class}")"
CONFIG="${DLOKIT_HUB_CONFIG:-$REPO/scripts/jupyterhub/jupyterhub_config.py}"
PORT="${DLOKIT_HUB_PORT:-8000}"
API_PORT="${DLOKIT_HUB_API_PORT:-8081}"
PROXY_API_PORT="${DLOKIT_HUB_PROXY_API_PORT:-8001}"
URL="http://${DLOKIT_HUB_IP:-127.0.0.1}:$PORT"
HUB_LOG="$HUB_DIR/jupyterhub.log"

log() { echo "[jupyterhub] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# pid_alive PIDFILE COMMAND-WORD: prints the pid if the file names a live process whose command line has the word
pid_alive() {
    local pid
    pid="$(cat "$1" 2>/dev/null)" || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] && [[ "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" == *"$2"* ]] || return 1
    echo "$pid"
}
hub_pid() { pid_alive "$HUB_DIR/jupyterhub.pid" jupyterhub; }
proxy_pid() { pid_alive "$HUB_DIR/proxy.pid" configurable-http-proxy; }

# use_slurm: SLURM_CONF as exported, else the local cluster's (scripts/local_slurm/start.sh)
use_slurm() {
    if [[ -z "${SLURM_CONF:-}" ]]; then
        local slurm_env="${DLOKIT_SLURM_DIR:-$REPO/.state/slurm}/env.sh"
        [[ -r "$slurm_env" ]] ||
            die "SLURM_CONF is not set and $slurm_env is missing: run scripts/local_slurm/start.sh or export SLURM_CONF"
        source "$slurm_env"
    fi
    export SLURM_CONF
}
