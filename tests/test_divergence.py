"""A loss above chance after the warm-up is named by one rule (dlokit.in_job.divergence): in the step line the
script prints, which the queue shows on its own line, and in the checks."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
from tiny_data import tiny_folder

import dlokit
from dlokit import checks
from dlokit.in_job.divergence import diverging
from dlokit.submission.queue import COLUMNS, _table_html

REPO = Path(__file__).resolve().parents[1]


def test_the_rule_judges_a_step_after_the_warm_up_against_ln_classes():
    note = diverging(13.4, step=5, num_classes=10, lr_peak=0.081)
    assert note.startswith("diverging: loss 13.4 at step 5, above chance ln(10)=2.30; the peak lr 0.081")
    assert diverging(math.nan, step=5, num_classes=10) is not None
    assert diverging(2.5, step=5, num_classes=10) is None  # an untrained network starts a little above chance
    assert diverging(13.4, step=3, num_classes=10) is None  # its first steps
    assert diverging(13.4, step=5, num_classes=10, warmup_steps=5) is None
    assert diverging(13.4, step=6, num_classes=10, warmup_steps=5) is not None
    assert diverging(13.4, step=5, num_classes=None) is None


def test_a_diverging_run_is_named_in_its_step_line_the_queue_and_the_check(tmp_path, monkeypatch):
    data = tiny_folder(tmp_path / "data", val_per_class=0)
    runs = tmp_path / "runs"
    env = {**os.environ, "DLOKIT_RUN_ID": "hot", "DLOKIT_RUNS_DIR": str(runs), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-u", str(REPO / "tp_scripts" / "solutions" / "train_classifier.py"), "--data",
               str(data), "--model", "resnet18", "--image-size", "32", "--batch-size", "8", "--test",
               "--test-nsteps", "6", "--print-every", "1", "--num-workers", "0", "--lr", "50"]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    last = [line for line in out.stdout.splitlines() if line.startswith("step ")][-1]
    assert "| diverging: loss " in last and "at step 6, above chance ln(4)=1.39; the peak lr 50 " in last, last

    row = dict(job_id="7", name="alice", state="RUNNING", elapsed="00:00:03", time_limit="00:10:00", nodes=1,
               node_list="localhost", last_log_line=last)
    page = _table_html(pd.DataFrame([row], columns=COLUMNS), "alice")
    assert '<br><span class="dlokit-diverging">diverging: loss ' in page

    monkeypatch.setenv("DLOKIT_RUNS_DIR", str(runs))
    monkeypatch.setenv("DLOKIT_LOG_DIR", str(tmp_path / "jobs"))
    dlokit.use_profile("local")
    result = checks.completed("hot")
    assert result.passed and result.message.startswith("1 run(s) completed, but run hot: diverging: loss "), result
