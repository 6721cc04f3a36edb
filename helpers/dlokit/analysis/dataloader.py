"""dataloader_trials: the DataLoader settings tried and what each cost, fastest loading first."""
from __future__ import annotations

import pandas as pd

from dlokit.analysis import stats
from dlokit.analysis.figures import new_figure
from dlokit.analysis.run import load_runs
from dlokit.analysis.table import runs_table

TRIAL_COLUMNS = ("run_id", "state", "workers", "pin_memory", "non_blocking", "prefetch_factor",
                 "persistent_workers", "t_data", "first_step_load_s", "throughput_train",
                 "host_rss_peak_mb", "overlapped_by")


def dataloader_trials(runs, runs_dir=None) -> pd.DataFrame:
    """One row per run, sorted by load time per step (t_data: the median of its settled steps, with its 95 %
    interval, load_low / load_high); runs without timings last."""
    loaded = load_runs(runs, runs_dir)
    table = runs_table(loaded)
    waits = {run.run_id: stats.estimate(run, "t_data") for run in loaded}
    table["t_data"] = [waits[r].value if waits[r].runs else t for r, t in zip(table["run_id"], table["t_data"])]
    table["load_low"] = [waits[r].low for r in table["run_id"]]
    table["load_high"] = [waits[r].high for r in table["run_id"]]
    columns = list(TRIAL_COLUMNS)
    columns.insert(columns.index("t_data") + 1, "load_low")
    columns.insert(columns.index("load_low") + 1, "load_high")
    trials = table[columns].rename(columns={"t_data": "load_s_per_step"})
    trials.attrs["basis"] = ("load_s_per_step: seconds each step waited for its batch, the median of the run's settled "
                             "steps; load_low–load_high: its 95 % interval over those steps")
    return trials.sort_values("load_s_per_step", na_position="last", kind="stable").reset_index(drop=True)


def dataloader_plot(trials: pd.DataFrame):
    """dataloader_trials' load time per step, a bar per trial with its 95 % interval."""
    figure, axes = new_figure(size=(7, 3))
    ax = axes[0, 0]
    labels = [f"{r.run_id}\nw{r.workers} pin {bool(r.pin_memory)}\npf {r.prefetch_factor} pers {bool(r.persistent_workers)}"
              for r in trials.itertuples()]
    spread = [1000 * (trials["load_s_per_step"] - trials["load_low"]).clip(lower=0).fillna(0),
              1000 * (trials["load_high"] - trials["load_s_per_step"]).clip(lower=0).fillna(0)]
    ax.barh(labels, 1000 * trials["load_s_per_step"].fillna(0), xerr=spread, capsize=3, color="tab:purple")
    ax.set(xlabel="load time per step (ms, median and 95 % interval), lower is better", title="DataLoader trials")
    ax.invert_yaxis()
    return figure
