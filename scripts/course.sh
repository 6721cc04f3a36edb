#!/usr/bin/env bash
# Set up, then run the course headless on the embedded default (this machine), with small
# parameters; executed notebooks and their plots land in output/. Extra arguments go to
# `python -m dlokit.course` (e.g. a notebook path, or -p NAME VALUE).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m dlokit.course --out output "$@"
