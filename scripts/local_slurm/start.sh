#!/usr/bin/env bash
# Start a real Slurm cluster (Debian slurm 22.05) with accounting on this machine, one node or
# several, for tests, CI and self-paced learners. Needs root (SlurmUser=root); no systemd used.
# Usage: scripts/local_slurm/start.sh [--nodes N] [STATE_DIR]   then: source STATE_DIR/env.sh; sbatch ...
# Stop:  scripts/local_slurm/stop.sh [STATE_DIR]
#
# STATE_DIR (default $DLOKIT_SLURM_DIR, else <repo>/.state/slurm) holds everything:
#   env.sh            exports SLURM_CONF for clients
#   etc/              slurm.conf, gres.conf, slurmdbd.conf, munge.key, db.pass, mariadb init SQL
#   run/              <daemon>.pid, munge socket, mariadb socket, munge seed
#   log/              <daemon>.log (daemon log files), <daemon>.out (stdout/stderr)
#   slurmctld/        StateSaveLocation      slurmd/  SlurmdSpoolDir
#   mysql/            MariaDB datadir        fakegpu/ nvidia0..3 -> /dev/null
# Node: `hostname -s`, CPUs = the cores this process may use (`nproc`, or DLOKIT_SLURM_CPUS), memory
# 80 % of MemTotal (or DLOKIT_SLURM_MEM_MB), 4 fake GPUs; partition `gpu` (MaxTime 1 day).
# Memory limits are enforced without cgroups: jobacct_gather samples every task each second and
# kills a step over its --mem (state OUT_OF_MEMORY, MaxRSS in sacct).
# Accounting: munged -> mariadbd -> slurmdbd -> slurmctld -> slurmd.
# Restart one daemon keeping the jobs: scripts/local_slurm/restart.sh [STATE_DIR] [slurmctld|slurmd|slurmd:NODE]
# Ports: DLOKIT_SLURMCTLD_PORT (16817), DLOKIT_SLURMD_PORT (16900; node k: +k-1), DLOKIT_SLURMDBD_PORT (16819),
# DLOKIT_MARIADB_PORT (13306); `start.sh --nodes N --ports` prints them and checks that none is used twice.
# First job id: DLOKIT_SLURM_FIRST_JOB_ID (default 1).
# Cluster name: DLOKIT_SLURM_CLUSTER, default dlokit<8 hex digits of STATE_DIR's path> (kept for a STATE_DIR that
# has one): two clusters number their jobs alike, and the kit keeps their job cards apart by this name.
#
# --nodes N (or DLOKIT_SLURM_NODES=N; default 1): N nodes node1..nodeN on this machine, each its own
# slurmd (Slurm's multiple-slurmd mode, `slurmd -N nodeK`, port DLOKIT_SLURMD_PORT+K-1) with 4 fake
# GPUs, all in partition `gpu`. Each slurmd runs in its own UTS + mount namespace (`unshare`, needs
# CAP_SYS_ADMIN): its hostname is nodeK and its /etc/hosts (etc/hosts) maps nodeK to 127.0.1.K, so
# node names resolve inside jobs like on a real cluster (MASTER_ADDR = the first node's name), and a
# node's processes are the processes of its namespace (kill_node.sh kills them all: a node that dies).
# (Plain multiple-slurmd without namespaces gives every node this machine's hostname and node names
# that do not resolve; it is not offered.) Every node declares all of this machine's cores (they share
# them) and 80 % of the memory / N. A dead node is detected in seconds (SlurmdTimeout=5, or
# DLOKIT_SLURMD_TIMEOUT): its jobs end NODE_FAIL with --no-requeue, else Slurm requeues them.
# Every cluster has one license `machine`: jobs that ask for it (--licenses=machine, profile
# local-slurm-2n) run one at a time even on different nodes, which share this machine's cores.
#
# Auth is munge (own key and socket here), not auth/none: slurmctld/slurmd/slurmdbd listen on
# all interfaces, and auth/none would let anyone who reaches those ports run jobs as root.
# munged is run with --force because it refuses sockets under dirs that are not
# world-executable (pytest tmp dirs are 0700); clients running as root are unaffected.
set -euo pipefail
if [[ "$(id -u)" != 0 ]]; then
    echo "[local_slurm] ERROR: must run as root (the cluster uses SlurmUser=root); try: sudo $0 $*" >&2
    exit 1
fi
HERE="$(dirname "${BASH_SOURCE[0]}")"
usage() { sed -n '4,5p' "$0" | sed 's/^# //' >&2; }
NODES="${DLOKIT_SLURM_NODES:-1}"
ONLY_PORTS=""
args=()
while (($#)); do
    case "$1" in
    --nodes) NODES="${2:-}"; shift $(($# > 1 ? 2 : 1)) ;;
    --nodes=*) NODES="${1#--nodes=}"; shift ;;
    --ports) ONLY_PORTS=1; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "[local_slurm] ERROR: unknown option '$1'" >&2; usage; exit 2 ;;
    *) args+=("$1"); shift ;;
    esac
done
if [[ ! "$NODES" =~ ^[1-9][0-9]*$ ]] || ((NODES > 64)); then
    echo "[local_slurm] ERROR: --nodes must be a whole number from 1 to 64, not '$NODES'" >&2
    exit 2
fi
source "$HERE/common.sh" "${args[@]}"

# Every daemon's port once: node 2's slurmd (SLURMD_PORT+1) on slurmdbd's port stopped a 2-node start.
PORTS=("$CTLD_PORT" "$DBD_PORT" "$DB_PORT" $(seq "$SLURMD_PORT" $((SLURMD_PORT + NODES - 1))))
for port in "${PORTS[@]}"; do
    [[ "$port" =~ ^[0-9]+$ ]] && ((port > 0 && port < 65536)) || die "port '$port' is not a TCP port (1-65535)"
done
if (($(printf '%s\n' "${PORTS[@]}" | sort -u | wc -l) != ${#PORTS[@]})); then
    die "ports used twice: slurmctld $CTLD_PORT, slurmdbd $DBD_PORT, MariaDB $DB_PORT, slurmd $SLURMD_PORT to" \
        "$((SLURMD_PORT + NODES - 1)) ($NODES node(s)); set DLOKIT_{SLURMCTLD,SLURMD,SLURMDBD,MARIADB}_PORT apart"
fi
if [[ -n "$ONLY_PORTS" ]]; then
    echo "slurmctld $CTLD_PORT slurmdbd $DBD_PORT mariadb $DB_PORT slurmd ${PORTS[*]:3}"
    exit 0
fi

cluster_up() {
    local d
    for d in "${DAEMONS[@]}" $(slurmd_daemons); do daemon_pid "$d" >/dev/null || return 1; done
    ctld_up && sinfo -h >/dev/null 2>&1
}
if cluster_up; then
    running="$(node_names | wc -l)"
    ((running == NODES)) || die "a cluster of $running node(s) already runs in $STATE_DIR; stop it first (stop.sh)"
    log "already running in $STATE_DIR"
    exit 0
fi
"$HERE/stop.sh" "$STATE_DIR" # clean up stale pid files / half-up daemons

# On any failure from here on: remove a temporary policy-rc.d, stop what was started.
policy=""
ready=""
cleanup() {
    [[ -z "$policy" ]] || rm -f "$policy"
    [[ -n "$ready" ]] || { log "start failed, stopping; logs in $LOG"; "$HERE/stop.sh" "$STATE_DIR"; }
}
trap cleanup EXIT
set -E # the ERR trap in functions too: which command stopped the start, in its log line
trap 'log "failed at line $LINENO: $BASH_COMMAND (exit $?)"' ERR

for port in "$CTLD_PORT" $(seq "$SLURMD_PORT" $((SLURMD_PORT + NODES - 1))) "$DBD_PORT" "$DB_PORT"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        die "port $port is in use (another cluster?); set DLOKIT_{SLURMCTLD,SLURMD,SLURMDBD,MARIADB}_PORT"
    fi
done

# --- packages (CI starts from a fresh Debian machine) ----------------------------------
missing=""
for cmd in slurmctld slurmd sbatch slurmdbd munged mariadbd pgrep; do
    command -v "$cmd" >/dev/null || missing+=" $cmd"
done
if [[ -n "$missing" ]]; then
    log "missing:$missing; installing slurm, munge, mariadb and procps packages"
    export DEBIAN_FRONTEND=noninteractive
    # Keep the packages' init scripts from starting system-wide daemons (policy-rc.d: 101).
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        policy=/usr/sbin/policy-rc.d
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
    fi
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends \
        slurmctld slurmd slurm-client slurmdbd munge mariadb-server procps >/dev/null
    [[ -z "$policy" ]] || rm -f "$policy"
    policy=""
fi

if ((NODES > 1)) && ! unshare --uts --mount --propagation private -- true 2>/dev/null; then
    die "--nodes $NODES gives each node its own hostname with 'unshare --uts --mount', which failed here" \
        "(it needs CAP_SYS_ADMIN; in a container run it with --privileged or --cap-add SYS_ADMIN)"
fi

# --- config -------------------------------------------------------------------------------
HOST="$(hostname -s)"
USER_NAME="$(id -un)"
MEM_MB="${DLOKIT_SLURM_MEM_MB:-$(awk -v n="$NODES" '/MemTotal/ {print int($2 / 1024 * 0.8 / n)}' /proc/meminfo)}"
CPUS="${DLOKIT_SLURM_CPUS:-$(nproc)}"
[[ "$CPUS" =~ ^[1-9][0-9]*$ ]] || die "DLOKIT_SLURM_CPUS must be a positive integer, not '$CPUS'"
DB_SOCKET="$RUN/mariadb.sock"
[[ -s "$ETC/db.pass" ]] || (mkdir -p "$ETC" && umask 077 && od -An -N12 -tx1 /dev/urandom | tr -d ' \n' >"$ETC/db.pass")
DB_PASS="$(cat "$ETC/db.pass")"
mkdir -p "$ETC" "$RUN" "$LOG" "$STATE_DIR/slurmctld" "$STATE_DIR/slurmd" "$STATE_DIR/fakegpu"
if ((NODES == 1)); then
    NODE_LIST=("$HOST")
    NODE_SET="$HOST"
    NODE_LINES="NodeName=$HOST NodeHostname=$HOST NodeAddr=127.0.0.1"
    SLURMD_FILES="SlurmdSpoolDir=$STATE_DIR/slurmd
SlurmdPidFile=$RUN/slurmd.pid
SlurmdLogFile=$LOG/slurmd.log"
    FAST_NODE_FAILURE=""
else
    NODE_LIST=()
    NODE_LINES=""
    for k in $(seq "$NODES"); do
        NODE_LIST+=("node$k")
        NODE_LINES+="NodeName=node$k NodeHostname=node$k NodeAddr=127.0.1.$k Port=$((SLURMD_PORT + k - 1))"
        ((k == NODES)) || NODE_LINES+=$'\n'
    done
    NODE_SET="node[1-$NODES]"
    SLURMD_FILES="SlurmdSpoolDir=$STATE_DIR/slurmd/%n
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmdLogFile=$LOG/slurmd-%n.log"
    # A node that stops answering is DOWN within seconds (defaults: minutes): its jobs end or are requeued.
    FAST_NODE_FAILURE="SlurmdTimeout=${DLOKIT_SLURMD_TIMEOUT:-5}
MessageTimeout=3"
    { cat /etc/hosts; for k in $(seq "$NODES"); do echo "127.0.1.$k node$k"; done; } >"$ETC/hosts"
fi
printf '%s\n' "${NODE_LIST[@]}" >"$ETC/nodes"
chmod 755 "$ETC" "$RUN" # non-root clients (sudo users) need slurm.conf and the munge socket
for i in 0 1 2 3; do ln -sfn /dev/null "$STATE_DIR/fakegpu/nvidia$i"; done
[[ -s "$ETC/munge.key" ]] || mungekey --create --keyfile="$ETC/munge.key"
chmod 600 "$ETC/munge.key"

# The cluster's name: slurmctld refuses to start on a state saved under another one, so a STATE_DIR keeps its own.
if [[ -n "${DLOKIT_SLURM_CLUSTER:-}" ]]; then
    CLUSTER="$DLOKIT_SLURM_CLUSTER"
elif [[ -s "$STATE_DIR/slurmctld/clustername" ]]; then
    CLUSTER="$(cat "$STATE_DIR/slurmctld/clustername")"
else
    CLUSTER="dlokit$(printf '%s' "$STATE_DIR" | sha256sum | cut -c1-8)"
fi
[[ "$CLUSTER" =~ ^[a-z][a-z0-9]{0,39}$ ]] || die "cluster name '$CLUSTER': lower-case letters and digits (up to 40)"

cat >"$SLURM_CONF" <<EOF
# Generated by scripts/local_slurm/start.sh -- edits are overwritten.
ClusterName=$CLUSTER
# Several clusters on one machine (tests) number their jobs apart: a job's rendezvous port comes from its id.
FirstJobId=${DLOKIT_SLURM_FIRST_JOB_ID:-1}
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also sets how long a requeued job waits before it may start again (Slurm's default: 120 s)
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
StateSaveLocation=$STATE_DIR/slurmctld
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmctldLogFile=$LOG/slurmctld.log
$SLURMD_FILES
$FAST_NODE_FAILURE
PlugStackConfig=$ETC/plugstack.conf
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SchedulerType=sched/backfill
# Try to start batch jobs right at submission (default: within 3 s); several nodes: backfill every second.
SchedulerParameters=batch_sched_delay=0${FAST_NODE_FAILURE:+,bf_interval=1}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# A job without --mem gets its CPUs' share of the node's memory (an --exclusive job: all of it).
DefMemPerCPU=$((MEM_MB / CPUS))
# Make time limits and cleanup bite fast (tests). KillWait: a cancelled or timed-out step has 5 s between
# SIGTERM and SIGKILL to record how it ended (2 s was too short for a loaded 2-core CI machine; Slurm's default: 30 s).
KillWait=5
OverTimeLimit=0
InactiveLimit=0
MinJobAge=30
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCKET
AccountingStorageTRES=gres/gpu
# As a real site: a job whose user has no association with its account is refused at submission.
AccountingStorageEnforce=associations
JobAcctGatherType=jobacct_gather/linux
# No cgroups here: a step over its memory limit is killed when sampled (every second) -> OUT_OF_MEMORY.
JobAcctGatherParams=OverMemoryKill
JobAcctGatherFrequency=task=1
JobCompType=jobcomp/none
Licenses=machine:1
GresTypes=gpu
NodeName=DEFAULT CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:4 State=UNKNOWN
$NODE_LINES
PartitionName=gpu Nodes=$NODE_SET Default=YES MaxTime=1-00:00:00 State=UP
EOF
printf 'AutoDetect=off\nNodeName=%s Name=gpu File=%s/fakegpu/nvidia[0-3]\n' \
    "$NODE_SET" "$STATE_DIR" >"$ETC/gres.conf"
: >"$ETC/plugstack.conf"

# slurmdbd looks for slurmdbd.conf next to SLURM_CONF; it must be 0600.
(umask 077 && cat >"$ETC/slurmdbd.conf" <<EOF
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
)
(umask 077 && cat >"$ETC/mariadb-init.sql" <<EOF
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
EOF
)

{
    echo "# source this file to use the local Slurm cluster in $STATE_DIR"
    printf 'export SLURM_CONF=%q\nexport DLOKIT_SLURM_DIR=%q\n' "$SLURM_CONF" "$STATE_DIR"
} >"$STATE_DIR/env.sh"

# --- daemons --------------------------------------------------------------------------------
launch munged munged -F --force --key-file="$ETC/munge.key" --socket="$MUNGE_SOCKET" \
    --pid-file="$RUN/munged.pid" --seed-file="$RUN/munged.seed"
wait_for 10 munged munge -S "$MUNGE_SOCKET" -n

# Small InnoDB files and lazy flushing: a throw-away accounting DB, bootstrapped in <1 s. Its own tmpdir:
# two clusters bootstrapping at once in /tmp collided on a temporary table's name ("Unknown table").
mkdir -p "$STATE_DIR/mysql-tmp"
DB_OPTS=(--no-defaults --user=root --datadir="$STATE_DIR/mysql" --tmpdir="$STATE_DIR/mysql-tmp" --skip-log-bin
    --performance-schema=OFF --innodb-buffer-pool-size=32M --innodb-log-file-size=8M
    --innodb-flush-log-at-trx-commit=2)
if [[ ! -d "$STATE_DIR/mysql/mysql" ]]; then
    mariadb-install-db "${DB_OPTS[@]}" --auth-root-authentication-method=socket --skip-test-db \
        >"$LOG/mariadb-install.log" 2>&1 || die "mariadb-install-db failed, see $LOG/mariadb-install.log"
fi
launch mariadbd mariadbd "${DB_OPTS[@]}" --socket="$DB_SOCKET" --port="$DB_PORT" \
    --bind-address=127.0.0.1 --skip-name-resolve --pid-file="$RUN/mariadbd.pid" \
    --log-error="$LOG/mariadbd.log" --init-file="$ETC/mariadb-init.sql"
wait_for 60 mariadbd mariadb-admin --no-defaults --socket="$DB_SOCKET" ping

launch slurmdbd slurmdbd -D
wait_for 30 slurmdbd sacctmgr -n list cluster
has_assoc() {
    [[ -n "$(sacctmgr -n -P list assoc user="$USER_NAME" account=dlokit cluster="$CLUSTER" format=user)" ]]
}
if ! has_assoc; then # first start of this STATE_DIR
    sacctmgr -i -Q add cluster "$CLUSTER" >/dev/null || true
    sacctmgr -i -Q add account dlokit Cluster="$CLUSTER" Description=DLO-Kit Organization=dlokit >/dev/null || true
    for u in "$USER_NAME" ${SUDO_USER:+"$SUDO_USER"}; do # also the learner who ran sudo
        sacctmgr -i -Q add user "$u" DefaultAccount=dlokit Account=dlokit Cluster="$CLUSTER" >/dev/null || true
    done
    has_assoc || die "could not create the accounting association for $USER_NAME"
fi

launch_slurmctld
wait_for 30 slurmctld ctld_up
for node in "${NODE_LIST[@]}"; do launch_slurmd "$node"; done
nodes_idle() { [[ "$(sinfo -h -n "$NODE_SET" -o %T)" == idle && "$(sinfo -h -n "$NODE_SET" -o %D)" == "$NODES" ]]; }
wait_for 30 "node(s) $NODE_SET to be idle" nodes_idle
wait_for 30 sacct sacct -n -X -S now-1minute
ready=1
echo "local Slurm ready: source $STATE_DIR/env.sh (node $NODE_SET idle, partition gpu, sacct works)"
