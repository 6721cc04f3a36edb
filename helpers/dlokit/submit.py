"""Notebook cell -> submitit -> scheduler: every job of the course is sent from here.

    ids = dlokit.gpu_jobs_submitter("train_classifier.py --test", n_gpu=[1, 2], name="alice")

Each job runs one task per GPU; every task runs `python -u <script> <args>` through submitit's
CommandFunction, with the torch.distributed variables exported first (see ScriptTask). Arguments
travel as a list, never through a shell, so quotes, `;`, `$()` or backticks stay plain text.
"""
from __future__ import annotations

import itertools
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import submitit
from submitit.helpers import CommandFunction, TorchDistributedEnvironment
from submitit.local.local import LocalJob

from . import devices, jobenv, jobs
from .jobspec import JobSpec, JobSpecError, Layout, plan, setup_lines, slurm_parameters, uses_modules
from .profiles import Profile, current_profile


class ScriptTask:
    """The function submitit runs in every task of a job."""

    def __init__(self, argv: list[str], python: str, cwd: str, env: dict):
        self.argv, self.python, self.cwd, self.env = argv, python, cwd, env

    def __call__(self) -> str:
        TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        env = {**os.environ, jobenv.RUN_ID: submitit.JobEnvironment().job_id, **self.env}
        _pin_to_own_cores(env)
        return CommandFunction([self.python, "-u", *self.argv], cwd=self.cwd, env=env)()


def _pin_to_own_cores(env: dict) -> None:
    """On the local backend each task keeps to its device's share of the cores (inherited by the script).

    Task k of a job on the CPU gets cores [k*c, (k+1)*c); on GPU g it gets the g-th slice, so two
    jobs on two GPUs never share a core either.
    """
    held = [d for d in env.get(jobenv.DEVICES, "").split(",") if d]
    cpus = jobenv.cpus_per_task(env)
    if not held or not cpus or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    local_rank = int(env.get("LOCAL_RANK", "0"))
    gpu_ids = [d[3:] for d in held if d.startswith("gpu")]
    slot = int(gpu_ids[local_rank]) if gpu_ids and gpu_ids[local_rank].isdigit() else local_rank
    mine = cores[slot * cpus:(slot + 1) * cpus] or cores[-cpus:]
    os.sched_setaffinity(0, mine)
    env.setdefault("OMP_NUM_THREADS", str(len(mine)))


class DeviceLockedLocalExecutor(submitit.LocalExecutor):
    """submitit's local executor, whose job controller starts only once the job's devices are free
    (see dlokit.devices). Only how the controller is started differs; submitit does the rest."""

    def __init__(self, folder: Path, need: int, among: list[str], name: str):
        super().__init__(folder=folder)
        self.need, self.among, self.name = need, among, name

    def _submit_command(self, command: str) -> LocalJob:
        ntasks = self.parameters.get("tasks_per_node", 1)
        env = {**os.environ,  # the same variables submitit's own start_controller sets
               "SUBMITIT_LOCAL_NTASKS": str(ntasks), "SUBMITIT_LOCAL_COMMAND": command,
               "SUBMITIT_LOCAL_TIMEOUT_S": str(int(60 * self.parameters.get("timeout_min", 2.0))),
               "SUBMITIT_LOCAL_SIGNAL_DELAY_S": str(int(self.parameters.get("signal_delay_s", 30))),
               "SUBMITIT_LOCAL_NODEID": "0", "SUBMITIT_LOCAL_JOB_NUM_NODES": "1", "SUBMITIT_STDERR_TO_STDOUT": "",
               "SUBMITIT_EXECUTOR": "local", "CUDA_VISIBLE_DEVICES": "", "SUBMITIT_LOCAL_WITH_SHELL": "1"}
        argv = [sys.executable, "-m", "dlokit.device_launcher", "--need", str(self.need), "--among", ",".join(self.among),
                "--folder", str(self.folder), "--name", self.name, "--",
                sys.executable, "-m", "submitit.local._local", str(self.folder)]
        with open(self.folder / "launchers.log", "ab") as log:  # anything said before the launcher's own log opens
            # a new session: a Ctrl-C in the notebook does not reach the job
            process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                       start_new_session=True)
        return LocalJob(folder=self.folder, job_id=str(process.pid), process=process, tasks=list(range(ntasks)))


def _executor(profile: Profile, folder: Path, layout: Layout, spec: JobSpec):
    if profile.backend == "slurm":
        executor = submitit.SlurmExecutor(folder=folder, python=profile.python or None)
        executor.update_parameters(**slurm_parameters(spec, profile, layout))
    else:
        folder.mkdir(parents=True, exist_ok=True)
        among = devices.machine_devices()
        need = 1 if among == ["cpu"] else layout.n_gpu
        executor = DeviceLockedLocalExecutor(folder, need=need, among=among, name=spec.name)
        executor.update_parameters(timeout_min=layout.time_seconds / 60, tasks_per_node=layout.tasks_per_node,
                                   signal_delay_s=5)
    return executor


def new_local_job_id(profile: Profile) -> str:
    """A local job id that no earlier run or job card of this profile used (pids get recycled)."""
    while True:
        job_id = f"{time.strftime('%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        if not (profile.runs / job_id).exists() and not list(profile.logs.glob(f"*/{job_id}_job.json")):
            return job_id


def submit(specs: JobSpec | list[JobSpec], profile: Profile | None = None, verbose: bool = True) -> list[jobs.JobCard]:
    """Check every job first (nothing is written if one is wrong), then submit; returns their cards.

    Jobs with the same layout are sent together (a job array on Slurm).
    """
    specs = [specs] if isinstance(specs, JobSpec) else list(specs)
    profile = profile or current_profile()
    layouts = [plan(spec, profile) for spec in specs]
    if profile.backend == "slurm" and not _have_sbatch():
        raise JobSpecError(f"profile {profile.name!r} submits to Slurm but 'sbatch' is not on PATH here; "
                           "use dlokit.use_profile('local') or run on the cluster's login node")
    if profile.backend == "slurm":
        _check_module_system(specs, profile, verbose)

    cards = []
    groups = itertools.groupby(sorted(zip(specs, layouts), key=lambda p: _group_key(*p)), key=lambda p: _group_key(*p))
    for _, members in groups:
        members = list(members)
        spec, layout = members[0]
        folder = profile.logs / spec.name
        executor = _executor(profile, folder, layout, spec)
        python = profile.python or sys.executable
        local = profile.backend == "local"
        run_ids = [new_local_job_id(profile) if local else None for _ in members]
        tasks = [ScriptTask(s.argv, python, os.getcwd(),
                            {**jobenv.task_environment(runs_dir=profile.runs, job_name=s.name, run_id=run_id,
                                                       cpus_per_task=layout.cpus_per_task), **profile.env, **s.env})
                 for (s, _), run_id in zip(members, run_ids)]
        with executor.batch():
            submitted = [executor.submit(task) for task in tasks]
        for (member, member_layout), job, run_id in zip(members, submitted, run_ids):
            card = jobs.JobCard(job_id=run_id or str(job.job_id), native_id=str(job.job_id), name=member.name,
                                backend=profile.backend,
                                profile=profile.name, folder=str(folder), argv=member.argv,
                                command_line=member.command_line, n_gpu=member_layout.n_gpu,
                                nodes=member_layout.nodes, tasks=member_layout.tasks,
                                time_seconds=member_layout.time_seconds, runs_dir=str(profile.runs),
                                submitted_at=time.time())
            card.save()
            jobs.remember(card, job)
            cards.append(card)
            if verbose:
                print(f"submitted {card.job_id} | {member_layout.summary(member.name)}")
                print(f"    {member.command_line}")
    return cards


def _group_key(spec: JobSpec, layout: Layout):
    return (spec.name, repr(layout), spec.module or "", spec.qos or "", spec.partition or "",
            spec.constraint or "", spec.account or "", spec.exclusive)


def _check_module_system(specs: list[JobSpec], profile: Profile, verbose: bool) -> None:
    """A `module` line where there are no environment modules would only fail inside the job: say it now."""
    notices = {setup_lines(spec, profile)[1] for spec in specs} - {""}
    if verbose:
        for notice in sorted(notices):
            print(notice)
    has_modules = any(os.environ.get(key) for key in ("MODULESHOME", "LMOD_CMD", "MODULEPATH"))
    if uses_modules(profile.setup) and not has_modules:
        raise JobSpecError(f"profile {profile.name!r} loads environment modules ({'; '.join(profile.setup)}) but "
                           "this machine has none ($MODULESHOME is not set): the job would fail with "
                           "'module: command not found'. Remove the module lines from the profile's `setup`, "
                           "or submit from the cluster's login node")


def _have_sbatch() -> bool:
    from shutil import which

    return which("sbatch") is not None


def gpu_jobs_submitter(command_or_list, n_gpu=1, module=None, name="dlokit", n_gpu_per_task=1,
                       time_max="00:10:00", qos=None, partition=None, constraint=None, cpus_per_task=None,
                       exclusive=False, account=None, verbose=True, wait=False, refresh_s=5.0,
                       **ignored) -> list[str]:
    """Submit one job per (command, GPU count) combination; returns the job ids.

    Course-compatible signature: `command_or_list` is a command line such as
    'train_classifier.py --batch-size 64' or a list of them, `n_gpu` an int or a list of ints.
    `wait=True` then shows the live queue of these jobs (dlokit.display_slurm_queue) until they end.
    """
    commands = [command_or_list] if isinstance(command_or_list, str) else list(command_or_list)
    gpu_counts = n_gpu if isinstance(n_gpu, (list, tuple)) else [n_gpu]
    if ignored and verbose:
        print(f"note: ignored options on this kit: {', '.join(sorted(ignored))}")
    profile = current_profile()
    specs = [JobSpec.from_command(cmd, name=name, n_gpu=gpus, n_gpu_per_task=n_gpu_per_task, time_max=time_max,
                                  module=module, qos=qos, partition=partition, constraint=constraint,
                                  account=account, cpus_per_task=cpus_per_task, exclusive=exclusive)
             for cmd in commands for gpus in gpu_counts]
    ids = [card.job_id for card in submit(specs, profile, verbose=verbose)]
    if wait:
        from .queue import display_slurm_queue

        display_slurm_queue(name, timestep=refresh_s, job_ids=ids)
    return ids

