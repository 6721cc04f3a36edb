"""Run records survive what kills runs: uncaught errors and a kill in the middle of a line."""
import json
import subprocess
import sys
import time

from dlokit.in_job.runrecord import RunRecorder, read_rank

DIES_OF_OOM = """
from dlokit.in_job.runrecord import RunRecorder
record = RunRecorder({"batch_size": 4096}, runs_dir="runs", run_id="big")
record.log("step", step=1, loss=2.0)
raise MemoryError("the allocator gave up")
"""


def test_uncaught_error_still_writes_a_failed_summary(tmp_path):
    result = subprocess.run([sys.executable, "-c", DIES_OF_OOM], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 1 and "MemoryError" in result.stderr
    rank0 = read_rank(tmp_path / "runs" / "big" / "rank0")
    assert rank0["state"] == "failed"
    assert rank0["summary"]["error"] == "MemoryError: the allocator gave up"
    assert [m["step"] for m in rank0["metrics"]] == [1]


def test_half_written_last_line_is_skipped_and_reported(tmp_path):
    record = RunRecorder({}, runs_dir=tmp_path, run_id="cut")
    for step in range(3):
        record.log("step", step=step)
    with open(record.folder / "metrics.jsonl", "a") as handle:
        handle.write('{"kind": "step", "st')
    rank0 = read_rank(record.folder)
    assert rank0["truncated"] and rank0["state"] == "running or killed"
    assert [m["step"] for m in rank0["metrics"]] == [0, 1, 2]
    assert json.loads((record.folder / "run.json").read_text())["run_id"] == "cut"


def _burn_then_wait(seconds, burned):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    burned.set()
    time.sleep(60)  # alive when the summary is taken: never waited for


def test_own_cpu_counts_descendants_this_process_never_waits_for():
    """The DataLoader workers of a multi-rank job are a forkserver's children (image_data.worker_start): the rank
    never waits for them, os.times leaves them out, yet their CPU time is the run's own, not other work's."""
    import multiprocessing

    from dlokit.in_job.runrecord import CpuUse

    context = multiprocessing.get_context("forkserver")
    use = CpuUse()
    burned = context.Event()
    worker = context.Process(target=_burn_then_wait, args=(0.6, burned), daemon=True)
    worker.start()
    try:
        assert burned.wait(60)
        summary = use.summary()
        assert worker.is_alive() and summary["own_cpu_s"] >= 0.5, summary
    finally:
        worker.kill()


def test_a_step_line_and_an_out_of_memory_end_read_as_the_analysis_reads_them(tmp_path):
    """The one surface: step() writes what the analysis reads as a step, out_of_memory() the "oom" event and a
    summary whose run the tables mark oom (the language model's status "oom", the classifier's "failed")."""
    from dlokit.analysis.run import load_run

    for run_id, status in (("llm", "oom"), ("classifier", "failed")):
        record = RunRecorder({"batch_size": 8}, runs_dir=tmp_path, run_id=run_id)
        record.step(step=1, t_step=0.5, t_data=0.1, batch_size=8)
        record.out_of_memory("OutOfMemoryError: 2 GiB", status=status, event={"step": 2}, failed_step=2)
        rank0 = read_rank(record.folder)
        assert [(m["kind"], m.get("step")) for m in rank0["metrics"]] == [("step", 1), ("event", 2)]
        assert rank0["metrics"][1] | {"time": 0} == {"kind": "event", "event": "oom", "error": "OutOfMemoryError: 2 GiB",
                                                     "step": 2, "time": 0}
        assert rank0["state"] == status and rank0["summary"]["oom"] is True and rank0["summary"]["failed_step"] == 2
        run = load_run(run_id, runs_dir=tmp_path)
        assert run.oom and run.error == "OutOfMemoryError: 2 GiB"


def test_jobs_numbered_alike_on_two_clusters_get_two_run_ids():
    from dlokit.in_job.jobenv import slurm_run_id

    assert slurm_run_id({"SLURM_JOB_ID": "3", "SLURM_CLUSTER_NAME": "Alpha"}) == "3@alpha"
    assert slurm_run_id({"SLURM_JOB_ID": "3", "SLURM_CLUSTER_NAME": "beta"}) == "3@beta"
    assert slurm_run_id({"SLURM_JOB_ID": "9", "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "2",
                         "SLURM_CLUSTER_NAME": "beta"}) == "7_2@beta"
    assert slurm_run_id({"SLURM_JOB_ID": "3"}) == "3"  # a Slurm that names no cluster
