#!/usr/bin/env bash
# Everything the tests need, then every test: the real local Slurm is started by tests/conftest.py
# (scripts/local_slurm/start.sh) and stopped at the end. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --with-slurm --with-browser --with-hub
# Two workers: the tests that need the local Slurm share one of them (one cluster, see tests/conftest.py),
# everything else spreads over both. Local course jobs still run one at a time (device locks).
exec .venv/bin/python -m pytest -q -ra -n 2 --dist loadgroup "$@"
