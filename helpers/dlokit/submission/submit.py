"""Notebook cell -> submitit -> scheduler: every job of the course is sent from here.

    ids = dlokit.gpu_jobs_submitter("train_classifier.py --test", n_gpu=[1, 2], name="alice")

Each job runs one task per GPU; every task runs `python -u <script> <args>` through submitit's
CommandFunction, with the torch.distributed variables exported first (dlokit.in_job.task.ScriptTask). Arguments
travel as a list, never through a shell, so quotes, `;`, `$()` or backticks stay plain text.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import subprocess
import sys
import time
import traceback
from pathlib import Path

import submitit
from submitit.local.local import LocalJob

from . import devices, jobs
from ..in_job import jobenv, shared_folders
from .jobspec import (ClusterQueryError, JobSpec, JobSpecError, Layout, check_account, check_fits, check_name, cluster_limits, plan,
                      setup_lines, slurm_parameters, uses_modules)
from .profiles import Profile, current_profile, memory_mb
from ..script_modules import script_digests, script_files
from ..in_job.task import ScriptTask

class DeviceLockedLocalExecutor(submitit.LocalExecutor):
    """submitit's local executor, whose job controller starts only once the job's devices are free
    (see dlokit.submission.devices). Only how the controller is started differs; submitit does the rest."""

    def __init__(self, folder: Path, need: int, among: list[str], name: str, mem_mb: str = "0"):
        super().__init__(folder=folder)
        self.need, self.among, self.name, self.mem_mb = need, among, name, mem_mb

    def _submit_command(self, command: str) -> LocalJob:
        ntasks = self.parameters.get("tasks_per_node", 1)
        env = {**os.environ,  # the same variables submitit's own start_controller sets
               "SUBMITIT_LOCAL_NTASKS": str(ntasks), "SUBMITIT_LOCAL_COMMAND": command,
               "SUBMITIT_LOCAL_TIMEOUT_S": str(int(60 * self.parameters.get("timeout_min", 2.0))),
               "SUBMITIT_LOCAL_SIGNAL_DELAY_S": str(int(self.parameters.get("signal_delay_s", 30))),
               "SUBMITIT_LOCAL_NODEID": "0", "SUBMITIT_LOCAL_JOB_NUM_NODES": "1", "SUBMITIT_STDERR_TO_STDOUT": "",
               "SUBMITIT_EXECUTOR": "local", "CUDA_VISIBLE_DEVICES": "", "SUBMITIT_LOCAL_WITH_SHELL": "1"}
        argv = [sys.executable, "-m", "dlokit.submission.device_launcher", "--need", str(self.need), "--among", ",".join(self.among),
                "--folder", str(self.folder), "--name", self.name, "--mem-mb", self.mem_mb,
                "--submitted-ns", str(time.time_ns()), "--",
                sys.executable, "-m", "submitit.local._local", str(self.folder)]
        with open(self.folder / "launchers.log", "ab") as log:  # anything said before the launcher's own log opens
            # a new session: a Ctrl-C in the notebook does not reach the job
            process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                       start_new_session=True)
        _wait_until_queued(self.folder, process)
        return LocalJob(folder=self.folder, job_id=str(process.pid), process=process, tasks=list(range(ntasks)))


QUEUED_WITHIN_S = 30.0


def _wait_until_queued(folder: Path, process: subprocess.Popen) -> None:
    """Return once the launcher holds its ticket in the device queue (its waiting or start note exists), or has
    ended. The queue serves tickets in the order of submission, but a launcher slower to start than the next
    one found no older ticket and let the next job run first: Day 2's alternated 1- and 2-rank repeats ran
    2, 1, 1, 2. A launcher is queued about 0.2 s after it starts."""
    notes = [folder / f"{process.pid}_{kind}.json" for kind in ("waiting", "started")]
    deadline = time.monotonic() + QUEUED_WITHIN_S
    while process.poll() is None and not any(note.exists() for note in notes) and time.monotonic() < deadline:
        time.sleep(0.01)


def _executor(profile: Profile, folder: Path, layout: Layout, spec: JobSpec):
    if profile.backend == "slurm":
        executor = submitit.SlurmExecutor(folder=folder, python=profile.python or None)
        executor.update_parameters(**slurm_parameters(spec, profile, layout))
    else:
        folder.mkdir(parents=True, exist_ok=True)
        among = devices.machine_devices()
        need = devices.devices_needed(among, layout.n_gpu, spec.alone)
        executor = DeviceLockedLocalExecutor(folder, need=need, among=among, name=spec.name,
                                             mem_mb=_local_memory(profile, layout))
        executor.update_parameters(timeout_min=layout.time_seconds / 60, tasks_per_node=layout.tasks_per_node,
                                   signal_delay_s=5)
    return executor


def _local_memory(profile: Profile, layout: Layout) -> str:
    """The job's memory limit for the local launcher: MB, "auto" (sized when it starts) or "0" (none)."""
    mem = str(profile.mem).strip()
    if mem.lower() == "auto":
        return "auto"
    if mem:
        return str(memory_mb(mem))
    if profile.mem_per_cpu:
        return str(memory_mb(profile.mem_per_cpu) * layout.cpus_per_task * layout.tasks)
    return "0"


def new_local_job_id(profile: Profile) -> str:
    """A local job id that no earlier run or job card of this profile used (pids get recycled)."""
    while True:
        job_id = f"{time.strftime('%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        if not (profile.runs / job_id).exists() and not list(profile.logs.glob(f"*/{job_id}_job.json")):
            return job_id


def submit(specs: JobSpec | list[JobSpec], profile: Profile | None = None, verbose: bool = True,
           ignored=(), task_class=ScriptTask) -> list[jobs.JobCard]:
    """Check every job first (nothing is written if one is wrong), then submit; returns their cards.

    Jobs with the same layout are sent together (a job array on Slurm). `ignored`: names of options
    the caller received but does not know; they are reported with those this backend ignores.
    `task_class`: what runs in each task, a ScriptTask (dlokit.race.requeue.RequeueingTask: one that requeues).
    """
    specs = [specs] if isinstance(specs, JobSpec) else list(specs)
    profile = profile or current_profile()
    layouts = [plan(spec, profile) for spec in specs]
    _check_scripts(specs)
    if profile.backend == "slurm" and not _have_sbatch():
        raise JobSpecError(f"profile {profile.name!r} submits to Slurm but 'sbatch' is not on PATH here; "
                           "use dlokit.use_profile('local') or run on the cluster's login node")
    if profile.backend == "slurm":
        _check_module_system(specs, profile, verbose)
        _check_against_cluster(specs, layouts, profile, verbose)
    if verbose:
        _note_ignored(specs, profile, ignored)

    shared_folders.private_part(profile.logs, "your job logs")  # a clear error, before anything is submitted
    shared_folders.shared_top(profile.runs, "run records")
    if verbose:
        _note_unread_by_instructors(profile)
    cards = [None] * len(specs)
    cluster = jobs.current_cluster() if profile.backend == "slurm" else ""  # job ids are each cluster's own
    for batch in _batches(specs, layouts, profile.backend == "slurm"):
        indices, members = [i for i, _ in batch], [member for _, member in batch]
        spec, layout = members[0]
        folder = jobs.job_folder(profile, spec.name)
        executor = _executor(profile, folder, layout, spec)
        python = profile.python or sys.executable
        local = profile.backend == "local"
        run_ids = [new_local_job_id(profile) if local else None for _ in members]
        tasks = [task_class(s.argv, python, os.getcwd(),
                            {**jobenv.task_environment(runs_dir=profile.runs, job_name=s.name, run_id=run_id,
                                                       cpus_per_task=layout.cpus_per_task), **profile.env, **s.env})
                 for (s, _), run_id in zip(members, run_ids)]
        with _outside_this_job(), executor.batch():
            submitted = [executor.submit(task) for task in tasks]
        for index, (member, member_layout), job, run_id in zip(indices, members, submitted, run_ids):
            card = jobs.JobCard(job_id=run_id or str(job.job_id), native_id=str(job.job_id), name=member.name,
                                backend=profile.backend, cluster=cluster,
                                profile=profile.name, folder=str(folder), argv=member.argv,
                                command_line=member.command_line, n_gpu=member_layout.n_gpu,
                                nodes=member_layout.nodes, tasks=member_layout.tasks,
                                time_seconds=member_layout.time_seconds, runs_dir=str(profile.runs),
                                submitted_at=time.time(), expected=jobs.expected_ends(member.expected),
                                extra={"mem": str(profile.mem or ""), "mem_per_cpu": str(profile.mem_per_cpu or ""),
                                       "script_sha256": script_digests(member.script),
                                       **({"tag": member.env[jobenv.TAG]} if member.env.get(jobenv.TAG) else {})})
            card.save()
            jobs.remember(card, job)
            cards[index] = card
            if verbose:
                print(f"submitted {card.job_id} | {member_layout.summary(member.name)}")
                print(f"    {member.command_line}")
    return cards


@contextlib.contextmanager
def _outside_this_job():
    """Submit as if from outside any Slurm job. A notebook served from a Slurm job (JupyterHub's
    SlurmSpawner) has that job's SLURM_* variables, which would leak into the jobs it submits: e.g.
    SLURM_EXPORT_ENV (set by the spawner's --export) makes their srun pass on none of submitit's
    variables; SLURM_PROCID/SLURM_STEP_ID make a local job look like an srun task. SLURM_CONF names
    the cluster, not the job: kept."""
    saved = {key: os.environ.pop(key) for key in list(os.environ)
             if key.startswith(("SLURM_", "SLURMD_")) and key != "SLURM_CONF"}
    try:
        yield
    finally:
        os.environ.update(saved)


def _batches(specs: list[JobSpec], layouts: list[Layout], slurm: bool) -> list[list]:
    """The jobs sent together, as [(index in the caller's list, (spec, layout)), ...]. On Slurm, every job of
    one layout (a job array). Locally, each run of consecutive jobs of one layout: the local queue is first come,
    first served, so jobs start in the caller's order and arms submitted A B A B run A B A B (sorted by layout,
    Day 2's 1-rank and 2-rank repeats ran 1, 1, 2, 2, and a drift of the machine went into their ratio).
    The cards are returned in the caller's order either way."""
    indexed = list(enumerate(zip(specs, layouts)))
    if slurm:
        indexed.sort(key=lambda item: _group_key(*item[1]))
    return [list(batch) for _, batch in itertools.groupby(indexed, key=lambda item: _group_key(*item[1]))]


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


class ScriptSyntaxError(JobSpecError):
    """A file a job would run does not compile: nothing was submitted. A notebook shows its message alone, as Python
    shows a syntax error (file, line, the caret), not the kit's frames above it."""

    def _render_traceback_(self):  # IPython's hook: these lines in place of the traceback
        return str(self).splitlines()


def _check_scripts(specs: list[JobSpec]) -> None:
    """Every backend runs the script from the notebook's folder: it must be there now, and it and the modules of its
    folder it imports (the student's files) must compile: a syntax error is said now, not by a failed job."""
    paths = [Path(spec.script) if Path(spec.script).is_absolute() else Path.cwd() / spec.script for spec in specs]
    for spec, path in zip(specs, paths):
        if not path.is_file():
            raise JobSpecError(f"script {spec.script!r} not found (looked for {path}); "
                               "check the path relative to the notebook's folder")
    files = dict.fromkeys(file for path in dict.fromkeys(paths) for file in script_files(path))  # a sweep's: once
    for file in files:
        try:
            compile(file.read_bytes(), str(file), "exec")
        except SyntaxError as error:
            raise ScriptSyntaxError(f"{file.name} does not compile: nothing was submitted\n"
                                    + "".join(traceback.format_exception_only(error)).rstrip()) from None


def _check_against_cluster(specs: list[JobSpec], layouts: list[Layout], profile: Profile, verbose: bool) -> None:
    """Refuse what the cluster could never start (it would stay PENDING) or an account that is not the user's; if
    the cluster cannot be asked, say so."""
    try:
        for spec in specs:
            check_account(spec, profile)
    except ClusterQueryError as err:
        if verbose:
            print(f"note: could not ask Slurm's accounting for your accounts ({err}); submitting without checking")
    try:
        partitions = cluster_limits(profile)
    except ClusterQueryError as err:
        if verbose:
            print(f"note: could not ask the cluster for its limits ({err}); submitting without checking "
                  "the layout against its nodes")
        return
    for spec, layout in zip(specs, layouts):
        check_fits(spec, profile, layout, partitions)


_noted_folders: set[Path] = set()


def _note_unread_by_instructors(profile: Profile) -> None:
    """Once per folder and session: the profile names the instructors' group, but a class folder is not theirs."""
    group = profile.instructors_group
    for top in (profile.logs.parent, profile.runs) if group else ():
        if top not in _noted_folders and not shared_folders.read_by_group(top, group):
            _noted_folders.add(top)
            print(f"note: the instructors ({group!r}) cannot read what you write in {top}: it should be a class "
                  f"folder of their group (an instructor runs `install -d -m 3777 -g {group} {top}`)")


SLURM_ONLY = ("account", "partition", "qos", "constraint", "module")


def _note_ignored(specs: list[JobSpec], profile: Profile, ignored) -> None:
    """One line naming every option that has no effect here (Slurm options on the local backend, unknown ones)."""
    names = []
    if profile.backend == "local":
        names += [f"{key} (Slurm only)" for key in SLURM_ONLY if any(getattr(spec, key) for spec in specs)]
    names += [f"{key} (unknown)" for key in sorted(ignored)]
    if names:
        print(f"note: ignored on profile {profile.name!r}: {', '.join(names)}")


def _have_sbatch() -> bool:
    from shutil import which

    return which("sbatch") is not None


def gpu_jobs_submitter(command_or_list, n_gpu=1, module=None, name="dlokit", n_gpu_per_task=1,
                       time_max="00:10:00", qos=None, partition=None, constraint=None, cpus_per_task=None,
                       exclusive=False, account=None, verbose=True, wait=False, refresh_s=5.0, tag=None,
                       alone=True, expected=None, **ignored) -> list[str]:
    """Submit one job per (command, GPU count) combination; returns the job ids.

    Course-compatible signature: `command_or_list` is a command line such as
    'train_classifier.py --batch-size 64' or a list of them, `n_gpu` an int or a list of ints.
    A `(command, n_gpu)` pair in the list gives that job its own GPU count instead.
    `wait=True` then shows the live queue of these jobs (dlokit.display_slurm_queue) until they end.
    `tag` (e.g. "TP1.2") is written into each run record and job card: the class report groups runs by it.
    `alone=False`: the jobs measure accuracy, not speed, and may share the machine (on this machine's CPU one
    core per task, beside another such job; on a profile with exclusive_measurements, no --exclusive); their
    run records say so, and the views never count their speed as a measurement.
    `expected`: how a job is meant to end when it fails by design, {state: why} (e.g. {"OUT_OF_MEMORY": "DDP keeps
    a whole copy per rank"}), for every job, or a list of them (None: meant to complete) in the jobs' order; its
    card, the queue and the runs table then read "failed as expected (why)".
    """
    commands = [command_or_list] if isinstance(command_or_list, str) else list(command_or_list)
    gpu_counts = n_gpu if isinstance(n_gpu, (list, tuple)) else [n_gpu]
    wanted = [pair for item in commands for pair in ([tuple(item)] if isinstance(item, tuple) else
                                                    [(item, gpus) for gpus in gpu_counts])]
    meant = list(expected) if isinstance(expected, (list, tuple)) else [expected] * len(wanted)
    if len(meant) != len(wanted):
        raise ValueError(f"expected: {len(meant)} entries for {len(wanted)} jobs")
    meant = [jobs.expected_ends(m) for m in meant]  # checked before anything is submitted
    if tag:
        check_name(str(tag), label="tag")  # it reaches the class report's grid and the instructor's terminal
    profile = current_profile()
    specs = [JobSpec.from_command(cmd, name=name, n_gpu=gpus, n_gpu_per_task=n_gpu_per_task, time_max=time_max,
                                  module=module, qos=qos, partition=partition, constraint=constraint,
                                  account=account, cpus_per_task=cpus_per_task, exclusive=exclusive, alone=alone,
                                  env={**({jobenv.TAG: str(tag)} if tag else {}), **({} if alone else {jobenv.SHARED: "1"})},
                                  expected=ends)
             for (cmd, gpus), ends in zip(wanted, meant)]
    ids = [card.job_id for card in submit(specs, profile, verbose=verbose, ignored=ignored)]
    if wait:
        from .queue import display_slurm_queue

        display_slurm_queue(name, timestep=refresh_s, job_ids=ids)
    return ids

