"""Jobs that span nodes, on the project's real two-node Slurm (scripts/local_slurm/start.sh --nodes 2, fixture
`slurm_cluster_2n`): node1 and node2 on this machine, each its own slurmd, hostname and 4 fake GPUs.

What is compared, and why it must be equal:
- image DDP on 2 nodes x 1 task against 2 tasks on one node: the same ranks, shards, seeds and threads, only
  the link between the ranks differs, so every step's loss and the final weights are identical. (Against one
  process at the global batch they are not: BatchNorm normalises each rank's batch, and the samplers differ.)
- LLM FSDP on 2 nodes, and HSDP on 2 nodes x 2 tasks, against one process at the same global batch: the model
  has no batch statistics, so the per-step loss and gradient norm match (as on one node: test_day4_parallel.py).
A node that dies (kill_node.sh) ends its job NODE_FAIL under the profile's --no-requeue, or requeues it.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dlokit
from dlokit.submission import jobs
from dlokit.analysis import load_run

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts" / "local_slurm"
CLASSIFIER = REPO / "tp_scripts" / "solutions" / "train_classifier.py"
LLM = REPO / "tp_scripts" / "llm" / "solutions" / "train_llm.py"
NODE_ENV = REPO / "tests" / "job_scripts" / "node_env.py"
RESTART_COUNT = REPO / "tests" / "job_scripts" / "restart_count.py"
LLM_COMMON = "--config tiny --steps 4 --batch-size 8 --seq-len 64 --grad-norm"

pytestmark = pytest.mark.slurm


@pytest.fixture
def two_nodes(slurm_cluster_2n, workspace):
    """The two-node profile; one task per node when a test asks for gpus_per_node=1."""
    dlokit.use_profile("local-slurm-2n")
    return slurm_cluster_2n


@pytest.fixture(scope="module")
def tiny_images(tmp_path_factory):
    root = tmp_path_factory.mktemp("images") / "tiny"
    subprocess.run([sys.executable, str(REPO / "data" / "make_synthetic_imagenet.py"), "--out", str(root),
                    "--classes", "4", "--train-per-class", "12", "--val-per-class", "4", "--size", "40",
                    "--quiet"], check=True)
    return root


def classifier(images, *options: str) -> str:
    return (f"{CLASSIFIER} --data {images} --model resnet18 --image-size 32 --batch-size 4 --lr 0.02 "
            f"--num-workers 0 --metric-step 1 {' '.join(options)}")


def submit(command: str, n_gpu: int, name: str, **profile) -> str:
    if profile:
        dlokit.use_profile("local-slurm-2n", **profile)
    [job_id] = dlokit.gpu_jobs_submitter(command, n_gpu=n_gpu, name=name, time_max="00:05:00")
    return job_id


def completed(job_id: str):
    [outcome] = dlokit.wait(job_id, timeout_s=300)
    assert outcome.state == "COMPLETED", str(outcome)
    run = load_run(job_id)
    assert run.state == "completed", run.describe_state()
    return run


def hosts(run) -> list[str]:
    return [run.ranks[k]["run"]["hardware"]["hostname"] for k in sorted(run.ranks)]


def losses(run) -> list[float]:
    return list(run.steps["loss"])


def script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPTS / name), *args], capture_output=True, text=True, timeout=120)


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.time() + timeout_s
    while not (value := condition()):
        assert time.time() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(0.2)
    return value


def sbatch_output(state_dir: Path, *options: str, wrap: str) -> str:
    """Run a plain batch job to its end (sbatch --wait); its output."""
    jobs_dir = state_dir / "jobs"
    jobs_dir.mkdir(exist_ok=True)
    job = subprocess.run(["sbatch", "--parsable", "--wait", f"--chdir={jobs_dir}", "--output=%j.out", *options,
                          "--wrap", wrap], capture_output=True, text=True, timeout=120)
    assert job.returncode == 0, job.stderr
    return (jobs_dir / f"{job.stdout.strip()}.out").read_text()


def test_start_sh_brings_up_two_nodes_with_their_own_hostnames(two_nodes):
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T %G"], capture_output=True, text=True,
                           check=True).stdout.split("\n")
    assert sorted(line.split()[0] for line in nodes if line) == ["node1", "node2"]
    assert all("gpu:4" in line for line in nodes if line)
    out = sbatch_output(two_nodes, "--nodes=2", "--ntasks-per-node=1",
                        wrap="srun bash -c 'echo $SLURMD_NODENAME=$(hostname)'")
    assert sorted(out.split()) == ["node1=node1", "node2=node2"]


def test_a_plain_srun_task_on_two_nodes_finds_its_place_with_dlokit_rank(two_nodes):
    """No kit wrapper: rank.py reads Slurm's own variables; 3 tasks on 2 nodes are 2 + 1."""
    out = sbatch_output(two_nodes, "--nodes=2", "--ntasks=3", wrap=f"srun {sys.executable} {NODE_ENV}")
    tasks = sorted((json.loads(line) for line in out.splitlines() if line.startswith("{")), key=lambda t: t["rank"])
    assert [(t["rank"], t["hostname"], t["local_rank"], t["local_world_size"]) for t in tasks] == [
        (0, "node1", 0, 2), (1, "node1", 1, 2), (2, "node2", 0, 1)]
    assert all(t["source"] == "slurm" and t["world_size"] == 3 and t["master_addr"] == "node1" for t in tasks)


def test_start_sh_refuses_a_bad_node_count():
    done = script("start.sh", "--nodes", "zero", "/nonexistent/dlokit-state")
    assert done.returncode == 2 and "--nodes must be a whole number" in done.stderr
    assert "Traceback" not in done.stderr and not Path("/nonexistent/dlokit-state").exists()


def test_the_course_cell_at_eight_gpus_runs_as_two_nodes_of_four_tasks(two_nodes, capsys):
    """The original course's cell, with this cluster's account for Jean Zay's: 8 GPUs are 2 nodes of 4 here (1 node
    of 8 on jean-zay)."""
    from idr_pytools import gpu_jobs_submitter

    ids = gpu_jobs_submitter(f"{NODE_ENV}", n_gpu=8, module="pytorch-gpu/py3/2.6.0", account="dlokit",
                             time_max="00:10:00", name="cell")
    out = capsys.readouterr().out
    assert "module 'pytorch-gpu/py3/2.6.0' left out" in out and "8 GPUs on 2 nodes - 8 tasks (4 per node)" in out
    [outcome] = dlokit.wait(ids, timeout_s=300)
    assert outcome.state == "COMPLETED", str(outcome)
    card = jobs.find_card(ids[0])
    tasks = [json.loads(line) for t in range(8) for line in card.log_path(t).read_text().splitlines()
             if line.startswith("{")]
    assert sorted(task["rank"] for task in tasks) == list(range(8))
    node1_ip = next(task["host_ip"] for task in tasks if task["rank"] == 0)
    for task in tasks:
        node = task["rank"] // 4
        assert task["node_id"] == node and task["hostname"] == task["slurm_node"] == f"node{node + 1}", task
        assert task["task_on_node"] == task["rank"] % 4 and task["tasks_on_node"] == 4, task
        assert (task["local_rank"], task["local_world_size"]) == (0, 1), task  # counted over the one GPU it sees
        assert task["world_size"] == 8 and task["source"] == "torchrun", task  # the kit's task wrapper exports them
        assert task["master_addr"] == "node1" and task["master_ip"] == node1_ip, task
        assert task["gpus"] == str(task["task_on_node"]), task  # its own one of its node's 4 GPUs
    assert len({task["host_ip"] for task in tasks}) == 2, "each node has its own address"


def test_image_ddp_on_two_nodes_matches_two_tasks_on_one_node(two_nodes, tiny_images):
    command = classifier(tiny_images, "--epochs 1")
    across = completed(submit(command, n_gpu=2, name="ddp2n", gpus_per_node=1))
    within = completed(submit(command, n_gpu=2, name="ddp1n", gpus_per_node=4))
    assert hosts(across) == ["node1", "node2"] and hosts(within) == ["node1", "node1"]
    assert len(losses(across)) == across.config["total_steps"] == 6
    assert losses(across) == losses(within)
    assert [s["param_checksum"] for s in across.summaries] == [s["param_checksum"] for s in within.summaries]
    assert all(s["params_identical_across_ranks"] and s["observed"]["ddp_world_size"] == 2
               for s in across.summaries)


@pytest.fixture(scope="module")
def llm_single(tmp_path_factory):
    """train_llm.py in one process, here (no Slurm): the per-step loss and gradient norm to reproduce."""
    runs = tmp_path_factory.mktemp("llm")
    env = {**os.environ, "DLOKIT_RUN_ID": "single", "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_STEP_ID"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, str(LLM), *LLM_COMMON.split(), "--runs-dir", str(runs)], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return load_run(runs / "single").steps


def assert_same_llm_steps(run, reference):
    assert list(run.steps["step"]) == list(reference["step"]) == [1, 2, 3, 4]
    for column in ("loss", "grad_norm"):
        assert list(run.steps[column]) == pytest.approx(list(reference[column]), rel=2e-4), column


def test_llm_fsdp_on_two_nodes_matches_one_process(two_nodes, llm_single):
    fsdp = completed(submit(f"{LLM} --mode fsdp {LLM_COMMON}", n_gpu=2, name="fsdp2n", gpus_per_node=1))
    assert hosts(fsdp) == ["node1", "node2"]
    assert_same_llm_steps(fsdp, llm_single)


def test_llm_hsdp_replicates_across_nodes_and_shards_within(two_nodes, llm_single):
    """2 nodes x 2 tasks; the mesh is (dp_replicate, dp_shard) = (2, 2), ranks in row order: ranks 0,1 (node1)
    share one set of shards and ranks 2,3 (node2) the other, each shard replicated across the nodes."""
    hsdp = completed(submit(f"{LLM} --mode hsdp --dp-replicate 2 {LLM_COMMON}", n_gpu=4, name="hsdp2n",
                            gpus_per_node=2))
    assert hosts(hsdp) == ["node1", "node1", "node2", "node2"]
    assert (hsdp.config["dp_replicate"], hsdp.config["dp_shard"]) == (2, 2)
    assert_same_llm_steps(hsdp, llm_single)


def test_a_job_that_loses_a_node_ends_node_fail_and_resumes_from_its_checkpoint(two_nodes, tiny_images):
    """kill_node.sh kills every process of node2 mid-job; the profile's --no-requeue makes the job end NODE_FAIL
    (not requeued); node2 comes back (restart.sh) and a new job goes on from the last checkpoint."""
    command = classifier(tiny_images, "--epochs 6")
    victim = submit(f"{command} --checkpoint-steps 3", n_gpu=2, name="victim", gpus_per_node=1)
    metrics = jobs.find_card(victim).run_dir / "rank0" / "metrics.jsonl"
    wait_for(lambda: '"checkpoint_saved"' in (metrics.read_text() if metrics.exists() else ""), 240,
             "the first checkpoint")
    [row] = dlokit.job_table("victim").to_dict("records")
    assert row["state"] == "RUNNING" and row["node_list"] == "node[1-2]", row
    killed = script("kill_node.sh", str(two_nodes), "node2")
    assert killed.returncode == 0, killed.stderr
    try:
        [outcome] = dlokit.wait(victim, timeout_s=120)
        assert outcome.state == "NODE_FAIL", str(outcome)
        wait_for(lambda: dlokit.job_table("victim").empty, 60, "the job to leave the queue (not requeued)")
    finally:
        back = script("restart.sh", str(two_nodes), "slurmd:node2")
        assert back.returncode == 0, back.stderr
    saved = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if '"checkpoint_saved"' in line]

    resumed = completed(submit(f"{command} --resume {metrics.parent.parent}", n_gpu=2, name="resumed",
                               gpus_per_node=1))
    assert resumed.summary["resumed_from_step"] == saved[-1] > 0
    assert resumed.summary["steps"] == resumed.config["total_steps"] == 36
    assert all(s["params_identical_across_ranks"] for s in resumed.summaries)


def test_with_requeue_a_job_that_loses_a_node_waits_for_it_and_runs_again(two_nodes):
    """Slurm's default (--requeue): the job goes back to the queue (PENDING, BeginTime) and reruns, log appended."""
    dlokit.use_profile("local-slurm-2n", gpus_per_node=1, sbatch={"licenses": "machine", "requeue": True})
    [job_id] = dlokit.gpu_jobs_submitter(str(RESTART_COUNT), n_gpu=2, name="requeued", time_max="00:05:00")
    log = jobs.find_card(job_id).log_path(0)
    wait_for(lambda: "run 0" in jobs.tail(log, 20), 120, "the first run")
    killed = script("kill_node.sh", str(two_nodes), "node2")
    assert killed.returncode == 0, killed.stderr
    try:
        row = wait_for(lambda: next((r for r in dlokit.job_table("requeued").to_dict("records")
                                     if r["state"] == "PENDING"), None), 60, "the job to be requeued")
        assert row["job_id"] == job_id and row["reason"] == "BeginTime", row
        outcome = dlokit.job_outcome(job_id)  # sacct has the first attempt's NODE_FAIL; the job waits again
        assert outcome.state == "PENDING" and "requeued after NODE_FAIL" in outcome.cause, str(outcome)
    finally:
        back = script("restart.sh", str(two_nodes), "slurmd:node2")
        assert back.returncode == 0, back.stderr
    wait_for(lambda: "run 1" in log.read_text(), 120, "the second run")
    [outcome] = dlokit.wait(job_id, timeout_s=120)
    assert outcome.state == "COMPLETED", str(outcome)
    assert re.findall(r"^run \d", log.read_text(), re.M) == ["run 0", "run 1"]


def test_two_clusters_in_one_runs_folder_keep_their_records_apart(slurm_cluster, _two_node_cluster, workspace,
                                                                   monkeypatch):
    """Each cluster numbers its own jobs: a run record's id names its cluster (`<job>@<cluster>`), so jobs of two
    clusters writing into one runs folder never share a folder, and each job's card leads to its own record."""
    recorded = f"{REPO / 'tests' / 'job_scripts' / 'recorded_sleep.py'} 0.3"
    found = {}
    for profile, env in (("local-slurm", {}), ("local-slurm-2n", _two_node_cluster[1])):
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        dlokit.use_profile(profile)
        [job] = dlokit.gpu_jobs_submitter(recorded, n_gpu=1, name="clusters", time_max="00:02:00", verbose=False)
        assert dlokit.wait([job], timeout_s=240)[0].state == "COMPLETED"
        card = jobs.find_card(job)
        assert card.cluster and card.run_dir.name == f"{job}@{card.cluster}"
        run = load_run(job)
        assert run.path == card.run_dir and run.info["run_id"] == card.run_dir.name and run.state == "completed"
        found[card.cluster] = card.run_dir
    assert len(found) == 2 and len(set(found.values())) == 2, found
    assert sorted(p.name for p in Path(os.environ["DLOKIT_RUNS_DIR"]).iterdir()) == sorted(p.name for p in found.values())
