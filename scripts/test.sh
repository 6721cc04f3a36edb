#!/usr/bin/env bash
# Everything the tests need, then every test: the real local Slurm is started by tests/conftest.py
# (scripts/local_slurm/start.sh) and stopped at the end. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --with-slurm --with-browser --with-hub

# pytest exits 5 when a selection holds no test (e.g. a file given on the command line has no `alone` test).
run_pytest() { .venv/bin/python -m pytest -q -ra "$@" || { code=$?; [ "$code" -eq 5 ] || return "$code"; }; }

# Two workers: the tests that need the local Slurm share one of them (one cluster, see tests/conftest.py),
# everything else spreads over both. Local course jobs still run one at a time (device locks).
run_pytest -n 2 --dist loadgroup -m "not alone" "$@"
# Then the tests that measure wall-clock time (marker `alone`), one at a time, with the cores to themselves.
run_pytest -m alone "$@"
