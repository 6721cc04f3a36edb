"""Did a measurement have its devices to itself? Overlaps between runs, from their own records.

Every run record carries when it ran (`measurement.started_unix`, `ended_unix`), on which host,
cores and GPUs (see dlokit.runrecord.measurement_context). Two runs overlap when they ran at the
same time on the same host and shared a core or a GPU (unknown cores or GPUs count as shared).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dlokit.analysis.run import Run, load_runs


@dataclass(frozen=True)
class Interval:
    run_id: str
    host: str | None
    start: float
    end: float
    cpus: frozenset | None
    gpus: frozenset | None

    def shares_devices(self, other: "Interval") -> bool:
        if self.host and other.host and self.host != other.host:
            return False
        if self.gpus and other.gpus:
            return bool(self.gpus & other.gpus)
        if self.cpus is None or other.cpus is None:
            return True
        return bool(self.cpus & other.cpus)

    def overlaps(self, other: "Interval") -> bool:
        return self.start < other.end and other.start < self.end and self.shares_devices(other)


def _gpu_set(value) -> frozenset | None:
    text = str(value or "").strip()
    return frozenset(v.strip() for v in text.split(",") if v.strip()) or None


def interval(run: Run) -> Interval | None:
    """When and where the run measured, over all its ranks; None for records without the evidence."""
    starts, ends, cpus, gpus, host = [], [], set(), set(), None
    for record in run.ranks.values():
        context = (record["run"] or {}).get("measurement") or {}
        if not isinstance(context, dict) or context.get("started_unix") is None:
            continue
        starts.append(float(context["started_unix"]))
        summary = record["summary"] or {}
        last = max((float(m.get("time", 0)) for m in record["metrics"] if isinstance(m.get("time"), (int, float))),
                   default=0.0)
        ends.append(float(summary.get("ended_unix") or starts[-1] + last))
        host = host or context.get("host")
        cpus.update(context.get("cpus") or [])
        gpus.update(_gpu_set(context.get("gpus_visible")) or [])
    if not starts:
        return None
    return Interval(run.run_id, host, min(starts), max(ends), frozenset(cpus) or None, frozenset(gpus) or None)


def overlapping(runs, runs_dir=None, among=None) -> dict[str, list[str]]:
    """For each run, the other runs (of its runs folder, or `among`) that overlapped its measurement."""
    runs = load_runs(runs, runs_dir)
    if among is None:
        folders = {Path(r.path).parent for r in runs}
        among = [other for folder in folders for other in load_runs(None, folder)]
    others = [i for i in (interval(r) for r in load_runs(among, runs_dir)) if i is not None]
    found = {}
    for run in runs:
        mine = interval(run)
        found[run.run_id] = sorted({o.run_id for o in others if mine and o.run_id != run.run_id and mine.overlaps(o)})
    return found


def overlap_notes(overlaps: dict[str, list[str]]) -> list[str]:
    """Sentences for a plot or a table: which runs are not valid measurements, and why."""
    return [f"⚠ run {run_id} overlapped run(s) {', '.join(others)} on the same devices: "
            "its speed is not its own, compare it with care or run it again"
            for run_id, others in overlaps.items() if others]
