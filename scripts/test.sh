#!/usr/bin/env bash
# Everything the tests need, then every test: the real local Slurm is started by tests/conftest.py
# (scripts/local_slurm/start.sh) and stopped at the end. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --with-slurm --with-browser
exec .venv/bin/python -m pytest -q -ra "$@"
