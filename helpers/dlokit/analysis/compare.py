"""compare_runs: one metric across runs, as a table and bars, with ratios to a baseline run."""
from __future__ import annotations

from typing import NamedTuple

import pandas as pd
from matplotlib.figure import Figure

from dlokit.analysis.figures import add_notes, figure_png_base64, message_figure, new_figure
from dlokit.analysis.overlap import busy, foreign_notes, overlap_notes
from dlokit.analysis.run import load_runs
from dlokit.analysis.table import runs_table

METRICS = ("throughput_train", "throughput_compute", "t_step", "t_data", "t_forward", "t_backward",
           "t_optimizer", "gpu_mem_peak_mb", "host_rss_peak_mb", "energy_j", "val_acc",
           "best_val_acc", "wall_time_s", "first_step_load_s")


class Comparison(NamedTuple):
    """(table, figure); shows both in a notebook."""

    table: pd.DataFrame
    figure: Figure

    def _repr_mimebundle_(self, include=None, exclude=None):
        png = figure_png_base64(self.figure)  # also as image/png, so that saved notebooks keep the chart
        table = self.table.to_html(index=False, float_format=lambda v: f"{v:.4g}")
        return {"text/html": table + f'<img src="data:image/png;base64,{png}"/>', "image/png": png,
                "text/plain": self.table.to_string(index=False)}


def _baseline_index(table: pd.DataFrame, metric: str, baseline) -> int | None:
    usable = table[table[metric].notna()]
    if usable.empty:
        return None
    if baseline is None:
        return usable.index[0]
    if isinstance(baseline, int) and not isinstance(baseline, bool) and baseline in table.index \
            and str(baseline) not in set(table["run_id"]):
        return baseline
    matches = table.index[table["run_id"] == str(getattr(baseline, "run_id", baseline))]
    if len(matches) == 0:
        raise ValueError(f"baseline {baseline!r} is not one of the compared runs: {list(table['run_id'])}")
    return matches[0]


def _short(text: str, width: int = 24) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def compare_runs(runs, metric: str = "throughput_train", baseline=None, runs_dir=None) -> Comparison:
    """Compare `metric` (a runs_table column) across runs; ratio = value / baseline's value."""
    table = runs_table(load_runs(runs, runs_dir))
    if metric not in table:
        raise ValueError(f"unknown metric {metric!r}; choose one of {list(METRICS)}")
    table[metric] = pd.to_numeric(table[metric], errors="coerce")
    base = _baseline_index(table, metric, baseline)
    table["ratio"] = table[metric] / table.loc[base, metric] if base is not None else float("nan")
    table = table[["run_id", "name", "state", metric, "ratio", "overlapped_by", "foreign_cpu"]]
    plotted = table[table[metric].notna()]
    notes = [f"run {r.run_id}: {r.state}, no {metric}" for r in table[table[metric].isna()].itertuples()]
    notes += overlap_notes({r.run_id: r.overlapped_by.split(", ") for r in table.itertuples() if r.overlapped_by})
    notes += foreign_notes(dict(zip(table["run_id"], table["foreign_cpu"])))
    if plotted.empty:
        return Comparison(table, message_figure(notes or ["no runs to compare"], title=metric))
    figure, axes = new_figure(size=(max(5, 1.1 * len(plotted) + 2), 4))
    ax = axes[0, 0]
    labels = ["\n".join([str(r.run_id)] + [_short(v) for v in (r.name, r.state) if isinstance(v, str) and v != "completed"])
              for r in plotted.itertuples()]
    colors = ["tab:blue" if i != base else "tab:gray" for i in plotted.index]
    bars = ax.bar(labels, plotted[metric], color=colors,
                  hatch=["//" if r.overlapped_by or busy(r.foreign_cpu) else "" for r in plotted.itertuples()])
    ax.bar_label(bars, labels=[f"×{v:.2f}" for v in plotted["ratio"]], fontsize=8)
    ax.set(ylabel=metric, title=f"{metric} (ratio to run {table.loc[base, 'run_id']})")
    ax.tick_params(axis="x", labelsize=8)
    add_notes(figure, notes)
    return Comparison(table, figure)
