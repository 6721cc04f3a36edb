"""The course's real training scripts as multi-task jobs on the real local Slurm, through the kit:
one srun task per (fake) GPU, ranks from the Slurm environment, gloo on CPU."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dlokit
from dlokit.analysis import load_run

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = REPO / "tp_scripts" / "solutions"


@pytest.fixture
def on_slurm(slurm_cluster, workspace):
    return dlokit.use_profile("local-slurm")


@pytest.fixture(scope="module")
def tiny_images(tmp_path_factory):
    root = tmp_path_factory.mktemp("images") / "tiny"
    subprocess.run([sys.executable, str(REPO / "data" / "make_synthetic_imagenet.py"), "--out", str(root),
                    "--classes", "4", "--train-per-class", "12", "--val-per-class", "4", "--size", "40",
                    "--quiet"], check=True)
    return root


def test_image_ddp_as_a_two_task_slurm_job(on_slurm, tiny_images):
    command = (f"{SOLUTIONS / 'train_classifier.py'} --data {tiny_images} --model resnet18 --image-size 32 "
               "--batch-size 4 --epochs 1 --metric-step 2")
    [job_id] = dlokit.gpu_jobs_submitter(command, n_gpu=2, name="ddp", time_max="00:05:00")
    [outcome] = dlokit.wait(job_id, timeout_s=300)
    assert outcome.state == "COMPLETED", str(outcome)
    run = load_run(job_id)
    assert run.state == "completed" and run.world_size == 2 and len(run.ranks) == 2
    for summary in run.summaries:
        assert summary["params_identical_across_ranks"] is True
        assert summary["observed"]["ddp_world_size"] == 2
    assert run.info["config"]["launcher"] == "torchrun"  # exported by the kit's task wrapper from Slurm's env
    assert run.info["name"] == "ddp"


def test_llm_fsdp_as_a_two_task_slurm_job(on_slurm):
    command = f"{REPO / 'tp_scripts' / 'llm' / 'solutions' / 'train_llm.py'} --mode fsdp --config tiny --steps 3"
    [job_id] = dlokit.gpu_jobs_submitter(command, n_gpu=2, name="fsdp", time_max="00:05:00")
    [outcome] = dlokit.wait(job_id, timeout_s=300)
    assert outcome.state == "COMPLETED", str(outcome)
    run = load_run(job_id)
    assert run.state == "completed" and run.world_size == 2 and len(run.ranks) == 2


def test_image_ddp_killed_by_scancel_resumes_from_its_checkpoint(on_slurm, tiny_images):
    """A 2-task job cancelled after a checkpoint; a new job with --resume goes on from that step."""
    common = (f"{SOLUTIONS / 'train_classifier.py'} --data {tiny_images} --model resnet18 --image-size 32 "
              "--batch-size 4 --epochs 3 --num-workers 0 --print-every 1")
    [first] = dlokit.gpu_jobs_submitter(f"{common} --checkpoint-steps 2", n_gpu=2, name="victim",
                                        time_max="00:05:00")
    metrics = dlokit.submission.jobs.find_card(first).run_dir / "rank0" / "metrics.jsonl"
    deadline = time.time() + 240
    while '"checkpoint_saved"' not in (metrics.read_text() if metrics.exists() else ""):
        assert time.time() < deadline and not dlokit.job_outcome(first).finished, "no checkpoint was written"
        time.sleep(0.5)
    dlokit.cancel(first)
    assert dlokit.wait(first, timeout_s=120)[0].state == "CANCELLED"
    saved = [json.loads(line) for line in metrics.read_text().splitlines() if '"checkpoint_saved"' in line]

    run_dir = dlokit.submission.jobs.find_card(first).run_dir
    [second] = dlokit.gpu_jobs_submitter(f"{common} --resume {run_dir}", n_gpu=2, name="resumed",
                                         time_max="00:05:00")
    [outcome] = dlokit.wait(second, timeout_s=300)
    assert outcome.state == "COMPLETED", str(outcome)
    run = load_run(second)
    assert run.summary["resumed_from_step"] >= saved[0]["step"]
    assert run.summary["steps"] == run.info["config"]["total_steps"]
    assert all(summary["params_identical_across_ranks"] for summary in run.summaries)
