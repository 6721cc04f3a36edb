"""Notebook cell -> submitit -> scheduler: every job of the course is sent from here.

    ids = dlokit.gpu_jobs_submitter("train_classifier.py --test", n_gpu=[1, 2], name="alice")

Each job runs one task per GPU; every task runs `python -u <script> <args>` through submitit's
CommandFunction, with the torch.distributed variables exported first (see ScriptTask). Arguments
travel as a list, never through a shell, so quotes, `;`, `$()` or backticks stay plain text.
"""
from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path

import submitit
from submitit.helpers import CommandFunction, TorchDistributedEnvironment

from . import jobs
from .jobspec import JobSpec, JobSpecError, Layout, plan, slurm_parameters
from .profiles import Profile, current_profile


class ScriptTask:
    """The function submitit runs in every task of a job."""

    def __init__(self, argv: list[str], python: str, cwd: str, env: dict):
        self.argv, self.python, self.cwd, self.env = argv, python, cwd, env

    def __call__(self) -> str:
        TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        env = {**os.environ, "DLOKIT_RUN_ID": submitit.JobEnvironment().job_id, **self.env}
        return CommandFunction([self.python, "-u", *self.argv], cwd=self.cwd, env=env)()


def _executor(profile: Profile, folder: Path, layout: Layout, spec: JobSpec):
    if profile.backend == "slurm":
        executor = submitit.SlurmExecutor(folder=folder, python=profile.python or None)
        executor.update_parameters(**slurm_parameters(spec, profile, layout))
    else:
        executor = submitit.LocalExecutor(folder=folder)
        executor.update_parameters(timeout_min=layout.time_seconds / 60, tasks_per_node=layout.tasks_per_node,
                                   gpus_per_node=layout.gpus_per_node, signal_delay_s=5)
    return executor


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

    cards = []
    groups = itertools.groupby(sorted(zip(specs, layouts), key=lambda p: _group_key(*p)), key=lambda p: _group_key(*p))
    for _, members in groups:
        members = list(members)
        spec, layout = members[0]
        folder = profile.logs / spec.name
        executor = _executor(profile, folder, layout, spec)
        python = profile.python or sys.executable
        env = {"DLOKIT_RUNS_DIR": str(profile.runs), "PYTHONUNBUFFERED": "1",
               "DLOKIT_CPUS_PER_TASK": str(layout.cpus_per_task), **profile.env}
        tasks = [ScriptTask(s.argv, python, os.getcwd(), {**env, "DLOKIT_JOB_NAME": s.name, **s.env})
                 for s, _ in members]
        with executor.batch():
            submitted = [executor.submit(task) for task in tasks]
        for (member, member_layout), job in zip(members, submitted):
            card = jobs.JobCard(job_id=str(job.job_id), name=member.name, backend=profile.backend,
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


def _have_sbatch() -> bool:
    from shutil import which

    return which("sbatch") is not None


def gpu_jobs_submitter(command_or_list, n_gpu=1, module=None, name="dlokit", n_gpu_per_task=1,
                       time_max="00:10:00", qos=None, partition=None, constraint=None, cpus_per_task=None,
                       exclusive=False, account=None, verbose=True, **ignored) -> list[str]:
    """Submit one job per (command, GPU count) combination; returns the job ids.

    Course-compatible signature: `command_or_list` is a command line such as
    'train_classifier.py --batch-size 64' or a list of them, `n_gpu` an int or a list of ints.
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
    return [card.job_id for card in submit(specs, profile, verbose=verbose)]

