"""A race job's segments read back: the run records <runs>/J, <runs>/J.r1, <runs>/J.r2... that a job J which
checkpointed and requeued itself wrote (dlokit.race.requeue), as one history: its validation lines, best and
final top-1, GPU-hours and energy, and what happened between the segments."""
from __future__ import annotations

import glob
import re
from dataclasses import dataclass

from ..in_job.energy import Usage, jobs_usage
from .run import Run, load_run

SEGMENT = re.compile(r"(?P<base>.+)\.r(?P<k>\d+)")


def segment_id(base: str, segment: int) -> str:
    return base if segment == 0 else f"{base}.r{segment}"


def base_id(run_id: str) -> str:
    """The job's run id of any of its segments ('1234.r2' -> '1234')."""
    match = SEGMENT.fullmatch(str(run_id))
    return match["base"] if match else str(run_id)


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
    first = load_run(base_id(str(job_id)), runs_dir)  # followed to its card's folder: `<id>@<cluster>` on Slurm
    if first.owner is None:
        return RaceHistory(first.run_id, [first] if first.ranks else [])
    base, root = first.path.name, first.path.parent
    later = sorted((int(m["k"]), p.name) for p in root.glob(f"{glob.escape(base)}.r*")
                   if (m := SEGMENT.fullmatch(p.name)) and m["base"] == base)
    # a segment is the job's only in a folder of the job's owner: anyone can make `<id>.r1` in a shared runs folder
    segments = [load_run(name, root, owner=first.owner) for _, name in later]
    return RaceHistory(base, [first] + [run for run in segments if run.owner == first.owner])
