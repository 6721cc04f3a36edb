#!/usr/bin/env bash
# Stop the local Slurm cluster of STATE_DIR (see start.sh). Idempotent; logs stay.
# Usage: scripts/local_slurm/stop.sh [STATE_DIR]
#        scripts/local_slurm/stop.sh STATE_DIR slurmctld|slurmdbd|slurmd|slurmd:NODE...   only these daemons,
#        jobs kept (a controller outage: restart.sh STATE_DIR slurmctld brings it back, with every job)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "${1:-}"
if (($# > 1)); then
    shift
    for name in "$@"; do
        case "$name" in
        slurmctld | slurmdbd) stop_daemon "$name" ;;
        slurmd) for node in $(node_names); do stop_daemon "$(slurmd_daemon "$node")"; done ;;
        slurmd:?*)
            has_node "${name#slurmd:}" || die "no node '${name#slurmd:}' (nodes: $(node_names | tr '\n' ' '))"
            stop_daemon "$(slurmd_daemon "${name#slurmd:}")"
            ;;
        *) die "stop.sh stops slurmctld, slurmdbd, slurmd or slurmd:NODE, not '$name'" ;;
        esac
    done
    exit 0
fi

# Cancel jobs while slurmctld is still up, so accounting records them as CANCELLED.
if daemon_pid slurmctld >/dev/null; then
    job_ids="$(squeue -h -o %A 2>/dev/null || true)"
    if [[ -n "$job_ids" ]]; then
        # shellcheck disable=SC2086
        scancel $job_ids 2>/dev/null || true
        for i in $(seq 50); do
            [[ -z "$(squeue -h -o %A 2>/dev/null || true)" ]] && break
            sleep 0.1
        done
    fi
fi

# slurmd ignores SIGTERM while slurmctld is gone, so stop every node's first, then the rest backwards.
for pid_file in "$RUN"/slurmd*.pid; do
    [[ -e "$pid_file" ]] && stop_daemon "$(basename "$pid_file" .pid)"
done
for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
    stop_daemon "${DAEMONS[$i]}"
done
# Nodes of a multi-node cluster: whatever is left in a node's namespace (a job step, its tasks).
for uts_file in "$RUN"/slurmd-*.uts; do
    [[ -e "$uts_file" ]] || continue
    kill_namespace "$(cat "$uts_file")" || true
    rm -f "$uts_file"
done

# Job steps (slurmstepd, which inherit our SLURM_CONF) outlive slurmd; kill any left over
# together with their tasks (same session).
for pid in $(pgrep -x slurmstepd 2>/dev/null || true); do
    step_env="$(tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ")" || continue
    [[ $'\n'"$step_env"$'\n' == *$'\n'"SLURM_CONF=$SLURM_CONF"$'\n'* ]] || continue
    sid="$(ps -o sid= -p "$pid" | tr -d ' ')"
    [[ -n "$sid" && "$sid" != "$(ps -o sid= -p $$ | tr -d ' ')" ]] || continue
    log "killing leftover job step session $sid"
    pkill -KILL -s "$sid" || true
done
exit 0
