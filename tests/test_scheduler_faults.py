"""A scheduler that fails is a state, not a crash; a job that dies is named, never given a made-up exit code.

On the embedded default: a job whose whole process tree is SIGKILLed, and one whose script alone is. On the real
local Slurm (scripts/local_slurm): SLURM_CONF naming a missing file, slurmctld stopped under a running and a
pending job (and a queue watch that lives through it), two clusters numbering their jobs alike in one log folder,
and start.sh's default ports for every node count it accepts.

The Slurm tests need root (the local cluster runs as root).
"""
from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

import dlokit
from dlokit.submission import jobs, queue, tree_memory
from conftest import SLURM_SCRIPTS, _cluster_env, _free_ports_for

JOBS = Path(__file__).parent / "job_scripts"
RECORDED = JOBS / "recorded_sleep.py"
SLEEP = JOBS / "sleep.py"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the local Slurm cluster runs as root (SlurmUser=root)")


def until(condition, timeout: float, what: str, poll: float = 0.2):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def steps_recorded(job_id: str) -> int:
    metrics = dlokit.submission.jobs.find_card(job_id).run_dir / "rank0" / "metrics.jsonl"
    return metrics.read_text().count('"kind": "step"') if metrics.exists() else 0


# ---- the embedded default: a job that dies ------------------------------------------------------------------

def running_local_job(name: str) -> jobs.JobCard:
    dlokit.use_profile("local")
    [job_id] = dlokit.gpu_jobs_submitter(f"{RECORDED} 120", n_gpu=1, name=name, time_max="00:05:00", verbose=False)
    until(lambda: steps_recorded(job_id) >= 3, 120, "three recorded steps")
    return jobs.find_card(job_id)


def test_a_job_whose_process_tree_was_sigkilled_ended_without_a_word(workspace):
    card = running_local_job("treekill")
    launcher = psutil.Process(int(card.scheduler_id))
    controller = launcher.children()[0]
    tree = [launcher, *launcher.children(recursive=True), *tree_memory.scripts_of(controller.pid)]
    for process in tree:  # everything at once, as a machine that goes down: nobody writes how it ended
        with contextlib.suppress(psutil.Error):
            process.send_signal(signal.SIGKILL)
    psutil.wait_procs(tree, timeout=30)
    steps = steps_recorded(card.job_id)
    outcome = until(lambda: (o := dlokit.job_outcome(card.job_id)).finished and o, 30, "the job to end")
    assert outcome.state == "FAILED" and outcome.exit_code == "", str(outcome)  # no exit code made up
    assert "ended without a word (no exit status was written" in outcome.cause, str(outcome)
    assert f"its run record's last step: {steps - 1}" in outcome.cause, (steps, str(outcome))


@pytest.mark.parametrize("warm", ["0", "1"])  # the task's own child, or forked by the warm-start server
def test_a_script_killed_by_sigkill_is_named(workspace, monkeypatch, warm):
    monkeypatch.setenv("DLOKIT_WARM_START", warm)
    card = running_local_job("scriptkill")
    controller = psutil.Process(int(card.scheduler_id)).children()[0]
    [script] = tree_memory.scripts_of(controller.pid)
    script.send_signal(signal.SIGKILL)
    [outcome] = dlokit.wait(card.job_id, timeout_s=60)
    assert outcome.state == "FAILED" and outcome.exit_code == "0:9", str(outcome)
    assert "killed by a signal (SIGKILL)" in outcome.cause.splitlines()[-1], str(outcome)  # the report's line
    assert "its run record's last step: " in outcome.cause, str(outcome)


# ---- the local Slurm: a scheduler that fails ----------------------------------------------------------------

def submit(command: str, name: str) -> str:
    [job_id] = dlokit.gpu_jobs_submitter(command, n_gpu=1, name=name, time_max="00:05:00", verbose=False)
    return job_id


@needs_root
def test_a_missing_slurm_conf_is_no_answer_at_once(slurm_cluster, workspace, monkeypatch):
    dlokit.use_profile("local-slurm")
    job_id = submit(f"{SLEEP} 60", "noconf")
    until(lambda: dlokit.job_outcome(job_id).state == "RUNNING", 60, "the job to run")
    missing = workspace / "gone" / "slurm.conf"
    monkeypatch.setenv("SLURM_CONF", str(missing))
    outcome = dlokit.job_outcome(job_id)  # the kit's own look at SLURM_CONF answers, before any Slurm command retries
    assert outcome.state == jobs.NO_ANSWER and f"SLURM_CONF names {missing}, which is not a file" in outcome.cause
    [row] = dlokit.job_table(job_ids=[job_id]).to_dict("records")
    assert row["state"] == jobs.NO_ANSWER and "SLURM_CONF names" in row["reason"], row
    with pytest.raises(jobs.SchedulerError, match="SLURM_CONF names"):
        dlokit.wait(job_id, poll_s=0.2, no_answer_s=1)
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster / "etc" / "slurm.conf"))
    dlokit.cancel(job_id)
    dlokit.wait(job_id, timeout_s=60)


def local_slurm(script: str, state_dir: Path, *args: str, env: dict | None = None) -> None:
    done = subprocess.run(["bash", str(SLURM_SCRIPTS / script), str(state_dir), *args], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_root
def test_a_stopped_controller_is_no_answer_and_a_watch_lives_through_it(slurm_cluster, workspace):
    dlokit.use_profile("local-slurm")  # every job asks for the whole node: the second one waits
    running = submit(f"{SLEEP} 8", "outage")
    waiting = submit(f"{SLEEP} 1", "outage")
    until(lambda: [dlokit.job_outcome(j).state for j in (running, waiting)] == ["RUNNING", "PENDING"], 60,
          "one job running, one pending")
    # the script runs (its step started: srun needs the controller), and goes on while the controller is away
    until(lambda: "sleeping" in jobs.tail(jobs.find_card(running).log_path()), 60, "the script to start")
    ends_at = time.time() + 8
    printed = io.StringIO()
    watched = {}

    def watch():
        with contextlib.redirect_stdout(printed):
            watched["table"] = queue.display_slurm_queue(job_ids=[running, waiting], timestep=1, timeout_s=240)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    local_slurm("stop.sh", slurm_cluster, "slurmctld")
    try:
        for job_id in (running, waiting):
            outcome = dlokit.job_outcome(job_id)  # never an exception, never sacct's stale word
            assert outcome.state == jobs.NO_ANSWER and "the Slurm controller did not answer" in outcome.cause, \
                str(outcome)
        table = dlokit.job_table(job_ids=[running, waiting])
        assert table["state"].tolist() == [jobs.NO_ANSWER] * 2, table
        assert table["reason"].str.startswith("no answer: the Slurm controller did not answer").all(), table
        with pytest.raises(jobs.SchedulerError, match="the Slurm controller did not answer"):
            dlokit.wait([running, waiting], poll_s=0.5, no_answer_s=3)
        time.sleep(max(0.0, ends_at + 2 - time.time()))  # the script has ended, the controller is still away
        outcome = dlokit.job_outcome(running)  # sacct still says the job is active: it is not known now
        assert outcome.state == jobs.NO_ANSWER and "(sacct last said " in outcome.cause, str(outcome)
        assert watcher.is_alive(), printed.getvalue()  # the watch goes on
    finally:
        local_slurm("restart.sh", slurm_cluster, "slurmctld")
    assert [o.state for o in dlokit.wait([running, waiting], timeout_s=120)] == ["COMPLETED", "COMPLETED"]
    watcher.join(timeout=60)
    assert not watcher.is_alive() and "NO_ANSWER" in printed.getvalue(), printed.getvalue()
    assert printed.getvalue().rstrip().endswith("no job left in the queue"), printed.getvalue()


@pytest.fixture
def second_cluster(tmp_path):
    """The state folder of a second local cluster (the test starts it), stopped after the test."""
    state_dir = tmp_path / "second"
    yield state_dir
    subprocess.run(["bash", str(SLURM_SCRIPTS / "stop.sh"), str(state_dir)], capture_output=True, timeout=120)


@needs_root
def test_two_clusters_in_one_log_folder_never_mix_job_ids(slurm_cluster, second_cluster, workspace, monkeypatch):
    dlokit.use_profile("local-slurm")
    first = submit(f"{SLEEP} 0", "twin")  # one name on both clusters: neither job's logs overwrite the other's
    dlokit.wait(first, timeout_s=120)
    started = subprocess.run(["bash", str(SLURM_SCRIPTS / "start.sh"), str(second_cluster)], capture_output=True,
                             text=True, timeout=300,
                             env={**os.environ, **_free_ports_for(1), "DLOKIT_SLURM_FIRST_JOB_ID": first})
    assert started.returncode == 0, started.stdout + started.stderr
    one_conf = os.environ["SLURM_CONF"]
    for key, value in _cluster_env(second_cluster).items():
        monkeypatch.setenv(key, value)
    second = submit(f"{SLEEP} 0", "twin")
    assert second == first  # the same id, on another cluster
    dlokit.wait(second, timeout_s=120)
    here = jobs.current_cluster()
    card = jobs.find_card(second)
    assert card.name == "twin" and card.cluster == here, card
    assert [Path(p).parent.name for p in dlokit.search_log(contains=second)] == [f"twin@{here}"]
    monkeypatch.setenv("SLURM_CONF", one_conf)
    assert jobs.current_cluster() != here
    card = jobs.find_card(first)
    assert card.name == "twin" and card.cluster == jobs.current_cluster(), card
    assert [Path(p).parent.name for p in dlokit.search_log(contains=first)] == [f"twin@{jobs.current_cluster()}"]
    assert len(dlokit.search_log("twin")) == 2  # both jobs' logs kept
    assert dlokit.job_outcome(first).state == "COMPLETED"
    # a card of the other cluster never reads as this one's job
    [other] = [jobs.load_card(p) for p in dlokit.current_profile().logs.glob(f"twin@{here}/{second}@*_job.json")]
    assert jobs.card_outcome(other).state == "UNKNOWN" and "a job of Slurm cluster" in jobs.card_outcome(other).cause


@needs_root
def test_a_job_killed_by_a_node_failure_names_the_node_and_how_to_resume(slurm_cluster_2n, workspace):
    dlokit.use_profile("local-slurm-2n", gpus_per_node=1)  # one task per node; no-requeue: it ends NODE_FAIL
    [job_id] = dlokit.gpu_jobs_submitter(f"{RECORDED} 120", n_gpu=2, name="nodefail", time_max="00:05:00",
                                         verbose=False)
    until(lambda: steps_recorded(job_id) >= 3, 120, "three recorded steps")
    local_slurm("kill_node.sh", slurm_cluster_2n, "node2")
    try:
        [outcome] = dlokit.wait(job_id, timeout_s=120)
    finally:
        local_slurm("restart.sh", slurm_cluster_2n, "slurmd:node2")
    assert outcome.state == "NODE_FAIL", str(outcome)
    assert "node node2 failed while the job ran on it (NODE_FAIL; its nodes: node[1-2])" in outcome.cause, str(outcome)
    assert "its run record's last step: " in outcome.cause and "--resume" in outcome.cause, str(outcome)


def test_search_log_matches_a_job_id_whole_never_a_piece_of_another(workspace):
    folder = dlokit.current_profile().logs / "ids"
    folder.mkdir(parents=True)
    for job_id in ("1", "12", "12_3", "21", "1128-104259-e3c1"):
        card = jobs.JobCard(job_id=job_id, name="ids", backend="slurm", profile="local-slurm", folder=str(folder),
                            argv=[], command_line="", n_gpu=0, nodes=1, tasks=1, time_seconds=60,
                            runs_dir=str(workspace / "runs"), submitted_at=time.time())
        card.save()
        card.log_path().write_text("log\n")

    def found(contains):
        return sorted(Path(p).name.removesuffix("_0_log.out") for p in dlokit.search_log(contains=contains))

    assert found("1") == ["1"]
    assert found("12") == ["12", "12_3"]  # the array job and its element
    assert found("2") == [] and found("e3c") == [] and found("e3c1") == ["1128-104259-e3c1"]


@needs_root
def test_start_sh_default_ports_never_collide_for_any_node_count(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLOKIT_SLURM")}
    for nodes in range(1, 65):
        shown = subprocess.run(["bash", str(SLURM_SCRIPTS / "start.sh"), "--nodes", str(nodes), "--ports",
                                str(tmp_path / "state")], capture_output=True, text=True, env=env, timeout=30)
        assert shown.returncode == 0, shown.stderr
        ports = [int(word) for word in shown.stdout.split() if word.isdigit()]
        assert len(ports) == 3 + nodes and len(set(ports)) == len(ports), (nodes, shown.stdout)
    clash = subprocess.run(["bash", str(SLURM_SCRIPTS / "start.sh"), "--nodes", "2", "--ports", str(tmp_path)],
                           capture_output=True, text=True, timeout=30, env={**env, "DLOKIT_SLURMD_PORT": "16818"})
    assert clash.returncode != 0 and "ports used twice" in clash.stderr, clash.stderr
    assert not (tmp_path / "state").exists()
