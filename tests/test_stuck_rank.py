"""A rank that cannot reach the next collective ends its job within seconds, with the cause named, instead of
holding it until gloo's 300 s timeout and then the job's time limit (the Day 2 hang of 2026-11-25).

tests/job_scripts/stuck_rank.py runs the solution's train_classifier.py with rank 0's validation pass stuck:
frozen (its process runs no Python: a deadlock holding the GIL) or live (its threads run, its main thread never
gets further). The jobs go through the kit's real local launcher, on 2 CPU processes.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import dlokit
from dlokit.analysis import load_run

REPO = Path(__file__).resolve().parents[1]
STUCK = REPO / "tests" / "job_scripts" / "stuck_rank.py"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stuck") / "data"
    subprocess.run([sys.executable, str(REPO / "data" / "make_synthetic_imagenet.py"), "--out", str(folder),
                    "--classes", "2", "--train-per-class", "16", "--val-per-class", "4", "--size", "40", "--quiet"],
                   check=True)
    return folder


def run_stuck(data, *options) -> tuple[str, float]:
    command = [str(STUCK), "--stuck-rank", "0", *options, "--data", str(data), "--model", "mobilenet_v3_small",
               "--image-size", "32", "--batch-size", "4", "--epochs", "2", "--num-workers", "1"]
    started = time.monotonic()
    (job,) = dlokit.gpu_jobs_submitter(" ".join(command), n_gpu=2, name="stuck", time_max="00:10:00", verbose=False)
    dlokit.wait([job], poll_s=0.5, timeout_s=240)
    return job, time.monotonic() - started


@pytest.mark.slow
def test_a_frozen_rank_is_named_and_the_job_ends(workspace, data):
    dlokit.use_profile("local")
    job, seconds = run_stuck(data, "--frozen")
    outcome = dlokit.job_outcome(job)
    assert outcome.state == "FAILED", outcome
    assert seconds < 150, f"the job took {seconds:.0f} s: it waited for a timeout"  # vs 300 s + the time limit
    run = load_run(job)
    error = run.ranks[1]["summary"]["error"]
    assert "the job is stuck: rank 0 has not answered" in error and "frozen" in error, error
    assert "rank 0 has not answered" in outcome.cause and "kill-on-bad-exit" in outcome.cause
    # the stuck rank was stopped with SIGABRT first: its log says where each of its threads was
    log = Path(dlokit.submission.jobs.find_card(job).log_path(0, err=True)).read_text()
    assert "in stuck_evaluate" in log and "Current thread" in log


@pytest.mark.slow
def test_ranks_that_all_wait_are_a_stuck_job_named_by_where_each_one_is(workspace, data):
    dlokit.use_profile("local")
    job, seconds = run_stuck(data, "--stall-s", "8")
    assert dlokit.job_outcome(job).state == "FAILED"
    run = load_run(job)
    errors = {rank: record["summary"]["error"] for rank, record in run.ranks.items()}
    assert set(errors) == {0, 1}  # the stuck rank's own thread still ran: it recorded the cause too
    stuck = next(e for e in errors.values() if e.startswith("the job is stuck"))
    assert "no rank got any further for" in stuck and "validation (all-reduce of its sums)" in stuck, stuck
    assert all("stuck" in e for e in errors.values()), errors
    assert seconds < 120, f"the job took {seconds:.0f} s"


@pytest.mark.slow
def test_day2_curve_configuration_never_hangs(workspace, data):
    """Day 2's curve training (2 ranks, 3 epochs, the tuned loader: workers, pinning, prefetching, persistent
    workers; validation after each epoch) hung once at the end of its first epoch (a forked DataLoader worker
    deadlocked, CPython gh-112275: image_data.worker_start now uses a forkserver). Twice here: every run
    completes, and none comes near the watch's limits (a hang would now end it, named, within seconds)."""
    dlokit.use_profile("local")
    options = ["--num-workers", "2", "--pin-memory", "--non-blocking", "--prefetch-factor", "4", "--persistent-workers"]
    command = [str(REPO / "tp_scripts" / "solutions" / "train_classifier.py"), "--data", str(data), "--model",
               "mobilenet_v3_small", "--image-size", "32", "--batch-size", "4", "--epochs", "3", *options]
    jobs = dlokit.gpu_jobs_submitter([" ".join(command)] * 2, n_gpu=2, name="curves", time_max="00:05:00",
                                     verbose=False)
    outcomes = dlokit.wait(jobs, poll_s=0.5, timeout_s=400)
    assert [o.state for o in outcomes] == ["COMPLETED"] * 2, [str(o) for o in outcomes]
    for job in jobs:
        run = load_run(job)
        assert run.state == "completed" and len(run.lines("val")) == 3, run.describe_state()
