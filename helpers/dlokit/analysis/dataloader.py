"""dataloader_trials: the DataLoader settings tried and what each cost, fastest loading first."""
from __future__ import annotations

import pandas as pd

from dlokit.analysis.run import load_runs
from dlokit.analysis.table import runs_table

TRIAL_COLUMNS = ("run_id", "state", "workers", "pin_memory", "non_blocking", "prefetch_factor",
                 "persistent_workers", "t_data", "first_step_load_s", "throughput_train",
                 "host_rss_peak_mb", "overlapped_by")


def dataloader_trials(runs, runs_dir=None) -> pd.DataFrame:
    """One row per run, sorted by mean load time per step (t_data); runs without timings last."""
    table = runs_table(load_runs(runs, runs_dir))
    trials = table[list(TRIAL_COLUMNS)].rename(columns={"t_data": "load_s_per_step"})
    return trials.sort_values("load_s_per_step", na_position="last", kind="stable").reset_index(drop=True)
