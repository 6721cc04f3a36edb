# Shared settings for start.sh / stop.sh (sourced, not executed).
# Usage: source common.sh [STATE_DIR]

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE_DIR="${1:-${DLOKIT_SLURM_DIR:-$REPO_ROOT/.state/slurm}}"
STATE_DIR="$(realpath -m -- "$STATE_DIR")"

# Ports: override to run a second cluster (in another STATE_DIR) side by side.
CTLD_PORT="${DLOKIT_SLURMCTLD_PORT:-16817}"
SLURMD_PORT="${DLOKIT_SLURMD_PORT:-16818}"
DBD_PORT="${DLOKIT_SLURMDBD_PORT:-16819}"
DB_PORT="${DLOKIT_MARIADB_PORT:-13306}"

ETC="$STATE_DIR/etc"
RUN="$STATE_DIR/run"
LOG="$STATE_DIR/log"
export SLURM_CONF="$ETC/slurm.conf"
MUNGE_SOCKET="$RUN/munge.socket"

# Start order; stop.sh walks it backwards.
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)

log() { echo "[local_slurm] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# alive PID: running and not a zombie (init may reap exited daemons only after a while).
alive() { [[ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" =~ ^[^Z]$ ]]; }

# Prints the pid of daemon $1 if its pid file names a live process of that name.
daemon_pid() {
    local pid
    pid="$(cat "$RUN/$1.pid" 2>/dev/null)" || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" || return 1
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$1" ]] || return 1
    echo "$pid"
}

# wait_for SECONDS DESCRIPTION COMMAND...: retry COMMAND every 0.1 s.
wait_for() {
    local secs="$1" what="$2"
    shift 2
    local end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < end)) || die "timed out after ${secs}s waiting for $what (logs: $LOG)"
        sleep 0.1
    done
}

# (Command substitutions, not `| grep -q`: with pipefail an early grep exit can fail the pipe.)
ctld_up() { [[ "$(scontrol ping 2>/dev/null)" == *UP* ]]; }

# launch NAME COMMAND...: run in the foreground (-D/-F) in its own session, in the background
# here. setsid does not fork (we are not a group leader), so $! is the daemon's pid.
launch() {
    local name="$1"
    shift
    (cd "$STATE_DIR" && exec setsid "$@" </dev/null >>"$LOG/$name.out" 2>&1) &
    echo "$!" >"$RUN/$name.pid"
}

# slurmctld recovers its jobs from StateSaveLocation at every start (no -c): a restart loses none.
launch_slurmctld() { launch slurmctld slurmctld -D -f "$SLURM_CONF"; }
launch_slurmd() { launch slurmd slurmd -D -N "$(hostname -s)" -f "$SLURM_CONF"; }

# stop_daemon NAME: SIGTERM (slurmctld saves its state), wait up to 5 s, then SIGKILL.
stop_daemon() {
    local name="$1" pid i
    if pid="$(daemon_pid "$name")"; then
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 50); do
            alive "$pid" || break
            sleep 0.1
        done
        if alive "$pid"; then
            log "$name ($pid) ignored SIGTERM, sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            for i in $(seq 30); do
                alive "$pid" || break
                sleep 0.1
            done
        fi
        log "stopped $name ($pid)"
    fi
    rm -f "$RUN/$name.pid"
}
