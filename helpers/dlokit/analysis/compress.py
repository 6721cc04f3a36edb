"""Compression runs (tp_scripts/llm/compress_bench.py): what each method saves and what it costs.

compression_table(run)  one row per variant: size (dense as saved, and stored sparse), speed, loss
compression_plot(run)   size ratio and speed-up against the validation loss added, one point per variant
"""
from __future__ import annotations

import pandas as pd

from dlokit.analysis.figures import add_notes, message_figure, new_figure
from dlokit.analysis.run import COMPLETED, load_run

COLUMNS = ["variant", "method", "sparsity", "zero_fraction", "size_bytes", "size_bytes_sparse", "size_ratio",
           "tokens_per_s", "speedup", "val_loss", "val_loss_increase", "note"]


def compression_table(run, runs_dir=None) -> pd.DataFrame:
    lines = load_run(run, runs_dir).lines("compress")
    if lines.empty:
        return pd.DataFrame(columns=COLUMNS)
    table = lines.reindex(columns=COLUMNS).reset_index(drop=True)
    table.attrs["basis"] = ("one run of compress_bench.py: sizes in bytes as saved, size_ratio against the dense "
                            "weights; tokens_per_s and speedup (against dense) over its timed steps; val_loss on its "
                            "held-out tokens, val_loss_increase against dense")
    return table


def compression_plot(run, runs_dir=None):
    run = load_run(run, runs_dir)
    table = compression_table(run)
    if table.empty:
        return message_figure([run.describe_state(), "no compress lines: not a compress_bench.py run"],
                              title="compression")
    figure, axes = new_figure(1, 2, size=(12, 4.5))
    size_ax, speed_ax = axes[0]
    for index, row in table.iterrows():
        color = f"C{index % 10}"
        for ax, y in ((size_ax, row["size_ratio"]), (speed_ax, row["speedup"])):
            ax.plot(row["val_loss_increase"], y, "o", color=color, markersize=8, label=row["variant"])
            ax.annotate(row["variant"], (row["val_loss_increase"], y), textcoords="offset points", xytext=(5, 4),
                        fontsize=7)
    size_ax.set(xlabel="validation loss added", ylabel="size / fp32 size (pruned: stored sparse)",
                title="smaller weights: at what loss")
    speed_ax.set(xlabel="validation loss added", ylabel="inference tokens/s / fp32's (this CPU)",
                 title="faster inference: at what loss")
    for ax in (size_ax, speed_ax):
        ax.axhline(1.0, color="gray", lw=0.8, ls=":")
        ax.axvline(0.0, color="gray", lw=0.8, ls=":")
    threads = run.summary.get("threads")
    figure.suptitle(f"{run.label}: {run.config.get('config', '?')} model, "
                    f"{run.summary.get('trained_steps', '?')} training steps" +
                    (f", {threads} thread(s)" if threads else ""), fontsize=10)
    add_notes(figure, [] if run.state == COMPLETED else [run.describe_state()])
    return figure
