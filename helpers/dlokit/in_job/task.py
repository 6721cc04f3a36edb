"""The function submitit runs in every task of a job: inside the job, beside the training script.

It exports the torch.distributed variables (rank, world size, master address and port), gives each task its
own GPU(s) and cores, applies the job's memory limit on the local backend, runs `python -u <script> <args>`
(a list, never a shell string), passes a cancel on to the script, and leaves `<job>_<task>_usage.json` beside
the logs for dlokit.job_outcome.
"""
from __future__ import annotations

import json
import os
import resource
import signal
from pathlib import Path

import psutil
import submitit
from submitit.core.utils import FailedJobError
from submitit.helpers import CommandFunction, TorchDistributedEnvironment

from . import jobenv, rank, warm_start



class ScriptTask:
    """The function submitit runs in every task of a job."""

    def __init__(self, argv: list[str], python: str, cwd: str, env: dict):
        self.argv, self.python, self.cwd, self.env = argv, python, cwd, env

    def __call__(self) -> str:
        job = submitit.JobEnvironment()
        if job.cluster == "slurm":  # the job's own port, not one inherited from the submitting shell
            os.environ["MASTER_PORT"] = str(rank.port_from_job_id(job.job_id))
        # (a local job's launcher has set one it found free)
        TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        run_id = jobenv.slurm_run_id(os.environ) if job.cluster == "slurm" else job.job_id  # `<id>@<cluster>`
        env = {**os.environ, jobenv.RUN_ID: run_id, **self.env}
        env.update(own_gpus(env))
        cpus = _pin_to_own_cores(env) or jobenv.cpus_per_task(env)
        if cpus and "OMP_NUM_THREADS" not in self.env:  # the task's CPUs, not the node's
            env["OMP_NUM_THREADS"] = str(cpus)
        command = [self.python, "-u", *self.argv]
        limit_mb = _memory_limit_mb(job, env)
        if env.get("SUBMITIT_EXECUTOR") == "local":  # the script under its memory limit, forked warm if it can be
            command = warm_start.command(self.python, self.argv, limit_mb * 1024 ** 2, str(_warm_usage_path(job)))
        stopped: list[int] = []

        def on_stop(signum, _frame):  # cancelled: tell the script (its RunRecorder records it), end quietly
            stopped.append(signum)
            for pid in children_of(os.getpid()):
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

        previous = signal.signal(signal.SIGTERM, on_stop)
        returncode = jobenv.EXIT_FAILED  # until the script has returned 0: the usage record decides COMPLETED
        try:
            output = CommandFunction(command, cwd=self.cwd, env=env)()
            returncode = 0
            return output
        except FailedJobError as err:
            returncode = getattr(err.__cause__, "returncode", 1)
            if stopped:
                raise SystemExit(128 + stopped[0]) from None  # no traceback: the job was cancelled
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
            _write_usage(job, limit_mb, returncode, stopped)


def own_gpus(env) -> dict:
    """The variables that give task k of the N on a node its own GPU(s): the node's CUDA_VISIBLE_DEVICES (set by
    Slurm or by the local launcher) sliced by k, so its GPU is cuda:0, and LOCAL_RANK / LOCAL_WORLD_SIZE counted
    over the GPUs it sees (0 of 1): DeepSpeed and idr_torch-style scripts call torch.cuda.set_device(LOCAL_RANK).
    k and N stay readable as jobenv.TASK_ON_NODE / TASKS_ON_NODE (its cores, its share of the node)."""
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    tasks = int(env.get("LOCAL_WORLD_SIZE") or 1)
    task = int(env.get("LOCAL_RANK") or 0)
    own = {jobenv.TASK_ON_NODE: str(task), jobenv.TASKS_ON_NODE: str(tasks)}
    if tasks > 1 and len(visible) >= tasks and len(visible) % tasks == 0:
        per_task = len(visible) // tasks
        own.update({"CUDA_VISIBLE_DEVICES": ",".join(visible[task * per_task:(task + 1) * per_task]),
                    "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    return own


def children_of(pid: int) -> list[int]:
    """The pids of a process's children (the script a task runs)."""
    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def _memory_limit_mb(job, env: dict) -> int:
    """Local backend: this task's share of the job's memory limit, which the launcher decided (0: none)."""
    if env.get("SUBMITIT_EXECUTOR") != "local":
        return 0  # Slurm enforces --mem itself
    try:
        note = json.loads((Path(job.paths.folder) / f"{job.job_id}_started.json").read_text())
        total = int(note.get("mem_limit_mb") or 0)
    except (OSError, ValueError, TypeError):
        return 0
    return max(1, total // max(1, job.num_tasks)) if total > 0 else 0


def _write_usage(job, limit_mb: int, returncode: int, stopped: list) -> None:
    """`<job>_<task>_usage.json` beside the logs: the script's peak memory and how it ended. job_outcome reads it
    (its returncode 0, in every task, is what makes a local job COMPLETED: submitit's result pickle is never read)."""
    try:
        peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        warm = _warm_usage_path(job)
        if warm.exists():  # the script was forked by the warm-start server, which measured it
            peak_kb = max(peak_kb, json.loads(warm.read_text())["peak_rss_kb"])
            warm.unlink()
        path = Path(job.paths.folder) / f"{job.job_id}_{job.global_rank}_usage.json"
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # whole or absent: a cut record reads UNKNOWN
        tmp.write_text(json.dumps({"peak_rss_mb": round(peak_kb / 1024, 1), "mem_limit_mb": limit_mb or None,
                                   "returncode": returncode, "cancelled": bool(stopped)}))
        os.replace(tmp, path)
    except OSError:
        pass


def _warm_usage_path(job) -> Path:
    return Path(job.paths.folder) / f"{job.job_id}_{job.global_rank}_warm_usage.json"


def _pin_to_own_cores(env: dict) -> int | None:
    """On the local backend each task keeps to its device's share of the cores (inherited by the script);
    returns how many it got (None: not pinned).

    Task k gets the slice of cores of the k-th device its job holds: on GPU g the g-th slice, on the CPU
    (devices cpu0, cpu1... standing for its cores) core k of a job that holds them all, or the core it was
    given: two jobs on two GPUs, or two jobs sharing the CPU, never share a core.
    """
    held = [d for d in env.get(jobenv.DEVICES, "").split(",") if d]
    cpus = jobenv.cpus_per_task(env)
    if not held or not cpus or not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    task = int(env.get(jobenv.TASK_ON_NODE) or 0)
    ids = [d[3:] for d in held if d[:3] in ("gpu", "cpu")]
    slot = int(ids[task]) if task < len(ids) and ids[task].isdigit() else task
    mine = cores[slot * cpus:(slot + 1) * cpus] or cores[-cpus:]
    os.sched_setaffinity(0, mine)
    return len(mine)
