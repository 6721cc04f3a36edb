"""The submission spine on both backends: notebook call -> submitit -> scheduler -> job -> log -> outcome."""
from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

import pytest

import dlokit
from dlokit.submission import jobs
from dlokit.submission.submit import submit
from dlokit.in_job.runrecord import read_rank

JOBS = Path(__file__).parent / "job_scripts"
REPO = Path(__file__).resolve().parents[1]


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
    seen = [(tuple(json_lines(i, 1)[0]["argv"]), json_lines(i, 1)[0]["world_size"]) for i in ids]
    assert seen == [(("a",), 1), (("a",), 2), (("b",), 1), (("b",), 2)]  # the ids in the order asked for
    if backend.backend == "local":  # first come, first served: they ran in that order too, not grouped by size
        started = [json_lines(i, 1)[0]["at_unix"] for i in ids]
        assert started == sorted(started)
    # below the ephemeral ports (a rendezvous port drawn there was once taken by another connection)
    assert all(json_lines(i, 1)[0]["master_port"] < 32768 for i in ids)
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


# The end of job 59's error log on the local Slurm under load (2026-11-26): its task had failed when the time
# limit came, and submitit logged the signal after the traceback; Slurm's accounting then said FAILED.
SIGNAL_AFTER_TRACEBACK = """submitit.core.utils.FailedJobError
srun: error: vm: task 0: Exited with exit code 1
srun: launch/slurm: _step_signal: Terminating StepId=59.0
submitit WARNING (2026-11-26 19:07:50,624) - Bypassing signal SIGCONT
submitit INFO (2026-11-26 19:07:50,627) - Job has timed out. Ran 1 minutes out of requested 1 minutes.
submitit WARNING (2026-11-26 19:07:50,627) - Caught signal SIGUSR2 on vm: this job is timed-out.
submitit INFO (2026-11-26 19:07:50,627) - Job not requeued because: timed-out and not checkpointable.
"""


def test_a_job_whose_time_limit_signal_came_after_its_traceback_reads_timeout(workspace):
    [job_id] = dlokit.gpu_jobs_submitter(script("fail.py"), n_gpu=1, name="raced", time_max="00:02:00")
    [outcome] = dlokit.wait(job_id, timeout_s=120)
    assert outcome.state == "FAILED" and "no batch here" in outcome.cause  # the script's own error
    with open(jobs.find_card(job_id).log_path(0, err=True), "a") as log:
        log.write(SIGNAL_AFTER_TRACEBACK)
    outcome = dlokit.job_outcome(job_id)
    assert outcome.state == "TIMEOUT" and "time limit" in outcome.cause, str(outcome)


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
        # the local Slurm has fewer cores than fake GPUs: --overcommit and --ntasks (see profiles.toml)
        assert "#SBATCH --job-name=shown" in text and "#SBATCH --ntasks=2" in text and "#SBATCH --overcommit" in text
        assert "#SBATCH --gres=gpu:2" in text and "srun" in text
    else:
        assert "allreduce.py --tag x" in text


INJECTIONS = ["a b", "it's", '"quoted"', "x; touch {marker}", "$(touch {marker})", "`touch {marker}`",
              "line\ntouch {marker}", "../../{marker}", "--out=../../escape"]


def test_arguments_with_shell_metacharacters_stay_plain_text(backend, workspace):
    marker = workspace / "INJECTED"
    args = [a.format(marker=marker) for a in INJECTIONS]
    typed = dlokit.JobSpec(script=script("allreduce.py"), args=tuple(args), name="inject", time_max="00:02:00")
    [card] = submit(typed)
    [from_string] = dlokit.gpu_jobs_submitter(shlex.join([script("allreduce.py"), *args]), name="inject",
                                              time_max="00:02:00")
    for job_id in (card.job_id, from_string):
        [outcome] = dlokit.wait(job_id, timeout_s=120)
        assert outcome.state == "COMPLETED", str(outcome)
        assert json_lines(job_id, 1)[0]["argv"] == args
    assert not marker.exists()
    logs = workspace / "jobs"
    assert all(logs in p.parents for p in logs.rglob("*")) and not (workspace / "escape").exists()


def test_one_rank_out_of_memory_makes_the_job_out_of_memory_whichever_log_is_read_first(backend):
    """FSDP's ranks print a deprecation warning first; rank 1 runs out of memory (inject.py), rank 0 stops because
    of it (exit code 4). The job is OUT_OF_MEMORY and its cause is rank 1's message, not the warning that opens
    submitit's report (CI read such a job as FAILED, 2026-11-27)."""
    llm = REPO / "tp_scripts" / "llm" / "solutions" / "train_llm.py"
    command = (f"{script('inject.py')} oom 1:1 {llm} --mode fsdp --config tiny --data text --seq-len 16 "
               "--batch-size 4 --steps 2")
    [job_id] = dlokit.gpu_jobs_submitter(command, n_gpu=2, name="oom2", time_max="00:02:00")
    [outcome] = dlokit.wait(job_id, timeout_s=180)
    assert outcome.state == "OUT_OF_MEMORY", str(outcome)
    assert "rank 1: OUT OF MEMORY" in outcome.cause, outcome.cause


def test_memory_limit_of_the_profile_stops_a_job_as_out_of_memory_with_its_peak(backend):
    """local: each task's script runs under an RLIMIT_DATA; Slurm: --mem, enforced by the local Slurm's
    jobacct_gather (OverMemoryKill), whose kill sacct records as FAILED with the step's MaxRSS."""
    dlokit.use_profile(backend.name, mem="400M")
    [job_id] = dlokit.gpu_jobs_submitter(f"{script('hog.py')} 1500 5", n_gpu=1, name="hog", time_max="00:02:00")
    [outcome] = dlokit.wait(job_id, timeout_s=120)
    assert outcome.state == "OUT_OF_MEMORY", str(outcome)
    peak = float(outcome.cause.split("peak ", 1)[1].split(" MB")[0])
    assert peak > 200, outcome.cause  # the hog got well into its allocation before it was stopped
    if backend.backend == "local":
        assert "limit of 400 MB per task" in outcome.cause and "MemoryError" in outcome.cause
    else:
        assert "sacct MaxRSS" in outcome.cause and "400M" in outcome.cause
        assert "#SBATCH --mem=400M" in dlokit.show_script(job_id)


def test_a_memory_limit_holds_for_the_job_s_processes_together(backend):
    """Three children of 800 MB each under a 1 GB limit: each stays under a per-process limit, together they do
    not; the job ends OUT_OF_MEMORY on both backends (local: the launcher watches the tree; Slurm: its cgroup)."""
    dlokit.use_profile(backend.name, mem="1G")
    [job_id] = dlokit.gpu_jobs_submitter(f"{script('children_hog.py')} 3 800", n_gpu=1, name="children",
                                         time_max="00:02:00")
    [outcome] = dlokit.wait(job_id, timeout_s=120)
    assert outcome.state == "OUT_OF_MEMORY", str(outcome)
    if backend.backend == "local":
        held = float(outcome.cause.split("held ", 1)[1].split(" MB")[0])
        assert held > 1024 and "the job's limit of 1024 MB" in outcome.cause, outcome.cause
        assert "use_profile('local', mem=" in outcome.cause


def test_cancelled_job_is_cancelled_in_its_run_record_and_prints_nothing(backend, workspace, capfd):
    [job_id] = dlokit.gpu_jobs_submitter(script("recorded_sleep.py"), n_gpu=1, name="cancelrec",
                                         time_max="00:05:00", verbose=False)
    metrics = dlokit.submission.jobs.find_card(job_id).run_dir / "rank0" / "metrics.jsonl"
    deadline = time.time() + 90
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2) and time.time() < deadline:
        time.sleep(0.3)
    assert metrics.exists(), str(dlokit.job_outcome(job_id))
    dlokit.cancel(job_id)
    [outcome] = dlokit.wait(job_id, timeout_s=60)
    assert outcome.state == "CANCELLED", str(outcome)
    deadline = time.time() + 20  # on Slurm the outcome can come before the step's last write
    while read_rank(metrics.parent)["state"] != "cancelled" and time.time() < deadline:
        time.sleep(0.3)
    record = read_rank(metrics.parent)
    assert record["state"] == "cancelled", record["summary"]
    assert capfd.readouterr() == ("", ""), "nothing in the notebook cell"
    card = jobs.find_card(job_id)
    for log in Path(card.folder).glob(f"{card.scheduler_id}*.*"):
        if log.suffix in (".log", ".err", ".out"):
            text = log.read_text(errors="replace")
            assert "Traceback" not in text and "KeyboardInterrupt" not in text, f"{log.name}:\n{text}"


def test_each_task_sees_only_its_own_gpu_and_its_share_of_cores(backend, monkeypatch):
    """Local: two fake GPUs the launcher holds for the job; Slurm: all 4 fake GPUs of the local Slurm's
    node, whose real cores are fewer (the tasks share them: --overcommit)."""
    n_gpu = 2 if backend.backend == "local" else 4
    if backend.backend == "local":
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    spec = dlokit.JobSpec(script=script("visible.py"), name="visible", n_gpu=n_gpu, time_max="00:02:00")
    cpus = dlokit.plan(spec, backend).cpus_per_task
    [job_id] = dlokit.gpu_jobs_submitter(script("visible.py"), n_gpu=n_gpu, name="visible", time_max="00:02:00")
    [outcome] = dlokit.wait(job_id, timeout_s=120)
    assert outcome.state == "COMPLETED", str(outcome)
    lines = json_lines(job_id, n_gpu)
    assert sorted(line["task_on_node"] for line in lines) == list(range(n_gpu))
    gpus = [line["gpus"] for line in sorted(lines, key=lambda line: line["task_on_node"])]
    assert all(len(g.split(",")) == 1 for g in gpus) and len(set(gpus)) == n_gpu, gpus
    assert [line["local_rank"] for line in lines] == [0] * n_gpu  # its one GPU is cuda:0, as set_device(LOCAL_RANK) reads
    assert [line["omp"] for line in lines] == [str(cpus)] * n_gpu
    if backend.backend == "local":
        assert gpus == ["0", "1"] and not set(lines[0]["cpus"]) & set(lines[1]["cpus"])


def test_missing_data_set_says_how_to_make_one(backend, monkeypatch):
    monkeypatch.delenv("DLOKIT_DATA", raising=False)
    [job_id] = dlokit.gpu_jobs_submitter(f"{REPO / 'tp_scripts' / 'train_classifier.py'} --test", n_gpu=1,
                                         name="nodata", time_max="00:02:00")
    [outcome] = dlokit.wait(job_id, timeout_s=180)
    assert outcome.state == "FAILED", str(outcome)
    assert "no data set" in outcome.cause and "make_synthetic_imagenet.py" in outcome.cause, outcome.cause
    assert "usage:" not in outcome.cause and "FailedJobError" not in outcome.cause, outcome.cause


def test_queue_view_stops_at_its_timeout_saying_what_is_left(backend, capsys):
    from dlokit.submission import queue

    [job_id] = dlokit.gpu_jobs_submitter(f"{script('sleep.py')} 60", n_gpu=1, name="slow", time_max="00:02:00")
    assert queue.default_watch_timeout("slow") == 120 + queue.WATCH_MARGIN_S  # its time limit, then a margin
    last = dlokit.display_slurm_queue("slow", timestep=0.5, timeout_s=1)
    assert list(last["job_id"]) == [job_id]
    out = capsys.readouterr().out
    assert "stopped watching after 1 s (display_slurm_queue's timeout_s): still in the queue: " + job_id in out
    assert "The jobs go on" in out
    dlokit.cancel(job_id)
    dlokit.wait(job_id, timeout_s=60)


def test_a_job_whose_launcher_fails_says_why(workspace, monkeypatch):
    """The local launcher failing before the script starts (here: its lock folder cannot be made) is the cause
    job_outcome shows, not an empty FAILED."""
    blocker = workspace / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("DLOKIT_LOCK_DIR", str(blocker / "locks"))
    dlokit.use_profile("local")
    [job_id] = dlokit.gpu_jobs_submitter(f"{JOBS / 'sleep.py'} 0", n_gpu=1, name="nolocks", time_max="00:01:00")
    [outcome] = dlokit.wait(job_id, timeout_s=60)
    assert outcome.state == "FAILED"
    assert "launcher failed before the script started" in outcome.cause and "not-a-folder" in outcome.cause, outcome


def test_a_scheduler_that_does_not_answer_is_named_and_wait_gives_up(workspace, slurm_cluster, monkeypatch):
    """The controller and accounting out of reach (the job's cluster configuration pointed at closed ports): the
    job reads NO_ANSWER with squeue's whole message, never PENDING, and wait() stops with that cause."""
    import re

    from conftest import free_ports

    dlokit.use_profile("local-slurm")
    [job_id] = dlokit.gpu_jobs_submitter(f"{script('sleep.py')} 0", n_gpu=1, name="noanswer", time_max="00:02:00")
    assert dlokit.wait(job_id, timeout_s=120)[0].state == "COMPLETED"
    ctld, dbd = free_ports(2)
    conf = Path(os.environ["SLURM_CONF"]).read_text()
    conf = re.sub(r"(?m)^SlurmctldPort=.*$", f"SlurmctldPort={ctld}", conf)
    conf = re.sub(r"(?m)^AccountingStoragePort=.*$", f"AccountingStoragePort={dbd}", conf)
    conf = re.sub(r"(?m)^MessageTimeout=.*\n", "", conf) + "MessageTimeout=1\n"  # squeue gives up at once, not after 18 s
    unreachable = workspace / "slurm.conf"
    unreachable.write_text(conf)
    monkeypatch.setenv("SLURM_CONF", str(unreachable))
    outcome = dlokit.job_outcome(job_id)
    assert outcome.state == "NO_ANSWER" and "the Slurm controller did not answer (" in outcome.cause, outcome
    assert "the job's state is not known" in outcome.cause
    with pytest.raises(dlokit.SchedulerError, match=f"job {job_id}: the Slurm controller did not answer"):
        dlokit.wait(job_id, poll_s=0.2, no_answer_s=1)
