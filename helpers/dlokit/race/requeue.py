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
nothing of an earlier segment is overwritten. `history(J)` reads them back in order.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import submitit
from submitit.core.utils import FailedJobError
from submitit.local.local import LOCAL_REQUEUE_RETURN_CODE  # its controller then starts the tasks again

from .. import jobenv
from ..analysis.run import Run, load_run
from ..energy import Usage, jobs_usage
from ..submit import ScriptTask, _children

REQUEUE_EXIT_CODE = 75  # tp_scripts/instrument.py: checkpointed on a signal, run me again with --resume
SEGMENT = re.compile(r"(?P<base>.+)\.r(?P<k>\d+)")


def segment_id(base: str, segment: int) -> str:
    return base if segment == 0 else f"{base}.r{segment}"


def base_id(run_id: str) -> str:
    """The job's run id of any of its segments ('1234.r2' -> '1234')."""
    match = SEGMENT.fullmatch(str(run_id))
    return match["base"] if match else str(run_id)


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
    """The task of a race job (dlokit.submit.submit(..., task_class=RequeueingTask)): runs this segment of the
    training, and requeues the job when the script checkpointed on a signal."""

    def __call__(self) -> str:
        job = submitit.JobEnvironment()
        on_slurm = job.cluster == "slurm"  # never the Slurm variables a notebook's own job may leak to a local job
        note = Path(job.paths.folder) / f"{job.job_id}_segment.json"
        segment = max(_read_segment(note), int(os.environ.get("SLURM_RESTART_COUNT") or 0) if on_slurm else 0)
        base = self.env.get(jobenv.RUN_ID) or job.job_id
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
            if getattr(error.__cause__, "returncode", None) != REQUEUE_EXIT_CODE:
                raise
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        print(f"{time.strftime('%H:%M:%S')} segment {segment} checkpointed: requeueing job {job.job_id}", flush=True)
        if job.global_rank == 0:
            _write_segment(note, segment + 1)
            if on_slurm:
                subprocess.run(["scontrol", "requeue", job.job_id], check=True, timeout=60)
        raise SystemExit(0 if on_slurm else LOCAL_REQUEUE_RETURN_CODE)


def _forward_to_script(signum, _frame) -> None:
    """The time is nearly up: tell the script (it may not have got Slurm's signal; locally it never does)."""
    for pid in _children(os.getpid()):
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass


def _read_segment(path: Path) -> int:
    try:
        return int(json.loads(path.read_text())["segment"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _write_segment(path: Path, segment: int) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"segment": segment, "at": time.time()}))
    os.replace(tmp, path)


def _completed(folder: Path) -> bool:
    try:
        return json.loads((folder / "rank0" / "summary.json").read_text()).get("status") == "completed"
    except (OSError, ValueError, AttributeError):
        return False


# ---- reading a requeued run back ---------------------------------------------------------------------

@dataclass
class RaceHistory:
    """Every segment of one race job, oldest first, and what happened between them."""

    job_id: str
    segments: list[Run]

    @property
    def val(self):
        """The per-epoch validation lines across the segments (epoch, step, val_acc, val_acc5, val_loss, run_id).
        An epoch validated twice (a segment killed without warning, redone from an older checkpoint) keeps the
        later line: the one on the path the run went on with."""
        import pandas as pd

        rows = [{"run_id": run.run_id, **m} for run in self.segments for m in run.rank0["metrics"]
                if m.get("kind") == "val"]
        table = pd.DataFrame(rows, columns=["run_id", "epoch", "step", "val_loss", "val_acc", "val_acc5"])
        if table.empty:
            return table[["epoch", "step", "val_acc", "val_acc5", "val_loss", "run_id"]]
        table = table.drop_duplicates("epoch", keep="last").sort_values("epoch").reset_index(drop=True)
        return table[["epoch", "step", "val_acc", "val_acc5", "val_loss", "run_id"]]

    @property
    def best_top1(self) -> float | None:
        val = self.val
        return None if val.empty else float(val["val_acc"].max())

    @property
    def final_top1(self) -> float | None:
        val = self.val
        return None if val.empty else float(val["val_acc"].iloc[-1])

    @property
    def state(self) -> str:
        return self.segments[-1].state if self.segments else "missing"

    @property
    def usage(self) -> Usage:
        return jobs_usage(self.segments)

    def events(self) -> list[str]:
        """One line per segment: how it started and how it ended."""
        lines = []
        for k, run in enumerate(self.segments):
            metrics = run.rank0["metrics"]
            resumed = next((m for m in metrics if m.get("event") == "resumed"), None)
            start = f"resumed from step {resumed.get('step')}" if resumed else ("started" if k == 0 else
                                                                                 "started again from step 0")
            summary = run.summary
            status = summary.get("status") or run.state
            if status == "checkpointed":
                end = (f"checkpointed on {summary.get('signal')} at step {summary.get('steps')} "
                       f"(epoch {int(summary.get('epochs') or 0) + 1}), requeued")
            elif status == "cancelled":
                end = f"cancelled ({summary.get('signal') or summary.get('error')}) at step {summary.get('steps')}"
            elif summary:
                end = f"{status} at step {summary.get('steps')}"
            else:
                end = run.state
            lines.append(f"segment {k} (run {run.run_id}): {start}; {end}")
        return lines

    def describe(self) -> str:
        usage = self.usage
        best = "n/a" if self.best_top1 is None else f"{self.best_top1:.3f}"
        head = (f"race job {self.job_id}: {len(self.segments)} segment(s), {len(self.val)} epoch(s) validated, "
                f"best top-1 {best}, {usage.gpu_hours or 0:.3g} GPU-hours, energy {usage.energy_text}")
        return "\n".join([head, *[f"  {line}" for line in self.events()]])

    def __repr__(self) -> str:
        return self.describe()


def history(job_id: str, runs_dir=None) -> RaceHistory:
    """The segments of a race job (by its job id, or the run id of any segment), oldest first."""
    from ..analysis.run import runs_folder

    base = base_id(str(job_id))
    root = runs_folder(runs_dir)
    later = sorted((int(m["k"]), p.name) for p in root.glob(f"{base}.r*")
                   if (m := SEGMENT.fullmatch(p.name)) and m["base"] == base)
    names = ([base] if (root / base).is_dir() else []) + [name for _, name in later]
    return RaceHistory(base, [load_run(name, root) for name in names])


def requeue_note(card) -> str:
    """For dlokit.job_outcome: what happened to a race job's segments ('' when it ran in one go)."""
    found = history(card.job_id, card.runs_dir)
    if len(found.segments) < 2 and not any("requeued" in line for line in found.events()):
        return ""
    return "\n".join(found.events())
