"""Did a measurement have its devices to itself? Overlaps between runs, from their own records.

Every run record carries when it ran (`measurement.started_unix`, `ended_unix`), on which host,
cores and GPUs (see dlokit.in_job.runrecord.measurement_context). Two runs overlap when they ran at the
same time on the same host and shared a core or a GPU (unknown cores or GPUs count as shared), or when
either was a job that shares the machine (`measurement.alone` false: it measured accuracy, not speed, beside
other such jobs): the speed of such a run is never a measurement.

Work that is not a course run (another user's program, a test suite beside the notebook) leaves no record,
but it takes time from the run's cores: foreign_cpu_share compares the cores' busy time over the run
(`cores_busy_s`, from /proc/stat) with the ranks' own CPU time (`own_cpu_s`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dlokit.analysis.run import Run, load_run, load_runs


@dataclass(frozen=True)
class Interval:
    run_id: str
    host: str | None
    start: float
    end: float
    cpus: frozenset | None
    gpus: frozenset | None
    shared: bool = False  # a job that shared the machine on purpose (alone=False)

    def shares_devices(self, other: "Interval") -> bool:
        if self.host and other.host and self.host != other.host:
            return False
        if self.shared or other.shared:
            return True
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
    starts, ends, cpus, gpus, host, shared = [], [], set(), set(), None, False
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
        shared = shared or context.get("alone") is False
        cpus.update(context.get("cpus") or [])
        gpus.update(_gpu_set(context.get("gpus_visible")) or [])
    if not starts:
        return None
    return Interval(run.run_id, host, min(starts), max(ends), frozenset(cpus) or None, frozenset(gpus) or None, shared)


def _ended(run: Run) -> bool:
    return all((record["summary"] or {}).get("ended_unix") is not None for record in run.ranks.values())


def overlapping(runs, runs_dir=None, among=None) -> dict[str, list[str]]:
    """For each run, the other runs (of its runs folder, or `among`) that overlapped its measurement."""
    runs = load_runs(runs, runs_dir)
    if among is None:  # every run of the folder, anyone's: their summaries, and metrics only where no end is said
        folders = {Path(r.path).parent for r in runs}
        among = [other for folder in folders for other in load_runs(None, folder, metrics=False)]
        among = [run if _ended(run) else load_run(run.path) for run in among]
    others = [i for i in (interval(r) for r in load_runs(among, runs_dir)) if i is not None]
    found = {}
    for run in runs:
        mine = interval(run)
        found[run.run_id] = sorted({o.run_id for o in others if mine and o.run_id != run.run_id and mine.overlaps(o)})
    return found


BUSY_SHARE = 0.25  # measured here: 0.05–0.07 for a run alone, 0.4–0.5 beside two busy processes on 2 cores


def foreign_cpu_share(run: Run) -> float | None:
    """The fraction of the run's cores that other work kept busy while it ran: (cores' busy time − the ranks'
    own CPU time) / (window × cores), the worst over the groups of ranks that shared a host and a core set
    (ranks pinned each to its core are their own groups). None for records without the evidence."""
    groups: dict[tuple, list[dict]] = {}
    for record in run.ranks.values():
        context = (record["run"] or {}).get("measurement") or {}
        summary = record["summary"] or {}
        if not isinstance(context, dict) or not context.get("cpus") or any(
                summary.get(k) is None for k in ("cpu_window_s", "cores_busy_s", "own_cpu_s")):
            continue
        groups.setdefault((context.get("host"), frozenset(context["cpus"])), []).append(summary)
    shares = []
    for (_, cores), summaries in groups.items():
        window = max(float(s["cpu_window_s"]) for s in summaries)
        foreign = max(float(s["cores_busy_s"]) for s in summaries) - sum(float(s["own_cpu_s"]) for s in summaries)
        shares.append(max(0.0, foreign) / (window * len(cores)))
    return round(max(shares), 3) if shares else None


def overlap_notes(overlaps: dict[str, list[str]]) -> list[str]:
    """Sentences for a plot or a table: which runs are not valid measurements, and why."""
    return [f"⚠ run {run_id} overlapped run(s) {', '.join(others)} on the same devices: "
            "its speed is not its own, compare it with care or run it again"
            for run_id, others in overlaps.items() if others]


def busy(share) -> bool:
    """Other work kept more than BUSY_SHARE of the run's cores busy (False when unknown)."""
    try:
        return float(share) > BUSY_SHARE  # NaN and None compare False
    except (TypeError, ValueError):
        return False


def foreign_notes(shares: dict[str, float]) -> list[str]:
    """Sentences for the runs whose cores other work kept busy (see busy)."""
    return [f"⚠ other work kept {100 * float(share):.0f} % of run {run_id}'s cores busy while it ran: its speed is "
            "not its own, run it again on an idle machine" for run_id, share in shares.items() if busy(share)]
