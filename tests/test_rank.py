"""The rank bootstrap reads torchrun, Slurm or nothing, and agrees with idr_torch's names."""
import pytest

from dlokit.in_job import rank


@pytest.mark.parametrize("nodelist,hosts", [
    ("node1", ["node1"]),
    ("node[01-03]", ["node01", "node02", "node03"]),
    ("gpu[1,4-5],login2", ["gpu1", "gpu4", "gpu5", "login2"]),
    ("r[8-9]i1n[0-1]", ["r8i1n0", "r8i1n1", "r9i1n0", "r9i1n1"]),
    ("a[1-2],b[3],c", ["a1", "a2", "b3", "c"]),
])
def test_expand_hostlist(nodelist, hosts):
    assert rank.expand_hostlist(nodelist) == hosts


def test_single_process_without_any_launcher():
    env = rank.detect({})
    assert (env.rank, env.world_size, env.source, env.distributed) == (0, 1, "single", False)


def test_torchrun_variables():
    env = rank.detect({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "n1", "MASTER_PORT": "1234"})
    assert (env.rank, env.local_rank, env.world_size, env.master_addr, env.master_port) == (3, 1, 4, "n1", 1234)
    assert env.source == "torchrun"


def test_slurm_srun_task():
    env = rank.detect({"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "8",
                       "SLURM_STEP_NUM_TASKS": "8", "SLURM_JOB_ID": "424242", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
                       "SLURM_STEP_NODELIST": "jz[010-011]", "SLURM_CPUS_PER_TASK": "10"})
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (5, 1, 8, 4)
    assert env.master_addr == "jz010" and env.hostnames == ("jz010", "jz011")
    assert env.master_port == rank.port_from_job_id("424242") and env.cpus_per_task == 10 and env.source == "slurm"


def test_rendezvous_ports_stay_below_the_ephemeral_range_and_skip_a_taken_one():
    """Outgoing connections and Jupyter kernels take ports in 32768-60999: a job's port is picked below."""
    ports = {rank.port_from_job_id(str(job_id)) for job_id in range(100000, 100500)}
    assert len(ports) == 500 and all(rank.PORT_LOW <= p < 32768 for p in ports)
    import socket

    with socket.socket() as taken:
        taken.bind(("", rank.PORT_HIGH))
        taken.listen()
        port = rank.free_port(rank.PORT_HIGH)
        assert port != rank.PORT_HIGH and rank.PORT_LOW <= port < rank.PORT_HIGH  # wrapped around within the range


def test_batch_script_outside_srun_is_a_single_process():
    """In the batch script itself (no srun step) SLURM_NTASKS is the job's, not this process's."""
    env = rank.detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "7"})
    assert env.world_size == 1 and env.source == "single"


def test_init_process_group_returns_cpu_device_for_one_process(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    assert str(rank.init_process_group()) == "cpu"


def test_cpu_ranks_get_their_share_of_the_cores(monkeypatch):
    import torch

    for key in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DLOKIT_CPUS_PER_TASK", "1")
    before = torch.get_num_threads()
    try:
        rank.init_process_group()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def _ranks_post_their_gpus(monkeypatch, visible_gpus, ranks=2):
    """`ranks` ranks of one node, each through check_own_gpus on a shared store, on a machine faked to show
    `visible_gpus` GPUs to every process (torchrun without the kit's per-task CUDA_VISIBLE_DEVICES)."""
    import threading
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist

    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible_gpus)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(uuid=f"GPU-{device.index}", name="fake"))
    store, errors = dist.HashStore(), {}

    def one(local_rank):
        env = rank.detect({"RANK": str(local_rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(local_rank)})
        try:
            rank.check_own_gpus(store, env, torch.device("cuda", local_rank % visible_gpus))
        except RuntimeError as error:
            errors[local_rank] = str(error)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return errors


def test_two_ranks_on_one_gpu_are_refused_with_the_fix(monkeypatch):
    errors = _ranks_post_their_gpus(monkeypatch, visible_gpus=1)
    assert sorted(errors) == [0, 1]  # every rank stops, before NCCL would refuse them
    for text in errors.values():
        assert "ranks [0, 1] would all drive one GPU" in text and "sees 1 for 2 ranks" in text
        assert "CUDA_VISIBLE_DEVICES" in text and "fewer ranks" in text and "gloo" in text


def test_ranks_on_their_own_gpus_pass(monkeypatch):
    assert _ranks_post_their_gpus(monkeypatch, visible_gpus=2) == {}


NODE_OF_4_GPUS = {"RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "CUDA_VISIBLE_DEVICES": "0,1,2,3",
                  "MASTER_ADDR": "n1", "MASTER_PORT": "1234"}


def task_env(base: dict, task_on_node: int) -> dict:
    """What the kit's task wrapper gives task k of its node (the torch.distributed variables as submitit exports them)."""
    from dlokit.in_job import task

    env = {**base, "RANK": str(4 + task_on_node), "LOCAL_RANK": str(task_on_node)}
    env.update(task.own_gpus(env))
    return env


@pytest.mark.parametrize("k", range(4))
def test_each_task_of_a_4_gpu_node_drives_its_own_gpu_as_cuda_0(k):
    """deepspeed.initialize calls torch.cuda.set_device(int(os.environ["LOCAL_RANK"])): a task that sees one GPU
    must read LOCAL_RANK 0 (k: "invalid device ordinal" from rank 1 on), and the kit still knows it is task k."""
    env = task_env(NODE_OF_4_GPUS, k)
    assert env["CUDA_VISIBLE_DEVICES"] == str(k)  # its own one of the node's 4
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("0", "1")
    seen = rank.detect(env)
    assert (seen.local_rank, seen.local_world_size, seen.rank, seen.world_size) == (0, 1, 4 + k, 8)
    assert (seen.task_on_node, seen.tasks_on_node) == (k, 4)


def test_cpu_tasks_and_torchrun_keep_their_local_rank():
    """No GPUs to slice (CPU ranks), or torchrun's processes that each see every GPU: LOCAL_RANK k is theirs."""
    env = task_env({**NODE_OF_4_GPUS, "CUDA_VISIBLE_DEVICES": ""}, 2)
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("2", "4")
    assert (rank.detect(env).task_on_node, rank.detect(env).tasks_on_node) == (2, 4)
    torchrun = rank.detect({**NODE_OF_4_GPUS, "LOCAL_RANK": "2"})
    assert (torchrun.local_rank, torchrun.task_on_node, torchrun.tasks_on_node) == (2, 2, 4)


def test_a_task_is_pinned_to_its_gpus_cores_not_to_cuda_0s(monkeypatch):
    """LOCAL_RANK is 0 in every task of a GPU job: the cores follow the task's place on its node."""
    import os

    from dlokit.in_job import jobenv, task

    pinned = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cores: pinned.append(list(cores)))
    env = task_env({**NODE_OF_4_GPUS, jobenv.DEVICES: "gpu0,gpu1,gpu2,gpu3", jobenv.CPUS_PER_TASK: "2"}, 1)
    assert task._pin_to_own_cores(env) == 2 and pinned == [[2, 3]]


def test_bench_pin_rank_pins_a_kit_task_by_its_place_on_the_node(monkeypatch):
    """bench/pin_rank.py inside a kit GPU job: every task reads LOCAL_RANK 0, its cores follow DLOKIT_TASK_ON_NODE."""
    import importlib.util
    import os
    import runpy
    import sys
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("pin_rank", Path(__file__).parents[1] / "bench" / "pin_rank.py")
    pin_rank = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pin_rank)
    pinned = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cores: pinned.append(list(cores)))
    monkeypatch.setattr(runpy, "run_path", lambda *args, **kwargs: None)
    monkeypatch.setattr(sys, "argv", ["pin_rank.py", "script.py"])
    monkeypatch.setattr(sys, "path", list(sys.path))
    for key, value in task_env({**NODE_OF_4_GPUS, "OMP_NUM_THREADS": "2"}, 3).items():
        monkeypatch.setenv(key, value)
    pin_rank.main()
    assert pinned == [[6, 7]]
