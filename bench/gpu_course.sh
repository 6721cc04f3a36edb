#!/usr/bin/env bash
# Run course notebooks on a lent GPU machine (its own python3 and torch; the kit's other packages as wheels),
# each under its own time limit, and bring back the executed notebooks, their plots and every check's line.
#
#   bash bench/gpu_course.sh OUT 300:notebooks/day1_single_gpu.ipynb     # then Day 4's one-GPU jobs, the doctor
#   bash bench/gpu_course.sh --dry [CARD_GIB]     # on any machine: every command parsed and planned, 0 findings
#
# OUT gets course.tgz (executed notebooks, plots, the runs' records) and verdicts.txt (each notebook's check lines
# and errors, then bench/gpu_day4.py's and the doctor's, also printed last). Wheels: .whl/ at the top of the
# repository (docs/benchmarks.md says how they were made); without them the machine's own packages must do.
# Day 4's notebook needs two GPUs: on one, bench/gpu_day4.py runs its one-GPU paths through the kit and lists what
# needs two with the CPU test that proves it. DAY4_LIMIT (s, default 240) bounds it, DOCTOR_LIMIT (120) the doctor.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--dry" ]; then
    PYTHONPATH=$PWD/helpers:$PWD/tp_scripts:$PWD/tp_scripts/llm exec "${PYTHON:-python3}" bench/gpu_day4.py --dry \
        --card-gib "${2:-141}"
fi
out=$1; shift
if [ -d .whl ] && [ ! -d /tmp/site/submitit ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
fi
# the kit is not installed here: helpers/ (dlokit) and the folders of the scripts' shared packages (common, llm_kit),
# which pyproject.toml installs by name elsewhere
export PYTHONPATH=/tmp/site:$PWD/helpers:$PWD/tp_scripts:$PWD/tp_scripts/llm PYTHONUNBUFFERED=1 MPLBACKEND=Agg
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv,noheader
python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cores", __import__("os").cpu_count())'
for item in "$@"; do
    limit=${item%%:*} notebook=${item#*:}
    start=$SECONDS
    timeout --kill-after=10 "$limit" python3 -m dlokit.course --out output "$notebook"
    echo "$notebook: exit $? after $((SECONDS - start)) s (limit $limit s)"
    pkill -9 -f 'ipykernel_launcher|submitit|tp_scripts/' 2>/dev/null  # what a stopped notebook left running
done 2>&1 | tee "$out/course.log"
card_gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{print $1 / 1024}')
timeout --kill-after=10 "${DAY4_LIMIT:-240}" python3 bench/gpu_day4.py --card-gib "${card_gib:-80}" 2>&1 \
    | tee "$out/day4_one_gpu.log"
timeout --kill-after=10 "${DOCTOR_LIMIT:-120}" python3 -m dlokit doctor --gpus 1 2>&1 | tee "$out/doctor.log"
python3 - output > "$out/verdicts.txt" <<'EOF'
import json, sys
from pathlib import Path
for path in sorted(Path(sys.argv[1]).glob("*.ipynb")):
    print(f"== {path.name}")
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        for output in cell.get("outputs", []):
            text = "".join(output.get("text", [])) or "".join(output.get("data", {}).get("text/plain", []))
            if output.get("output_type") == "error":
                text = f"ERROR {output['ename']}: {output['evalue']}"
            for line in text.splitlines():
                if any(mark in line for mark in ("✅", "❌", "➖", "ERROR", "from Day", "on train_llm")):
                    print(f"[{index}] {line[:300]}")
EOF
# executed notebooks (saved after every cell, so a stopped one comes back up to where it stopped), plots, and the
# runs' small records (their traces and checkpoints would pass the 16 MiB a returned file may have)
tar czf "$out/course.tgz" output $(find notebooks/runs -name '*.json' -size -2M 2>/dev/null) 2>/dev/null
grep -hE '✅|❌|➖|not checked' "$out/day4_one_gpu.log" "$out/doctor.log" >> "$out/verdicts.txt"
cat "$out/verdicts.txt"
