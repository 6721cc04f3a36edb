#!/usr/bin/env bash
# Set up DLO-Kit on this machine: a virtual environment in .venv with the pinned packages, the kit
# installed editable, and (with --with-slurm / --with-browser) the Debian packages the tests need;
# --with-hub also builds the JupyterHub environment (scripts/jupyterhub/setup.sh).
# Safe to run again: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

with_slurm=0; with_browser=0; with_hub=0
for arg in "$@"; do
  case "$arg" in
    --with-slurm) with_slurm=1 ;;
    --with-browser) with_browser=1 ;;
    --with-hub) with_hub=1 ;;
    *) echo "usage: $0 [--with-slurm] [--with-browser] [--with-hub]" >&2; exit 2 ;;
  esac
done

apt_install() {  # install Debian packages that are missing (needs root, as in CI)
  local missing=()
  # installed, not merely known to dpkg (a removed package keeps "deinstall ok config-files" and dpkg -s says 0)
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: please install these Debian packages (needs root): ${missing[*]}" >&2; exit 1
  fi
  echo "setup: apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# environment-modules: the `module` command of a cluster's login node and nodes (tests/test_doctor.py loads one)
[ "$with_slurm" = 1 ] && apt_install slurmctld slurmd slurm-client slurmdbd munge mariadb-server environment-modules
[ "$with_browser" = 1 ] && apt_install chromium
# torch.compile on the CPU builds its kernels with a C++ compiler (Day 3); without one those cells say they skip
if ! command -v "${CXX:-g++}" >/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then apt_install g++
  else echo "setup: no C++ compiler (${CXX:-g++}): the torch.compile cells will be skipped; install g++ to run them" >&2; fi
fi

source scripts/install_packages.sh
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=.venv/.dlokit-installed
wanted=$(cat constraints.txt pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  echo "setup: installing pinned Python packages into .venv (torch is large: under a minute)"
  install_packages .venv -c constraints.txt -e '.[notebooks,test]' || exit 1
  echo "$wanted" > "$stamp"
fi
# the hub's own venv (students cannot run .venv's Python); if it cannot be built, only the hub test fails
[ "$with_hub" = 1 ] && { bash scripts/jupyterhub/setup.sh ||
  echo "setup: the JupyterHub environment could not be set up (above): tests/test_jupyterhub.py will fail" >&2; }
echo "setup: ready ($(.venv/bin/python -c 'import torch, dlokit; print("torch", torch.__version__, "| dlokit", dlokit.__version__)'))"
