"""What SyncBatchNorm computes (Day 2, TP2.3), from bn_statistics.py's record: each rank's own batch statistics
against the synchronised ones and the whole batch's, per channel.

    bn_statistics_table(job_id)   # one row per rank and channel: own, synchronised and whole-batch mean and variance
    bn_statistics_plot(job_id)    # per channel: each rank's own mean, the synchronised mean, the whole batch's
    running_stats_table(job_ids)  # a training's ranks: the running statistics each kept, and how far from rank 0's
"""
from __future__ import annotations

import pandas as pd

from dlokit.analysis.figures import add_notes, message_figure, new_figure
from dlokit.analysis.run import load_run, load_runs

COLUMNS = ["rank", "channel", "own_mean", "synced_mean", "whole_mean", "own_var", "synced_var", "whole_var"]


def bn_statistics_table(job_id, runs_dir=None) -> pd.DataFrame:
    run = load_run(job_id, runs_dir)
    lines = pd.concat([run.lines("bn_statistics", rank) for rank in sorted(run.ranks)] or [pd.DataFrame()])
    whole = lines[lines["rank"] == 0].iloc[0] if "whole_mean" in lines and (lines["rank"] == 0).any() else None
    rows = []
    for line in lines.itertuples():
        for channel, (own_mean, synced_mean, own_var, synced_var) in enumerate(
                zip(line.local_mean, line.synced_mean, line.local_var, line.synced_var)):
            rows.append({"rank": int(line.rank), "channel": channel, "own_mean": own_mean, "synced_mean": synced_mean,
                         "whole_mean": whole["whole_mean"][channel] if whole is not None else None,
                         "own_var": own_var, "synced_var": synced_var,
                         "whole_var": whole["whole_var"][channel] if whole is not None else None})
    table = pd.DataFrame(rows, columns=COLUMNS)
    table.attrs["basis"] = ("one batch, each rank's first channels: own_* from the rank's own images, synced_* what "
                            "SyncBatchNorm normalised with, whole_* the whole global batch's, computed in one piece")
    return table


def bn_statistics_plot(job_id, runs_dir=None):
    run = load_run(job_id, runs_dir)
    table, state = bn_statistics_table(run), run.describe_state()
    if table.empty:
        return message_figure([state, "no bn_statistics line in its record"], title="BatchNorm's mean per channel")
    figure, axes = new_figure(1, 1, size=(7, 3.5))
    ax = axes[0][0]
    ranks = sorted(table["rank"].unique())
    width = 0.8 / (len(ranks) + 1)
    for k, rank in enumerate(ranks):
        rows = table[table["rank"] == rank]
        ax.bar(rows["channel"] + (k - len(ranks) / 2) * width, rows["own_mean"], width, label=f"rank {rank}: own batch")
    synced = table[table["rank"] == ranks[0]]
    at = synced["channel"] + (len(ranks) / 2) * width
    ax.bar(at, synced["synced_mean"], width, color="black", label="synchronised (every rank)")
    ax.scatter(at, synced["whole_mean"], marker="_", s=400, color="red", zorder=3, label="whole batch, in one piece")
    ax.set(xlabel="channel", ylabel="mean", xticks=sorted(table["channel"].unique()),
           title="BatchNorm's mean per channel: each rank's own vs synchronised")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    add_notes(figure, [] if run.state == "completed" else [state])
    return figure


def _apart(values, reference) -> float:
    """The largest difference over the channels, relative to the largest magnitude of the reference's."""
    scale = max(abs(v) for v in reference) or 1.0
    return max(abs(a - b) for a, b in zip(values, reference)) / scale


def running_stats_table(job_ids, runs_dir=None) -> pd.DataFrame:
    """One row per run and rank: the first BatchNorm layer's running mean and variance at the end of the last
    epoch (train_classifier.py's 'bn_running' lines, its first channels), and `from_rank0`, how far they lie from
    rank 0's (the largest difference over those channels, relative to rank 0's largest value, mean or variance).
    SyncBatchNorm keeps every rank's the same; plain BatchNorm under DDP lets each rank's follow its own batches."""
    rows = []
    for run in load_runs(job_ids, runs_dir):
        last = {}
        for rank in sorted(run.ranks):
            lines = run.lines("bn_running", rank)
            if not lines.empty:
                last[rank] = lines.iloc[-1]
        if not last:
            continue
        reference = last[min(last)]
        for rank, line in last.items():
            rows.append({"run_id": run.run_id, "sync_bn": bool(run.config.get("sync_bn")), "rank": rank,
                         "epoch": int(line["epoch"]) + 1, "layer": line["layer"],
                         "mean_ch0": line["running_mean"][0], "var_ch0": line["running_var"][0],
                         "from_rank0": max(_apart(line["running_mean"], reference["running_mean"]),
                                           _apart(line["running_var"], reference["running_var"]))})
    columns = ["run_id", "sync_bn", "rank", "epoch", "layer", "mean_ch0", "var_ch0", "from_rank0"]
    return pd.DataFrame(rows, columns=columns)
