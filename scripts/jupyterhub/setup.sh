#!/usr/bin/env bash
# Install what a JupyterHub on the (local) Slurm needs, and optionally create student accounts.
# Usage: scripts/jupyterhub/setup.sh [--users alice,bob] [--home-base DIR] [--group NAME] [--instructors NAME]
#                                    [--slurm-account NAME]
#
# - A virtual environment for the hub AND the students' servers and kernels (DLOKIT_HUB_VENV, default
#   <repo>/.state/jupyterhub/venv): jupyterhub, batchspawner, the Python configurable-http-proxy,
#   JupyterLab and the kit with its pinned packages ('.[notebooks,hub]' with constraints.txt). It is
#   built from /usr/bin/python3 (HUB_PYTHON to change), never from an interpreter under /root, because
#   students run it under their own uid: every folder above it must be world-readable.
# - JupyterLab's news pop-up off for every student (sys-prefix page config).
# - Day 1 and Day 2's default synthetic data set made once in data/generated/ (students cannot write there).
# - With --users (needs root): the Unix group (--group, default dlokit; the hub lets in its members only),
#   the class's shared folder (DLOKIT_HUB_CLASS_DIR, default <repo>/.state/class: runs/ with the race's
#   runs/leaderboard/ and Day 3's runs/hpo/, open to all and setgid for the instructors' group (--instructors,
#   default dlokit-instructors): each student's run records are theirs and the instructors'), one account per
#   name, home in --home-base (default /home), with a copy of notebooks/ and tp_scripts/. The password is
#   $DLOKIT_HUB_PASSWORD (also set for existing accounts), else a random one for each new account, written
#   to $DLOKIT_HUB_DIR/passwords.txt (0600). An existing account is otherwise kept as it is (added to the
#   group; its home made and filled if missing). --slurm-account: each student also gets an association
#   with that account in Slurm's accounting (sacctmgr), which a cluster that enforces them (the local
#   Slurm does) needs before it runs their jobs.
# Safe to run again: each step is skipped when already done.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # REPO, HUB_DIR, VENV, CLASS_DIR (log and die: below)
source "$REPO/scripts/install_packages.sh"
HUB_PYTHON="${HUB_PYTHON:-/usr/bin/python3}"

log() { echo "[jupyterhub setup] $*" >&2; }
die() { log "ERROR: $1"; exit "${2:-1}"; }
usage() { echo "usage: $0 [--users NAME,NAME...] [--home-base DIR] [--group NAME] [--instructors NAME]" \
    "[--slurm-account NAME]" >&2; exit 2; }

users=""; home_base="/home"; group="${DLOKIT_HUB_GROUP:-dlokit}"; instructors="dlokit-instructors"; account=""
while (($#)); do
    case "$1" in
        --users) (($# >= 2)) || usage; users="$2"; shift 2 ;;
        --home-base) (($# >= 2)) || usage; home_base="$2"; shift 2 ;;
        --group) (($# >= 2)) || usage; group="$2"; shift 2 ;;
        --instructors) (($# >= 2)) || usage; instructors="$2"; shift 2 ;;
        --slurm-account) (($# >= 2)) || usage; account="$2"; shift 2 ;;
        -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown option: $1" >&2; usage ;;
    esac
done
name_ok() { [[ "$1" =~ ^[a-z_][a-z0-9_-]{0,31}$ ]]; }
name_ok "$group" || die "--group '$group' is not a valid Unix group name" 2
name_ok "$instructors" || die "--instructors '$instructors' is not a valid Unix group name" 2
[[ -z "$account" || "$account" =~ ^[A-Za-z0-9_.@-]+$ ]] || die "--slurm-account '$account': letters, digits, _ . @ -" 2
IFS=',' read -r -a user_list <<<"$users"
for u in "${user_list[@]}"; do
    name_ok "$u" || die "user name '$u' is not a valid Unix user name (lower-case letters, digits, _ and -)" 2
done
if ((${#user_list[@]})) && [[ "$(id -u)" != 0 ]]; then
    die "--users creates Unix accounts: run as root" 2
fi

# --- the hub's virtual environment ---------------------------------------------------------------
[[ -x "$HUB_PYTHON" ]] || die "$HUB_PYTHON not found (Debian: apt-get install python3 python3-venv; or set HUB_PYTHON)"
"$HUB_PYTHON" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null ||
    die "$HUB_PYTHON is older than Python 3.11"
if [[ ! -x "$VENV/bin/python" ]]; then
    if [[ "$HUB_PYTHON" == /usr/bin/* ]] && command -v dpkg >/dev/null && ! dpkg -s python3-venv >/dev/null 2>&1; then
        [[ "$(id -u)" == 0 ]] || die "Debian's python3-venv is missing: apt-get install python3-venv (as root)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    fi
    mkdir -p "$(dirname "$VENV")"
    "$HUB_PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.dlokit-hub-installed"
wanted="$(cat "$REPO/constraints.txt" "$REPO/pyproject.toml" | sha256sum | cut -c1-16)"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]]; then
    log "installing jupyterhub, batchspawner, the proxy, JupyterLab and the kit into $VENV (about two minutes)"
    install_packages "$VENV" -c "$REPO/constraints.txt" -e "$REPO[notebooks,hub]" || die "the packages could not be installed"
    # the news pop-up would cover the notebook of every student on their first start
    "$VENV/bin/jupyter" labextension disable --level=sys_prefix \
        "@jupyterlab/apputils-extension:announcements" >/dev/null 2>&1 || die "could not turn off JupyterLab's news"
    chmod -R a+rX "$VENV"  # students run it, whatever the umask was
    echo "$wanted" >"$stamp"
fi
if [[ "$(id -u)" == 0 ]] && ! runuser -u nobody -- "$VENV/bin/python" -c \
    'import jupyterhub, importlib.util; assert importlib.util.find_spec("dlokit")' 2>/dev/null; then
    hint="build it elsewhere (DLOKIT_HUB_VENV) or from another Python (HUB_PYTHON)"
    die "students cannot run $VENV/bin/python: a folder above it or its interpreter is not world-readable; $hint"
fi

# --- the course's default data set, made once (the notebooks find it and need no write access) ------
"$VENV/bin/python" -c 'from dlokit.submission.day import synthetic_data; synthetic_data(32, 64)' >/dev/null
chmod -R a+rX "$REPO/data/generated" 2>/dev/null || true  # files of other users stay as they are

# --- student accounts (only when asked) -------------------------------------------------------------
copy_course() {  # copy_course USER HOME: the notebooks and the training scripts, never over the student's own
    local dir
    for dir in notebooks tp_scripts; do
        [[ -e "$2/$dir" ]] && continue
        tar -C "$REPO" --exclude=runs --exclude=dlokit_jobs --exclude=.ipynb_checkpoints --exclude=__pycache__ \
            -cf - "$dir" | tar -C "$2" -xf -  # the course's files, not what ran here
        chown -R "$1:" "$2/$dir"
    done
}
if ((${#user_list[@]})); then
    getent group "$group" >/dev/null || groupadd "$group"
    getent group "$instructors" >/dev/null || groupadd "$instructors"
    mkdir -p "$HUB_DIR" "$home_base"
    # every student writes run records, leaderboard entries and Optuna journals here; a run record is its
    # student's and the instructors' (the kit makes it 0750 in a setgid folder), the leaderboard everyone's
    install -d -m 0755 "$CLASS_DIR"
    for dir in "$CLASS_DIR/runs" "$CLASS_DIR/runs/leaderboard" "$CLASS_DIR/runs/hpo"; do
        install -d -g "$instructors" -m 3777 "$dir"
    done
    for u in "${user_list[@]}"; do
        password="${DLOKIT_HUB_PASSWORD:-}"
        if ! getent passwd "$u" >/dev/null; then
            useradd --create-home --home-dir "$home_base/$u" --shell /bin/bash --user-group "$u"
            log "created user $u (home $home_base/$u)"
            if [[ -z "$password" ]]; then
                password="$(od -An -N9 -tx1 /dev/urandom | tr -d ' \n')"
                (umask 077 && echo "$u $password" >>"$HUB_DIR/passwords.txt")
                log "password of $u written to $HUB_DIR/passwords.txt"
            fi
        fi
        [[ -z "$password" ]] || echo "$u:$password" | chpasswd  # on stdin: never on a command line
        usermod -a -G "$group" "$u"
        home="$(getent passwd "$u" | cut -d: -f6)"
        [[ -d "$home" ]] || install -d -o "$u" -g "$(id -gn "$u")" -m 0750 "$home"
        copy_course "$u" "$home"
        if [[ -n "$account" ]]; then
            sacctmgr -i -Q add user "$u" Account="$account" DefaultAccount="$account" >/dev/null ||
                die "could not give $u an association with Slurm account $account (is slurmdbd up, the account there?)"
        fi
    done
fi
log "ready: $VENV (start the hub with scripts/jupyterhub/start.sh)"
