"""The submission spine on both backends: notebook call -> submitit -> scheduler -> job -> log -> outcome."""
from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest

import dlokit
from dlokit import jobs

JOBS = Path(__file__).parent / "job_scripts"


def script(name: str) -> str:
    return str(JOBS / name)


def json_lines(job_id: str, tasks: int) -> list[dict]:
    card = jobs.find_card(job_id)
    lines = []
    for task in range(tasks):
        text = card.log_path(task).read_text()
        lines += [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return sorted(lines, key=lambda d: d["rank"])


def test_single_task_job_completes(backend):
    [job_id] = dlokit.gpu_jobs_submitter(f"{script('allreduce.py')} --lr 0.1", n_gpu=1, name="single",
                                         time_max="00:02:00")
    [outcome] = dlokit.wait(job_id, timeout_s=120)
    assert outcome.state == "COMPLETED", str(outcome)
    [line] = json_lines(job_id, 1)
    assert line["world_size"] == 1 and line["argv"] == ["--lr", "0.1"]
    assert dlokit.search_log(name="single", contains=job_id)


def test_two_task_job_all_reduces_over_gloo(backend):
    [job_id] = dlokit.gpu_jobs_submitter(script("allreduce.py"), n_gpu=2, name="ddp", time_max="00:02:00")
    [outcome] = dlokit.wait(job_id, timeout_s=120)
    assert outcome.state == "COMPLETED", str(outcome)
    lines = json_lines(job_id, 2)
    assert [line["rank"] for line in lines] == [0, 1]
    assert all(line["world_size"] == 2 and line["sum"] == 3.0 for line in lines)


def test_list_of_commands_makes_one_job_per_combination(backend):
    ids = dlokit.gpu_jobs_submitter([f"{script('allreduce.py')} a", f"{script('allreduce.py')} b"],
                                    n_gpu=[1, 2], name="sweep", time_max="00:02:00")
    assert len(set(ids)) == 4
    outcomes = dlokit.wait(ids, timeout_s=180)
    assert [o.state for o in outcomes] == ["COMPLETED"] * 4, "\n".join(map(str, outcomes))
    seen = {(tuple(json_lines(i, 1)[0]["argv"]), json_lines(i, 1)[0]["world_size"]) for i in ids}
    assert seen == {(("a",), 1), (("b",), 1), (("a",), 2), (("b",), 2)}
    if backend.backend == "slurm":
        assert any("_" in i for i in ids), "same-layout jobs should go as a Slurm job array"


def test_failing_job_reports_traceback(backend):
    [job_id] = dlokit.gpu_jobs_submitter(script("fail.py"), n_gpu=1, name="broken", time_max="00:02:00")
    [outcome] = dlokit.wait(job_id, timeout_s=120)
    assert outcome.state == "FAILED"
    assert "ValueError: no batch here" in outcome.cause
    assert "load_batch" in outcome.cause


def test_out_of_memory_is_named(backend):
    [job_id] = dlokit.gpu_jobs_submitter(script("out_of_memory.py"), n_gpu=1, name="oom", time_max="00:02:00")
    [outcome] = dlokit.wait(job_id, timeout_s=120)
    assert outcome.state == "OUT_OF_MEMORY", str(outcome)
    assert "MemoryError" in outcome.cause


def test_cancelled_job(backend):
    [job_id] = dlokit.gpu_jobs_submitter(script("sleep.py"), n_gpu=1, name="cancelme", time_max="00:05:00")
    deadline = time.time() + 60
    while dlokit.job_outcome(job_id).state != "RUNNING" and time.time() < deadline:
        time.sleep(0.5)
    dlokit.cancel(job_id)
    [outcome] = dlokit.wait(job_id, timeout_s=60)
    assert outcome.state == "CANCELLED"


@pytest.mark.slow
def test_job_past_its_time_limit_times_out(backend):
    limit = "00:00:10" if backend.backend == "local" else "00:01:00"
    [job_id] = dlokit.gpu_jobs_submitter(f"{script('sleep.py')} 600", n_gpu=1, name="late", time_max=limit)
    [outcome] = dlokit.wait(job_id, timeout_s=240)
    assert outcome.state == "TIMEOUT", str(outcome)
    assert "time limit" in outcome.cause


def test_queue_lists_running_jobs_then_returns(backend):
    [job_id] = dlokit.gpu_jobs_submitter(f"{script('sleep.py')} 4", n_gpu=1, name="queued", time_max="00:02:00")
    table = dlokit.job_table("queued")
    assert list(table["job_id"]) == [job_id]
    last = dlokit.display_slurm_queue("queued", timestep=0.5, timeout_s=120)
    assert list(last["job_id"]) == [job_id]
    assert dlokit.job_table("queued").empty
    assert dlokit.job_outcome(job_id).state == "COMPLETED"


def test_batch_script_is_saved_and_viewable(backend):
    [job_id] = dlokit.gpu_jobs_submitter(f"{script('allreduce.py')} --tag x", n_gpu=2, name="shown",
                                         time_max="00:02:00")
    dlokit.wait(job_id, timeout_s=120)
    text = dlokit.show_script(job_id)
    if backend.backend == "slurm":
        assert "#SBATCH --job-name=shown" in text and "#SBATCH --ntasks-per-node=2" in text
        assert "#SBATCH --gres=gpu:2" in text and "srun" in text
    else:
        assert "allreduce.py --tag x" in text


INJECTIONS = ["a b", "it's", '"quoted"', "x; touch {marker}", "$(touch {marker})", "`touch {marker}`",
              "line\ntouch {marker}", "../../{marker}", "--out=../../escape"]


def test_arguments_with_shell_metacharacters_stay_plain_text(backend, workspace):
    marker = workspace / "INJECTED"
    args = [a.format(marker=marker) for a in INJECTIONS]
    typed = dlokit.JobSpec(script=script("allreduce.py"), args=tuple(args), name="inject", time_max="00:02:00")
    [card] = dlokit.submit(typed)
    [from_string] = dlokit.gpu_jobs_submitter(shlex.join([script("allreduce.py"), *args]), name="inject",
                                              time_max="00:02:00")
    for job_id in (card.job_id, from_string):
        [outcome] = dlokit.wait(job_id, timeout_s=120)
        assert outcome.state == "COMPLETED", str(outcome)
        assert json_lines(job_id, 1)[0]["argv"] == args
    assert not marker.exists()
    logs = workspace / "jobs"
    assert all(logs in p.parents for p in logs.rglob("*")) and not (workspace / "escape").exists()
