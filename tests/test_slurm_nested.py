"""A notebook that itself runs inside a Slurm job (JupyterHub with a Slurm spawner does this) submits
multi-task jobs that are jobs of their own, not steps of the notebook's allocation."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "job_scripts" / "whoami.py"

SUBMIT_FROM_INSIDE = f"""
import json, os
import dlokit
from dlokit.submission import jobs
# the local Slurm has one node: measurement jobs would ask for it whole (--exclusive) and wait for this one
dlokit.use_profile("local-slurm", exclusive_measurements=False)
ids = dlokit.gpu_jobs_submitter({str(SCRIPT)!r}, n_gpu=2, name="nested", time_max="00:02:00", verbose=False)
[outcome] = dlokit.wait(ids, timeout_s=150)
card = jobs.find_card(ids[0])
lines = [json.loads(l) for t in range(2) for l in card.log_path(t).read_text().splitlines() if l.startswith("{{")]
print("RESULT " + json.dumps({{"parent": os.environ["SLURM_JOB_ID"], "id": ids[0], "state": outcome.state,
                              "lines": lines}}))
"""


@pytest.mark.slurm
def test_a_multi_task_job_submitted_from_inside_an_allocation(slurm_cluster, workspace):
    done = subprocess.run(["srun", "--nodes=1", "--ntasks=1", "--cpus-per-task=1", "--time=5", "--partition=gpu",
                           sys.executable, "-c", SUBMIT_FROM_INSIDE], capture_output=True, text=True, timeout=240,
                          cwd=workspace, env=os.environ)
    result = next((json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert result, f"no result:\n{done.stdout}\n{done.stderr}"
    assert result["state"] == "COMPLETED", result
    lines = result["lines"]
    assert sorted(line["rank"] for line in lines) == [0, 1] and all(line["sum"] == 2.0 for line in lines)
    assert {line["job"] for line in lines} == {result["id"]} != {result["parent"]}, \
        "the tasks must run in their own job, without the parent's job id variables"
