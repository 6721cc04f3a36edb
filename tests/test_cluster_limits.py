"""What the cluster cannot run is refused at submission, naming the limit; what waits says why; what runs
survives a restart of slurmctld. On the project's real local Slurm (tests/conftest.py `slurm_cluster`)."""
from __future__ import annotations

import getpass
import subprocess
import threading
import time
from pathlib import Path

import pytest

import dlokit
from dlokit.submission import jobspec, queue

JOBS = Path(__file__).parent / "job_scripts"
SLEEP = str(JOBS / "sleep.py")
HELLO = str(JOBS / "allreduce.py")
RESTART = Path(__file__).resolve().parents[1] / "scripts" / "local_slurm" / "restart.sh"

pytestmark = pytest.mark.slurm


@pytest.fixture
def local_slurm(slurm_cluster, workspace):
    jobspec._cluster_cache.clear()  # each test asks the cluster afresh
    jobspec._accounts_cache.clear()
    yield dlokit.use_profile("local-slurm")
    # whatever a test left in the queue (a job the old code accepted stays PENDING forever)
    subprocess.run(["scancel", "-u", getpass.getuser()], capture_output=True, timeout=30)


@pytest.mark.parametrize("options,limit", [
    (dict(n_gpu=8), r"n_gpu=8 needs 2 nodes of 4 GPUs but partition 'gpu' has 1 node: ask for at most 4 GPUs"),
    (dict(time_max="99999-00:00:00"), r"longer than partition 'gpu' allows \(MaxTime 1-00:00:00\)"),
    (dict(cpus_per_task=64), r"1 task\(s\) x 64 CPUs = 64 CPUs per node but the nodes of partition 'gpu' have at most"),
    (dict(partition="nope"), r"partition 'nope' does not exist on this cluster; its partitions are: gpu"),
])
def test_a_job_that_could_never_start_is_refused_naming_the_limit(local_slurm, workspace, options, limit):
    with pytest.raises(dlokit.JobSpecError, match=limit):
        dlokit.gpu_jobs_submitter(HELLO, name="never", **options)
    assert not (workspace / "jobs").exists(), "nothing is written for a refused job"


def test_an_account_that_is_not_the_users_is_refused_naming_theirs(local_slurm, workspace):
    with pytest.raises(dlokit.JobSpecError, match=r"account 'nosuch' is not one of yours on this cluster; you may "
                                                  r"charge: dlokit(, root)?\. Set account= in the call, or in profile"):
        dlokit.gpu_jobs_submitter(HELLO, name="noacct", account="nosuch")
    # and Slurm itself refuses it too, as a real site does (AccountingStorageEnforce)
    done = subprocess.run(["sbatch", "-A", "nosuch", "--wrap", "true"], capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "Invalid account" in done.stderr, done.stderr
    [job] = dlokit.gpu_jobs_submitter(SLEEP + " 0", name="acct", account="dlokit")
    assert dlokit.wait(job, timeout_s=120)[0].state == "COMPLETED"


def test_more_memory_than_a_node_has_is_refused(local_slurm, workspace):
    dlokit.use_profile("local-slurm", mem="1T")
    with pytest.raises(dlokit.JobSpecError, match=r"memory 1048576 MB per node .*mem=1T.* have at most \d+ MB"):
        dlokit.gpu_jobs_submitter(HELLO, name="never")


def test_the_cluster_is_asked_once_per_profile(local_slurm, monkeypatch):
    calls = []
    real = jobspec._scontrol
    monkeypatch.setattr(jobspec, "_scontrol", lambda *args: calls.append(args) or real(*args))
    first = jobspec.cluster_limits(local_slurm)
    assert jobspec.cluster_limits(local_slurm) is first and len(calls) == 2  # nodes, partitions
    assert first["gpu"].nodes[0].gpus == 4 and first["gpu"].max_time_s == 86400


def test_when_the_cluster_cannot_be_asked_the_job_goes_anyway_with_a_notice(local_slurm, monkeypatch, capsys):
    def fail(*args):
        raise jobspec.ClusterQueryError("scontrol show node: Unable to contact slurm controller")

    monkeypatch.setattr(jobspec, "_scontrol", fail)
    [job_id] = dlokit.gpu_jobs_submitter(HELLO, n_gpu=1, name="unasked", time_max="00:02:00")
    assert "could not ask the cluster for its limits (scontrol show node: Unable to contact" in capsys.readouterr().out
    [outcome] = dlokit.wait(job_id, timeout_s=120)
    assert outcome.state == "COMPLETED", str(outcome)


def test_a_pending_job_shows_slurms_reason(local_slurm):
    [first] = dlokit.gpu_jobs_submitter(f"{SLEEP} 60", n_gpu=1, name="first", time_max="00:02:00")
    [second] = dlokit.gpu_jobs_submitter(f"{SLEEP} 1", n_gpu=1, name="second", time_max="00:02:00")
    deadline = time.time() + 60  # measurements are exclusive: the second waits for the node
    while dlokit.job_outcome(first).state != "RUNNING" and time.time() < deadline:
        time.sleep(0.5)
    outcome = dlokit.job_outcome(second)
    assert outcome.state == "PENDING", str(outcome)
    assert outcome.cause.startswith("waiting: ") and "Slurm's reason" in outcome.cause, outcome.cause
    table = dlokit.job_table("second")
    [row] = table.to_dict("records")
    assert row["state"] == "PENDING" and row["reason"] and row["reason"] in outcome.cause
    assert f"<td>{row['reason']}</td>" in queue._table_html(table, "second"), "the widget shows the reason"
    last = dlokit.display_slurm_queue("second", timestep=0.5, timeout_s=1)
    assert list(last["job_id"]) == [second]
    dlokit.cancel(first)
    dlokit.cancel(second)


def test_restarting_slurmctld_loses_no_job_and_the_queue_view_keeps_working(slurm_cluster, workspace):
    dlokit.use_profile("local-slurm", exclusive_measurements=False)  # both run at once
    ids = [dlokit.gpu_jobs_submitter(f"{SLEEP} 12", n_gpu=1, name="survive", time_max="00:02:00")[0]
           for _ in range(2)]
    deadline = time.time() + 60
    while {dlokit.job_outcome(i).state for i in ids} != {"RUNNING"} and time.time() < deadline:
        time.sleep(0.5)
    assert {dlokit.job_outcome(i).state for i in ids} == {"RUNNING"}
    done = {}
    restart = threading.Thread(target=lambda: done.update(
        result=subprocess.run(["bash", str(RESTART), str(slurm_cluster)], capture_output=True, text=True,
                              timeout=120)))
    restart.start()
    seen = []
    while restart.is_alive() or not seen:
        seen.append(sorted(dlokit.job_table("survive")["job_id"]))  # never raises while slurmctld restarts
        time.sleep(0.2)
    restart.join()
    assert done["result"].returncode == 0, done["result"].stderr
    assert "restarted slurmctld" in done["result"].stderr
    assert all(ids_seen == sorted(ids) for ids_seen in seen), seen
    outcomes = dlokit.wait(ids, timeout_s=120)
    assert [o.state for o in outcomes] == ["COMPLETED", "COMPLETED"], "\n".join(map(str, outcomes))


def test_a_pending_array_element_stays_in_the_queue_view(local_slurm):
    """Same-layout jobs go as one array; its elements wait for each other (exclusive measurements)."""
    ids = dlokit.gpu_jobs_submitter([f"{SLEEP} 30", f"{SLEEP} 1", f"{SLEEP} 2"], n_gpu=1, name="array",
                                    time_max="00:02:00")
    assert len(ids) == 3 and all("_" in i for i in ids)
    deadline = time.time() + 60
    while dlokit.job_outcome(ids[0]).state != "RUNNING" and time.time() < deadline:
        time.sleep(0.5)
    while True:  # Slurm gives a waiting element its reason at its next scheduling pass, "None" until then
        rows = {row["job_id"]: row for row in dlokit.job_table("array", job_ids=ids).to_dict("records")}
        if all(rows[waiting]["reason"] for waiting in ids[1:]) or time.time() > deadline:
            break
        time.sleep(0.5)
    assert rows[ids[0]]["state"] == "RUNNING"
    for waiting in ids[1:]:  # squeue alone writes them as one line, <id>_[1-2]
        assert rows[waiting]["state"] == "PENDING" and rows[waiting]["reason"], rows
