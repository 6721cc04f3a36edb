"""Race runs that survive the cluster: a job checkpoints when its time is nearly up, requeues itself, resumes.

Slurm sends SIGUSR2 `--signal` seconds before the time limit (the local backend's submitit controller does
the same), to the job's tasks and to the training script. The script (--checkpoint-on-signal) saves a
checkpoint at its next step boundary and exits with code 75. RequeueingTask, the kit's task for a race job,
forwards the signal to the script in case it did not get it, sees the 75, and requeues the job: `scontrol
requeue` on Slurm (the job keeps its id and its log, opened in append mode), submitit's requeue exit code on
the local backend (its controller starts the tasks again). The next start is the job's next *segment*: it
runs the same command plus `--resume <the newest checkpoint of the earlier segments>`, so a run preempted
or killed without warning (a node failure, SIGTERM) loses at most one checkpoint interval.

Segment k of job J writes its run record under <runs>/J (k = 0), then <runs>/J.r1, <runs>/J.r2... :
nothing of an earlier segment is overwritten. `history(J)` (dlokit.analysis.race_history) reads them back in order.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import submitit
from submitit.core.utils import FailedJobError
from submitit.local.local import LOCAL_REQUEUE_RETURN_CODE  # its controller then starts the tasks again

from ..in_job import jobenv, runrecord, untrusted
from ..analysis.race_history import history, segment_id
from ..in_job.task import ScriptTask, children_of



def option_value(argv: list[str], option: str) -> str | None:
    """The value an option has in argv: its last occurrence, as argparse reads it."""
    value = None
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(option + "="):
            value = arg.split("=", 1)[1]
    return value


def with_option(argv: list[str], option: str, value: str) -> list[str]:
    """argv with `option value` replacing any earlier value of it."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            kept.append(arg)
    return [*kept, option, str(value)]


def newest_checkpoint(runs: Path, base: str, segment: int, argv: list[str]) -> str | None:
    """Where the next segment resumes from: the script's --checkpoint-path, or the newest segment's checkpoint."""
    explicit = option_value(argv, "--checkpoint-path")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    for earlier in range(segment - 1, -1, -1):
        path = runs / segment_id(base, earlier) / "checkpoint.pt"
        if path.is_file():
            return str(path)
    return None


class RequeueingTask(ScriptTask):
    """The task of a race job (dlokit.submission.submit.submit(..., task_class=RequeueingTask)): runs this segment of the
    training, and requeues the job when the script checkpointed on a signal."""

    def __call__(self) -> str:
        job = submitit.JobEnvironment()
        on_slurm = job.cluster == "slurm"  # never the Slurm variables a notebook's own job may leak to a local job
        note = Path(job.paths.folder) / f"{job.job_id}_segment.json"
        segment = max(_read_segment(note), int(os.environ.get("SLURM_RESTART_COUNT") or 0) if on_slurm else 0)
        base = self.env.get(jobenv.RUN_ID) or (jobenv.slurm_run_id(os.environ) if on_slurm else job.job_id)
        runs = Path(self.env.get(jobenv.RUNS_DIR) or jobenv.runs_dir())
        if segment and _completed(runs / segment_id(base, segment - 1)):
            return "already completed"  # the signal came after the last step: nothing left to do
        argv = list(self.argv)
        resume = newest_checkpoint(runs, base, segment, argv) if segment else None
        if resume:
            argv = with_option(argv, "--resume", resume)
        task = ScriptTask(argv, self.python, self.cwd, {**self.env, jobenv.RUN_ID: segment_id(base, segment)})
        previous = {signum: signal.signal(signum, _forward_to_script) for signum in (signal.SIGUSR1, signal.SIGUSR2)}
        try:
            return task()
        except FailedJobError as error:
            if getattr(error.__cause__, "returncode", None) != jobenv.EXIT_REQUEUE:
                raise
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if job.global_rank == 0:
                _write_history(Path(job.paths.folder) / f"{job.job_id}_history.json", base, runs)
        print(f"{time.strftime('%H:%M:%S')} segment {segment} checkpointed: requeueing job {job.job_id}", flush=True)
        if job.global_rank == 0:
            _write_segment(note, segment + 1)
            if on_slurm:
                subprocess.run(["scontrol", "requeue", job.job_id], check=True, timeout=60)
        raise SystemExit(0 if on_slurm else LOCAL_REQUEUE_RETURN_CODE)


def _forward_to_script(signum, _frame) -> None:
    """The time is nearly up: tell the script (it may not have got Slurm's signal; locally it never does)."""
    for pid in children_of(os.getpid()):
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass


def _read_segment(path: Path) -> int:
    try:
        return int(untrusted.read_json(path)["segment"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _write_segment(path: Path, segment: int) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"segment": segment, "at": time.time()}))
    os.replace(tmp, path)


def _write_history(path: Path, base: str, runs: Path) -> None:
    """What the job's segments did so far, one line each, beside the job: dlokit.job_outcome adds them to the
    job's cause (a job that ran in one go writes nothing)."""
    found = history(base, runs)
    lines = found.events()
    if len(found.segments) >= 2 or any("requeued" in line for line in lines):
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"lines": lines}))
        os.replace(tmp, path)


def _completed(folder: Path) -> bool:
    try:
        summary, _ = runrecord.read_json_object(folder / "rank0" / "summary.json")
    except runrecord.Unreadable:
        return False
    return bool(summary) and summary.get("status") == "completed"
