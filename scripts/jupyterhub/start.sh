#!/usr/bin/env bash
# Start the course's JupyterHub (as root) in the background; returns once it answers.
# Usage: scripts/jupyterhub/start.sh        then open http://127.0.0.1:8000 ; stop: scripts/jupyterhub/stop.sh
#
# Needs scripts/jupyterhub/setup.sh done and a Slurm whose SLURM_CONF is exported (else the local one:
# source ${DLOKIT_SLURM_DIR:-<repo>/.state/slurm}/env.sh). Settings (environment, defaults in brackets):
#   DLOKIT_HUB_DIR [<repo>/.state/jupyterhub]   database, cookie secret, pid files, jupyterhub.log
#   DLOKIT_HUB_VENV [<repo>/.state/jupyterhub/venv]   the environment setup.sh made
#   DLOKIT_HUB_CLASS_DIR [<repo>/.state/class]   the class's run records and leaderboard (setup.sh --users makes it)
#   DLOKIT_HUB_CONFIG [scripts/jupyterhub/jupyterhub_config.py]
#   DLOKIT_HUB_IP [127.0.0.1], DLOKIT_HUB_PORT [8000]   the address students open
#   DLOKIT_HUB_API_PORT [8081], DLOKIT_HUB_PROXY_API_PORT [8001]; DLOKIT_HUB_GROUP [dlokit],
#   DLOKIT_HUB_ADMINS, DLOKIT_HUB_PROFILE [local-slurm], DLOKIT_HUB_PARTITION, DLOKIT_HUB_RUNTIME:
#   read by the config file.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/common.sh"
[[ "$(id -u)" == 0 ]] || die "run as root: the hub checks Unix passwords and submits each server as its student"
[[ -x "$VENV/bin/jupyterhub" ]] || die "no hub environment in $VENV: run scripts/jupyterhub/setup.sh first"
[[ -r "$CONFIG" ]] || die "config file $CONFIG not found"

if pid="$(hub_pid)"; then
    log "already running (pid $pid): $URL"
    exit 0
fi

use_slurm
sinfo -h >/dev/null 2>&1 || die "Slurm does not answer (sinfo failed with SLURM_CONF=$SLURM_CONF)"
# the students' servers run sbatch/squeue as the students: the cluster's config must be readable by them
runuser -u nobody -- test -r "$SLURM_CONF" ||
    die "students cannot read $SLURM_CONF: a folder above it is not world-searchable (chmod o+x)"
[[ -d "$CLASS_DIR/runs" ]] || die "no class folder $CLASS_DIR/runs: run scripts/jupyterhub/setup.sh --users ... first"
runuser -u nobody -- test -x "$CLASS_DIR/runs" ||
    die "students cannot reach $CLASS_DIR/runs: a folder above it is not world-searchable (chmod o+x)"
for port in "$PORT" "$API_PORT" "$PROXY_API_PORT"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        die "port $port is in use; set DLOKIT_HUB_PORT / DLOKIT_HUB_API_PORT / DLOKIT_HUB_PROXY_API_PORT"
    fi
done

mkdir -p "$HUB_DIR"
# The hub's own files (cookie secret, database, log) are root's alone: umask 077 and 0600. The folder
# itself stays searchable (0711, not listable): the default hub environment that students run lives in it
# (a 0700 folder made every student's server fail at once with "Permission denied").
umask 077
chmod 711 "$HUB_DIR"
for file in jupyterhub.sqlite jupyterhub_cookie_secret jupyterhub.log passwords.txt; do
    [[ ! -e "$HUB_DIR/$file" ]] || chmod 600 "$HUB_DIR/$file"
done
runuser -u nobody -- test -x "$VENV/bin/jupyterhub-singleuser" ||
    die "students cannot run $VENV/bin/jupyterhub-singleuser: a folder above it is not world-searchable (chmod o+x)"
export DLOKIT_HUB_DIR="$HUB_DIR" DLOKIT_HUB_VENV="$VENV" DLOKIT_HUB_PORT="$PORT" DLOKIT_HUB_API_PORT="$API_PORT"
export DLOKIT_HUB_PROXY_API_PORT="$PROXY_API_PORT" DLOKIT_HUB_CLASS_DIR="$CLASS_DIR" PATH="$VENV/bin:$PATH"
(cd "$HUB_DIR" && exec setsid "$VENV/bin/jupyterhub" -f "$CONFIG" </dev/null >>"$HUB_LOG" 2>&1) &
hub=$!

for _ in $(seq 600); do  # 60 s
    if ! kill -0 "$hub" 2>/dev/null; then
        tail -n 30 "$HUB_LOG" >&2
        die "the hub exited (log above, all of it in $HUB_LOG)"
    fi
    if "$VENV/bin/python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
        "http://127.0.0.1:$PORT/hub/api" 2>/dev/null; then
        log "JupyterHub ready: $URL (log $HUB_LOG)"
        exit 0
    fi
    sleep 0.1
done
tail -n 30 "$HUB_LOG" >&2
"$HERE/stop.sh"
die "the hub did not answer within 60 s (log above, all of it in $HUB_LOG)"
