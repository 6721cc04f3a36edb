"""Who am I in a distributed job? The rank bootstrap the training scripts import.

Reads, in this order:
  1. torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), which the
     kit's job wrapper also exports for submitit jobs on every backend;
  2. Slurm variables of an `srun` task (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, node list);
  3. otherwise a single process.

    from dlokit.in_job import rank
    env = rank.detect()
    device = rank.init_process_group()   # nccl on GPU, gloo on CPU; no-op for one process

Two ranks on one GPU (torchrun with more processes than visible GPUs, or every rank shown the same one) are
refused before NCCL starts, with the fix: NCCL's own refusal is a bare "Duplicate GPU detected" deep in a traceback.
"""
from __future__ import annotations

import os
import re
import socket
import time
from dataclasses import dataclass
from datetime import timedelta

from . import jobenv


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int  # LOCAL_RANK: this rank's GPU among those it sees (0 in a kit task, which sees only its own)
    world_size: int
    local_world_size: int
    task_on_node: int  # this rank's index among its node's tasks
    tasks_on_node: int
    master_addr: str
    master_port: int
    source: str  # "torchrun", "slurm" or "single"
    cpus_per_task: int
    job_id: str | None
    hostnames: tuple[str, ...]

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def expand_hostlist(nodelist: str) -> list[str]:
    """Expand a Slurm host list such as ``node[01-03,07],gpu5`` or ``r[1-2]n[0-1]`` into host names."""
    hosts: list[str] = []
    for part in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", nodelist):
        hosts.extend(_expand_one(part))
    return hosts


def _expand_one(name: str) -> list[str]:
    match = re.match(r"([^\[]*)\[([^\]]*)\](.*)", name)
    if not match:
        return [name]
    prefix, ranges, rest = match.groups()
    expanded = []
    for item in ranges.split(","):
        low, _, high = item.partition("-")
        for number in range(int(low), int(high or low) + 1):
            expanded += [f"{prefix}{number:0{len(low)}d}{tail}" for tail in _expand_one(rest)]
    return expanded


def tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """This node's task count from Slurm's ``SLURM_TASKS_PER_NODE`` (``4(x2)``, ``2(x2),1``: one entry per node)."""
    counts = []
    for count, repeat in re.findall(r"(\d+)(?:\(x(\d+)\))?", tasks_per_node):
        counts += [int(count)] * int(repeat or 1)
    return counts[node_id] if node_id < len(counts) else (counts[0] if counts else 1)


# Rendezvous ports stay below Linux's ephemeral range (32768-60999), where the kernel hands out ports
# to outgoing connections and Jupyter kernels listen: a port picked there may be taken already.
PORT_LOW, PORT_HIGH = 20000, 32767


def port_from_job_id(job_id: str | None) -> int:
    """The same port in every task of a job (each computes it alone), different for jobs running together."""
    digits = re.sub(r"\D", "", job_id or "")
    return PORT_LOW + int(digits) % (PORT_HIGH - PORT_LOW + 1) if digits else 29500


def free_port(start: int) -> int:
    """The first port from `start` on (wrapping within the range) that nothing on this host has bound."""
    span = PORT_HIGH - PORT_LOW + 1
    for step in range(span):
        port = PORT_LOW + (start - PORT_LOW + step) % span
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
        return port
    return start


def _cpus_per_task(env) -> int:
    if env.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return int(env["SLURM_CPUS_PER_TASK"])
    if jobenv.cpus_per_task(env):
        return jobenv.cpus_per_task(env)
    return max(1, (os.cpu_count() or 1) // int(env.get(jobenv.TASKS_ON_NODE) or env.get("LOCAL_WORLD_SIZE") or 1))


def detect(env=None) -> DistEnv:
    """Read the process's place in the job from the environment (no side effects)."""
    env = os.environ if env is None else env
    job_id = env.get(jobenv.RUN_ID) or env.get("SLURM_JOB_ID") or env.get("SUBMITIT_LOCAL_JOB_ID")

    if "RANK" in env and "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        local_rank, local_world = int(env.get("LOCAL_RANK", "0")), int(env.get("LOCAL_WORLD_SIZE", world))
        return DistEnv(
            rank=int(env["RANK"]),
            local_rank=local_rank,
            world_size=world,
            local_world_size=local_world,
            task_on_node=int(env.get(jobenv.TASK_ON_NODE) or local_rank),  # the kit's task wrapper's, or torchrun's
            tasks_on_node=int(env.get(jobenv.TASKS_ON_NODE) or local_world),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", "29500")),
            source="torchrun",
            cpus_per_task=_cpus_per_task(env),
            job_id=job_id,
            hostnames=tuple(expand_hostlist(env.get("SLURM_JOB_NODELIST", "")) or [env.get("MASTER_ADDR", "127.0.0.1")]),
        )

    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:
        world = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS", "1"))
        hosts = expand_hostlist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")) or ["127.0.0.1"]
        tasks_per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "1")
        local_rank = int(env.get("SLURM_LOCALID", "0"))
        local_world = tasks_on_node(tasks_per_node, int(env.get("SLURM_NODEID") or 0))
        return DistEnv(
            rank=int(env["SLURM_PROCID"]),
            local_rank=local_rank,
            world_size=world,
            local_world_size=local_world,
            task_on_node=local_rank,
            tasks_on_node=local_world,
            master_addr=hosts[0],
            master_port=int(env.get("MASTER_PORT") or port_from_job_id(env.get("SLURM_JOB_ID"))),
            source="slurm",
            cpus_per_task=_cpus_per_task(env),
            job_id=job_id,
            hostnames=tuple(hosts),
        )

    return DistEnv(
        rank=0, local_rank=0, world_size=1, local_world_size=1, task_on_node=0, tasks_on_node=1,
        master_addr="127.0.0.1", master_port=29500, source="single",
        cpus_per_task=_cpus_per_task(env), job_id=job_id, hostnames=(socket.gethostname(),),
    )


STORE_POLL_S = 0.01


def wait_for_store(host: str, port: int, timeout_s: float) -> None:
    """Return once rank 0's store accepts connections (or after timeout_s: the rendezvous then says why). A rank that
    asks before the store listens is refused, and torch's client waits out a growing backoff before it asks again:
    0.4-0.7 s of a two-rank job's start on this machine whenever rank 1 started first (2026-11-28)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            time.sleep(STORE_POLL_S)


def init_process_group(backend: str | None = None, timeout_s: float = 300.0, device: str | None = None):
    """Join the job's process group (when there is more than one process) and return the device.

    The device is this process's GPU when there is one, else the CPU; ``device="cpu"`` forces the CPU
    and ``device="cuda"`` insists on a GPU. The backend is nccl on GPU and gloo on CPU, unless given.
    """
    import torch
    import torch.distributed as dist

    env = detect()
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False")
    if torch.cuda.is_available() and device != "cpu":
        device = torch.device("cuda", env.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        # each rank stands for one GPU: give it its share of the cores, not all of them (oversubscribed
        # OpenMP threads make several ranks on one machine many times slower)
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(env.cpus_per_task)

    if env.distributed and not dist.is_initialized():
        if env.rank != 0:
            wait_for_store(env.master_addr, env.master_port, timeout_s)
        # the store init_method="tcp://..." would open (torchrun's agent's, or rank 0's), opened first to ask each rank
        # which GPU it drives
        store, _, _ = next(dist.rendezvous(f"tcp://{env.master_addr}:{env.master_port}", rank=env.rank,
                                           world_size=env.world_size, timeout=timedelta(seconds=timeout_s)))
        store.set_timeout(timedelta(seconds=timeout_s))
        if device.type == "cuda":
            check_own_gpus(store, env, device)
        dist.init_process_group(
            backend=backend or ("nccl" if device.type == "cuda" else "gloo"),
            store=store,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=timeout_s),
            device_id=device if device.type == "cuda" else None,
        )
    return device


def gpu_identity(device) -> str:
    """The GPU a rank drives, the same string in every process that drives it: host and CUDA's uuid."""
    import torch

    properties = torch.cuda.get_device_properties(device)
    return f"{socket.gethostname()}/{getattr(properties, 'uuid', None) or properties.name + ':' + str(device.index)}"


def check_own_gpus(store, env: DistEnv, device) -> None:
    """Each rank posts the GPU it drives in the rendezvous store and reads the others': two ranks on one GPU
    raise here, on every rank, with what to do (NCCL would refuse them with a bare error)."""
    import torch

    store.set(f"dlokit/gpu/{env.rank}", gpu_identity(device))
    drivers: dict[str, list[int]] = {}
    for other in range(env.world_size):  # get() waits until that rank has posted
        drivers.setdefault(store.get(f"dlokit/gpu/{other}").decode(), []).append(other)
    shared = {gpu: ranks for gpu, ranks in drivers.items() if len(ranks) > 1}
    if shared:
        gpu, ranks = next(iter(shared.items()))
        raise RuntimeError(
            f"ranks {ranks} would all drive one GPU ({gpu}): NCCL needs one GPU per rank, and this process sees "
            f"{torch.cuda.device_count()} for {env.tasks_on_node} ranks on its node. Give each rank its own GPU "
            "(CUDA_VISIBLE_DEVICES listing as many GPUs as ranks per node, or the kit's jobs, which hand each task "
            "its own), start fewer ranks (--nproc_per_node at most the GPUs), or run the ranks as CPU processes "
            "with gloo (CUDA_VISIBLE_DEVICES= , empty)")


def destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
