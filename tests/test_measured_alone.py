"""Measurements run alone on the embedded default: a local job waits while the devices it needs are in use."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dlokit
from dlokit.submission import devices, jobs

JOBS = Path(__file__).parent / "job_scripts"


def interval(job_id: str) -> dict:
    text = jobs.find_card(job_id).log_path().read_text()
    return json.loads(next(line for line in text.splitlines() if line.startswith("{")))


def wait_for_state(job_id: str, state: str, timeout_s: float = 60) -> jobs.Outcome:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        outcome = dlokit.job_outcome(job_id)
        if outcome.state == state:
            return outcome
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} never reached {state}: {dlokit.job_outcome(job_id)}")


def test_three_jobs_submitted_together_never_overlap(workspace):
    dlokit.use_profile("local")
    ids = dlokit.gpu_jobs_submitter([f"{JOBS / 'interval.py'} 1.0"] * 3, n_gpu=1, name="alone", time_max="00:02:00")
    assert [o.state for o in dlokit.wait(ids, timeout_s=120)] == ["COMPLETED"] * 3
    spans = sorted((interval(i)["start"], interval(i)["end"]) for i in ids)
    assert all(earlier[1] <= later[0] for earlier, later in zip(spans, spans[1:])), spans
    first = interval(ids[0])
    # a measurement holds the whole CPU (every core, each standing for one device), or its GPU
    assert first["devices"] == ",".join(devices.machine_devices()) or first["devices"].startswith("gpu")
    assert first["run_id"] == ids[0]  # the run folder is named after the kit's own job id


def test_jobs_that_measure_accuracy_share_the_machine_and_say_so(workspace):
    """alone=False: one core each, side by side; a measuring job submitted after them waits for both; the run
    records say the jobs shared the machine, so the views never take their speed for a measurement."""
    if len(devices.machine_devices()) < 2 or devices.machine_devices()[0].startswith("gpu"):
        import pytest

        pytest.skip("needs a CPU-only machine with 2 cores or more")
    dlokit.use_profile("local")
    # the two meet before their busy wait: they run side by side however slowly each one starts
    shared = dlokit.gpu_jobs_submitter([f"{JOBS / 'interval.py'} 1.0 {workspace / 'shared'} 2"] * 2, n_gpu=1,
                                       name="shared", time_max="00:02:00", alone=False)
    [alone] = dlokit.gpu_jobs_submitter(f"{JOBS / 'interval.py'} 0.5", n_gpu=1, name="alone", time_max="00:02:00")
    assert [o.state for o in dlokit.wait(shared + [alone], timeout_s=180)] == ["COMPLETED"] * 3
    a, b, last = interval(shared[0]), interval(shared[1]), interval(alone)
    assert a["met"] and b["met"], (a, b)  # they ran at the same time...
    assert set(a["cpus"]).isdisjoint(b["cpus"]) and len(a["devices"].split(",")) == 1  # ...on a core each
    assert last["start"] >= max(a["end"], b["end"]) - 0.05  # the measurement waited for both
    runner = JOBS / "recorded_sleep.py"
    recorded = dlokit.gpu_jobs_submitter([f"{runner} 1.0 {workspace / 'recorded'} 2"] * 2, n_gpu=1,
                                         name="recorded", time_max="00:02:00", alone=False)
    assert [o.state for o in dlokit.wait(recorded, timeout_s=180)] == ["COMPLETED"] * 2
    from dlokit.analysis import load_run, runs_table

    assert all(load_run(j).info["measurement"]["alone"] is False for j in recorded)
    assert runs_table(recorded)["overlapped_by"].tolist() == [recorded[1], recorded[0]]


def test_each_task_keeps_to_its_share_of_the_cores(workspace):
    profile = dlokit.use_profile("local")
    [job_id] = dlokit.gpu_jobs_submitter(f"{JOBS / 'interval.py'} 0.2", n_gpu=1, name="cores", time_max="00:02:00")
    assert dlokit.wait(job_id, timeout_s=60)[0].state == "COMPLETED"
    seen = interval(job_id)
    share = profile.task_cpus(1)
    assert len(seen["cpus"]) == share and seen["omp"] == str(share)


def test_a_waiting_job_is_pending_with_its_reason_and_a_cancelled_one_never_starts(workspace):
    dlokit.use_profile("local")
    [holder] = dlokit.gpu_jobs_submitter(f"{JOBS / 'sleep.py'} 30", n_gpu=1, name="holder", time_max="00:02:00")
    wait_for_state(holder, "RUNNING")
    [waiting] = dlokit.gpu_jobs_submitter(f"{JOBS / 'interval.py'} 0.1", n_gpu=1, name="waiter", time_max="00:02:00")
    pending = wait_for_state(waiting, "PENDING")
    while "holder" not in pending.cause:  # the launcher writes its reason a moment after it starts
        pending = wait_for_state(waiting, "PENDING")
    assert "waiting for" in pending.cause and "holder" in pending.cause
    table = dlokit.job_table("waiter")
    assert list(table["state"]) == ["PENDING"] and "holder" in table["reason"].iloc[0]
    dlokit.cancel(waiting)
    assert dlokit.wait(waiting, timeout_s=30)[0].state == "CANCELLED"
    dlokit.cancel(holder)
    dlokit.wait(holder, timeout_s=30)
    card = jobs.find_card(waiting)
    assert not card.log_path().exists(), "a job cancelled while pending must never start"
    assert not (card.run_dir).exists()


def test_a_killed_holder_frees_its_lock(tmp_path):
    """flock locks die with their holder: no stale lock after kill -9."""
    env = {**os.environ, "DLOKIT_LOCK_DIR": str(tmp_path)}
    holder = subprocess.Popen([sys.executable, "-c", (
        "import time; from dlokit.submission.devices import DeviceQueue\n"
        "q = DeviceQueue(1, ['cpu'], 'victim')\n"
        "assert q.try_acquire()\n"
        "print('held', flush=True); time.sleep(600)")], env=env, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    os.environ["DLOKIT_LOCK_DIR"] = str(tmp_path)
    try:
        contender = devices.DeviceQueue(1, ["cpu"], "next")
        assert not contender.try_acquire()
        assert devices.holders(["cpu"])["cpu"]["name"] == "victim"
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert contender.try_acquire()
        contender.leave()
    finally:
        del os.environ["DLOKIT_LOCK_DIR"]


def test_first_come_first_served(tmp_path, monkeypatch):
    monkeypatch.setenv("DLOKIT_LOCK_DIR", str(tmp_path))
    first = devices.DeviceQueue(1, ["gpu0", "gpu1"], "first")
    second = devices.DeviceQueue(1, ["gpu0", "gpu1"], "second")
    assert not second.try_acquire(), "a later ticket must wait while an earlier one has not started"
    assert first.try_acquire() and second.try_acquire()
    assert sorted(first.held + second.held) == ["gpu0", "gpu1"]
    first.leave()
    second.leave()


def test_the_queue_follows_the_order_of_submission_not_of_launcher_start(tmp_path, monkeypatch):
    """A launcher that starts late (a loaded machine) keeps the place its job was submitted at."""
    monkeypatch.setenv("DLOKIT_LOCK_DIR", str(tmp_path))
    submitted_first = time.time_ns()
    quick = devices.DeviceQueue(2, ["cpu0", "cpu1"], "submitted second, started first",
                                submitted_ns=submitted_first + 1_000_000)
    slow = devices.DeviceQueue(1, ["cpu0", "cpu1"], "submitted first, started second", submitted_ns=submitted_first)
    assert not quick.try_acquire(), "the job submitted later must wait for the one submitted before it"
    assert slow.try_acquire() and not quick.try_acquire()
    slow.leave()
    assert quick.try_acquire()
    quick.leave()


def test_local_job_ids_are_unique_and_not_pids(workspace):
    profile = dlokit.use_profile("local")
    ids = dlokit.gpu_jobs_submitter([f"{JOBS / 'interval.py'} 0.1"] * 2, n_gpu=1, name="ids", time_max="00:02:00")
    dlokit.wait(ids, timeout_s=60)
    cards = [jobs.find_card(i) for i in ids]
    assert len(set(ids)) == 2 and all(c.native_id.isdigit() and c.native_id != c.job_id for c in cards)
    (profile.runs / "taken").mkdir(parents=True)
    from dlokit.submission.submit import new_local_job_id

    assert all(new_local_job_id(profile) not in {"taken", *ids} for _ in range(20))
