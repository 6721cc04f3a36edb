# Shared settings for start.sh / stop.sh (sourced, not executed).
# Usage: source common.sh [STATE_DIR]

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE_DIR="${1:-${DLOKIT_SLURM_DIR:-$REPO_ROOT/.state/slurm}}"
STATE_DIR="$(realpath -m -- "$STATE_DIR")"

# Ports: override to run a second cluster (in another STATE_DIR) side by side. Node k's slurmd listens on
# SLURMD_PORT+k-1: the defaults leave room for the 64 nodes start.sh accepts (16900-16963) apart from the others.
CTLD_PORT="${DLOKIT_SLURMCTLD_PORT:-16817}"
SLURMD_PORT="${DLOKIT_SLURMD_PORT:-16900}"
DBD_PORT="${DLOKIT_SLURMDBD_PORT:-16819}"
DB_PORT="${DLOKIT_MARIADB_PORT:-13306}"

ETC="$STATE_DIR/etc"
RUN="$STATE_DIR/run"
LOG="$STATE_DIR/log"
export SLURM_CONF="$ETC/slurm.conf"
MUNGE_SOCKET="$RUN/munge.socket"

# Start order; stop.sh walks it backwards. Each node has its own slurmd (see slurmd_daemons).
DAEMONS=(munged mariadbd slurmdbd slurmctld)

# The cluster's nodes, one a line (start.sh writes etc/nodes; a cluster started before it has one: this host).
node_names() {
    if [[ -s "$ETC/nodes" ]]; then cat "$ETC/nodes"; else hostname -s; fi
}
# slurmd of node $1 under its pid-file name: `slurmd` on a one-node cluster, `slurmd-<node>` on several.
slurmd_daemon() {
    if (($(node_names | wc -l) > 1)); then echo "slurmd-$1"; else echo slurmd; fi
}
slurmd_daemons() {
    local node
    for node in $(node_names); do slurmd_daemon "$node"; done
}

log() { echo "[local_slurm] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# alive PID: running and not a zombie (init may reap exited daemons only after a while).
alive() { [[ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" =~ ^[^Z]$ ]]; }

# Prints the pid of daemon $1 if its pid file names a live process of that name (slurmd-node2: slurmd).
daemon_pid() {
    local pid
    pid="$(cat "$RUN/$1.pid" 2>/dev/null)" || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" || return 1
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "${1%%-*}" ]] || return 1
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

has_node() { [[ $'\n'"$(node_names)"$'\n' == *$'\n'"$1"$'\n'* ]]; }

# launch_slurmd NODE. On a cluster of several nodes each slurmd runs in its own UTS + mount namespace:
# its own hostname (NODE) and /etc/hosts (etc/hosts: every node's address), inherited by the job steps
# it starts, so node names resolve in jobs (MASTER_ADDR) and every process of a node is found by its
# namespace (kill_node.sh, stop.sh). A slurmd restarted while job steps of its node still run joins
# their namespace. `unshare`, `nsenter` and `sh -c exec` exec: the pid stays slurmd's.
launch_slurmd() {
    local node="$1" name survivor=""
    name="$(slurmd_daemon "$node")"
    if [[ "$name" == slurmd ]]; then
        launch slurmd slurmd -D -N "$node" -f "$SLURM_CONF"
        return
    fi
    if [[ -s "$RUN/$name.uts" ]]; then
        for survivor in $(node_pids "$(cat "$RUN/$name.uts")") ""; do
            [[ -n "$survivor" ]] && runs_for_us "$survivor" && break
        done
    fi
    if [[ -n "$survivor" ]]; then
        launch "$name" nsenter --target "$survivor" --uts --mount -- slurmd -D -N "$node" -f "$SLURM_CONF"
    else
        # shellcheck disable=SC2016  # expanded by the inner sh, from its arguments
        launch "$name" unshare --uts --mount --propagation private -- sh -c \
            'hostname "$1" && mount --bind "$2" /etc/hosts && exec slurmd -D -N "$1" -f "$3"' \
            sh "$node" "$ETC/hosts" "$SLURM_CONF"
    fi
    wait_for 10 "slurmd of $node" daemon_pid "$name"
    readlink "/proc/$(daemon_pid "$name")/ns/uts" >"$RUN/$name.uts"
}

# node_pids UTS_NAMESPACE: every process in that namespace (a node's slurmd, its job steps and tasks).
node_pids() {
    local ns="$1" proc
    [[ -n "$ns" && "$ns" != "$(readlink /proc/$$/ns/uts)" ]] || return 0 # never this machine's own
    for proc in /proc/[0-9]*; do
        [[ "$(readlink "$proc/ns/uts" 2>/dev/null)" == "$ns" ]] && alive "${proc#/proc/}" && echo "${proc#/proc/}"
    done
    return 0
}

# runs_for_us PID: the process belongs to this cluster (slurmd, slurmstepd: our SLURM_CONF in its environment).
runs_for_us() {
    [[ $'\n'"$(tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null)"$'\n' == *$'\n'"SLURM_CONF=$SLURM_CONF"$'\n'* ]]
}

# kill_namespace UTS_NAMESPACE: SIGKILL every process in it until none is left (a node that dies).
# Only a namespace that holds a process of this cluster: a namespace number can be reused once freed.
kill_namespace() {
    local ns="$1" pids i pid ours=""
    for pid in $(node_pids "$ns"); do
        runs_for_us "$pid" && ours=1 && break
    done
    [[ -n "$ours" ]] || return 0
    for i in $(seq 50); do
        pids="$(node_pids "$ns" | tr '\n' ' ')"
        [[ -n "${pids// /}" ]] || return 0
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
        sleep 0.1
    done
    log "processes left in namespace $ns: $pids"
    return 1
}

node_state() { sinfo -h -n "$1" -o %T 2>/dev/null; }
node_up() { [[ "$(node_state "$1")" =~ ^(idle|mixed|allocated|completing)$ ]]; }

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
