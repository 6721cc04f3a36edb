#!/usr/bin/env bash
# Everything the tests need, then every test: the real local Slurm is started by tests/conftest.py
# (scripts/local_slurm/start.sh) and stopped at the end. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --with-slurm --with-browser --with-hub

# pytest exits 5 when a selection holds no test (e.g. a file given on the command line has no `alone` test).
run_pytest() { .venv/bin/python -m pytest -q -ra "$@" || { code=$?; [ "$code" -eq 5 ] || return "$code"; }; }

# Two workers (CI has two cores; a third made the suite slower and the browser tests time out). Each
# worker starts its own local Slurm when a test needs one (the two-node cluster's tests share one worker:
# tests/conftest.py). The notebooks' course jobs take turns for the CPU (device locks).
run_pytest -n 2 --dist loadgroup -m "not alone" --durations=30 "$@"
# Then the tests that measure wall-clock time (marker `alone`), one at a time, with the cores to themselves.
run_pytest -m alone "$@"
