"""scaling_plot: speed-up and efficiency of data parallelism against the number of GPUs."""
from __future__ import annotations

import pandas as pd

from dlokit.analysis.figures import add_notes, message_figure, new_figure
from dlokit.analysis.run import load_runs
from dlokit.analysis.table import runs_table


def scaling_table(runs, runs_dir=None, metric: str = "throughput_train") -> pd.DataFrame:
    """Best throughput per world size; speed-up and efficiency relative to the smallest world size."""
    table = runs_table(load_runs(runs, runs_dir))
    table[metric] = pd.to_numeric(table[metric], errors="coerce")
    usable = table.dropna(subset=[metric])
    if usable.empty:
        return pd.DataFrame(columns=["world_size", "run_id", metric, "speedup", "ideal", "efficiency"])
    best = usable.loc[usable.groupby("world_size")[metric].idxmax()].sort_values("world_size")
    base = best.iloc[0]
    out = best[["world_size", "run_id", metric]].reset_index(drop=True)
    out["speedup"] = out[metric] / base[metric]
    out["ideal"] = out["world_size"] / base["world_size"]
    out["efficiency"] = out["speedup"] / out["ideal"]
    return out


def scaling_plot(runs, runs_dir=None, metric: str = "throughput_train"):
    """Speed-up vs world size with the ideal line (left) and parallel efficiency (right)."""
    runs = load_runs(runs, runs_dir)
    scaling = scaling_table(runs, metric=metric)
    table = runs_table(runs)
    notes = [f"run {r.run_id}: {r.state}, no {metric}" for r in table.itertuples()
             if pd.isna(getattr(r, metric))]
    if scaling.empty:
        return message_figure(notes or ["no runs"], title="scaling")
    figure, axes = new_figure(1, 2, size=(10, 4))
    left, right = axes[0]
    left.plot(scaling["world_size"], scaling["ideal"], "--", color="tab:gray", label="ideal")
    left.plot(scaling["world_size"], scaling["speedup"], "o-", color="tab:blue", label="measured")
    left.set(xlabel="GPUs (world size)", ylabel="speed-up", title=f"speed-up ({metric})")
    left.legend(fontsize=8)
    right.plot(scaling["world_size"], 100 * scaling["efficiency"], "o-", color="tab:green")
    right.axhline(100, ls="--", color="tab:gray")
    right.set(xlabel="GPUs (world size)", ylabel="%", title="efficiency",
              ylim=(0, max(110, 105 * scaling["efficiency"].max())))
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(scaling["world_size"], [str(w) for w in scaling["world_size"]])
    add_notes(figure, notes)
    return figure
