"""runs_table: one tidy row per run, the common input of every comparison.

What is measured every step (throughputs, the phases' times) is the median of the run's settled steps, the value
compare_runs, the verdicts and the checks show (dlokit.analysis.stats); a run without step lines keeps its
summary's figure."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dlokit.analysis import stats
from dlokit.analysis.run import Run, load_runs

CONFIG_ALIASES = {
    "name": ("name", "tag", "job_name"),
    "model": ("model", "arch"),
    "batch_size": ("batch_size", "per_gpu_batch_size", "local_batch_size"),
    "amp": ("amp", "amp_dtype", "precision", "dtype"),
    "channels_last": ("channels_last",),
    "workers": ("num_workers", "workers"),
    "pin_memory": ("pin_memory",),
    "non_blocking": ("non_blocking",),
    "prefetch_factor": ("prefetch_factor",),
    "persistent_workers": ("persistent_workers",),
    "drop_last": ("drop_last",),
    "image_size": ("image_size",),
    "compile": ("compile",),
}
SPLITS = ("t_data", "t_h2d", "t_forward", "t_backward", "t_optimizer", "t_metrics", "t_step")
COLUMNS = ("run_id", "name", "state", "script", "model", "batch_size", "global_batch_size", "amp",
           "channels_last", "workers", "pin_memory", "non_blocking", "prefetch_factor",
           "persistent_workers", "world_size", "steps", "throughput_train", "throughput_compute",
           *SPLITS, "first_step_load_s", "gpu_mem_peak_mb", "host_rss_peak_mb", "energy_j",
           "peak_power_w", "val_acc", "best_val_acc", "wall_time_s", "oom", "truncated", "error", "overlapped_by",
           "foreign_cpu", "problems")


def config_value(run: Run, key: str, default=None):
    """A config option under any of its usual names (see CONFIG_ALIASES), else from run.json."""
    for name in CONFIG_ALIASES.get(key, (key,)):
        if run.config.get(name) is not None:
            return run.config[name]
        if run.info.get(name) is not None:
            return run.info[name]
    return default


def as_number(value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def run_metric(run: Run, key: str):
    """A step figure: the median of the run's settled steps (stats.step_values: the warm-up read from the step
    times), as every comparison reads it; else rank 0's summary."""
    settled = stats.step_values(run, key)
    return float(np.median(settled)) if len(settled) else as_number(run.summary.get(key))


def _peak(run: Run, key: str, step_key: str | None = None):
    values = [as_number(s.get(key)) for s in run.summaries]
    values = [v for v in values if v is not None]
    if not values and step_key:
        metrics = run.metrics
        if step_key in metrics:
            values = pd.to_numeric(metrics[step_key], errors="coerce").dropna().tolist()
    return max(values) if values else None


def _energy(run: Run):
    """NVML's counter is a whole GPU's: ranks naming the same gpu_uuid count once (largest reading);
    readings without a uuid (older records) add up per rank."""
    per_gpu, total, found = {}, 0.0, False
    for summary in run.summaries:
        value = as_number(summary.get("energy_j"))
        if value is None:
            continue
        found, uuid = True, summary.get("gpu_uuid")
        if isinstance(uuid, str) and uuid:
            per_gpu[uuid] = max(per_gpu.get(uuid, 0.0), value)
        else:
            total += value
    return total + sum(per_gpu.values()) if found else None


def _val_acc(run: Run, key: str):
    value = as_number(run.summary.get(key))
    if value is not None:
        return value
    vals = run.lines("val")
    if "val_acc" not in vals or vals.empty:
        return None
    series = pd.to_numeric(vals["val_acc"], errors="coerce").dropna()
    if series.empty:
        return None
    return float(series.max() if key == "best_val_acc" else series.iloc[-1])


def run_row(run: Run) -> dict:
    steps = run.steps
    batch = config_value(run, "batch_size")
    global_batch = config_value(run, "global_batch_size")
    if global_batch is None and "batch_size" in steps and not steps.empty:
        global_batch = steps["batch_size"].iloc[-1]
    if global_batch is None and batch is not None:
        global_batch = batch * run.world_size
    row = {
        "run_id": run.run_id, "state": run.state, "script": run.info.get("script"),
        "world_size": run.world_size, "global_batch_size": global_batch,
        "steps": run.summary.get("steps", len(steps)),
        **{k: config_value(run, k) for k in ("name", "model", "batch_size", "amp", "channels_last",
                                             "workers", "pin_memory", "non_blocking",
                                             "prefetch_factor", "persistent_workers")},
        **{k: run_metric(run, k) for k in ("throughput_train", "throughput_compute", *SPLITS)},
        "first_step_load_s": as_number(run.summary.get("first_step_load_s")),
        "gpu_mem_peak_mb": _peak(run, "gpu_mem_peak_mb", "gpu_mem_mb"),
        "host_rss_peak_mb": _peak(run, "host_rss_peak_mb"),
        "energy_j": _energy(run), "peak_power_w": _peak(run, "peak_power_w"),
        "val_acc": _val_acc(run, "val_acc"), "best_val_acc": _val_acc(run, "best_val_acc"),
        "wall_time_s": as_number(run.summary.get("wall_time_s")),
        "oom": run.oom, "truncated": run.truncated, "error": run.error,
        # what the reader skipped or dropped (an unreadable file is in `state` already)
        "problems": "; ".join(p for p in run.problems if p != run.unreadable),
    }
    return row


def runs_table(runs=None, runs_dir=None) -> pd.DataFrame:
    """One row per run (ids, paths or Run objects; default: every run under runs_dir).

    A run whose record cannot be read is a row too: `state` says "unreadable: rank<k>/<file>: <why>",
    `problems` lists lines skipped and fields dropped by the reader (empty when none).

    `overlapped_by` lists the runs that ran at the same time on the same devices (see overlap.py):
    such a row's speed is not a valid measurement. `foreign_cpu` is the share of its cores that work outside
    the course kept busy (see overlap.foreign_cpu_share); above overlap.BUSY_SHARE, neither is it."""
    from dlokit.analysis.overlap import foreign_cpu_share, overlapping

    runs = load_runs(runs, runs_dir)
    overlaps = overlapping(runs)
    rows = [{**run_row(r), "overlapped_by": ", ".join(overlaps.get(r.run_id, [])), "foreign_cpu": foreign_cpu_share(r)}
            for r in runs]
    return pd.DataFrame(rows, columns=list(COLUMNS))
