"""The memory of a local job as a whole: its scripts and every process they start (DataLoader workers, a
script's own children), as Slurm's cgroup counts it.

Each script runs under an RLIMIT_DATA of its share of the job's limit (see dlokit.in_job.task.ScriptTask), but that limit is
per process: three children of 800 MiB each pass a 1 GiB limit. The launcher therefore also watches the sum of
the scripts' trees' proportional set size (PSS: a page shared by forked workers counted once in all) and ends
the job OUT_OF_MEMORY when it goes past the limit by more than SLACK (the slack leaves a single process to its
RLIMIT_DATA, which stops it first with a MemoryError that names the line).
"""
from __future__ import annotations

import psutil

from dlokit.in_job import warm_start

SLACK = 1.10


def scripts_of(controller: int) -> list[psutil.Process]:
    """The scripts the job's tasks run, and all their descendants (not the kit's own controller and tasks). A script
    forked warm (dlokit.in_job.warm_start) stands in the place of its client."""
    try:
        tasks = psutil.Process(controller).children()
    except psutil.Error:
        return []
    return [p for task in tasks for p in warm_start.descendants(task)]


def _total(processes: list[psutil.Process], measure) -> float:
    total = 0
    for process in processes:
        try:
            total += measure(process)
        except psutil.Error:
            continue
    return total / 2**20


def over_limit(controller: int, limit_mb: int) -> dict | None:
    """What to record when the job's processes together hold more than its limit (None while they do not).

    The resident sizes (RSS) are read first: cheap, and never below the PSS, so a job under its limit by RSS is
    under it. Only above it is the PSS read (/proc/<pid>/smaps_rollup: ~20 ms a process with torch loaded, too
    slow to read twice a second beside a measurement)."""
    if not limit_mb:
        return None
    processes = scripts_of(controller)
    if _total(processes, lambda p: p.memory_info().rss) <= limit_mb * SLACK:
        return None
    used_mb = _total(processes, lambda p: p.memory_full_info().pss)
    if used_mb <= limit_mb * SLACK:
        return None
    return {"peak_mb": round(used_mb, 1), "limit_mb": limit_mb, "processes": len(processes)}
