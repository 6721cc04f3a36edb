"""memory_vs_batch: peak memory against batch size, the OOM point, and model vs activation memory.

Peak memory grows about linearly with the batch: the intercept is what does not depend on the batch
(weights, gradients, optimizer states), the slope is the activation memory per sample.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlokit.analysis.figures import add_notes, message_figure, new_figure
from dlokit.analysis.run import COMPLETED, load_runs
from dlokit.analysis.table import runs_table


def memory_table(runs, runs_dir=None, memory: str = "auto") -> pd.DataFrame:
    """batch_size, peak memory (MiB), oom, state per run; memory='gpu', 'host' or 'auto' (GPU if any)."""
    table = runs_table(load_runs(runs, runs_dir))
    if memory == "auto":
        memory = "gpu" if table["gpu_mem_peak_mb"].notna().any() else "host"
    column = {"gpu": "gpu_mem_peak_mb", "host": "host_rss_peak_mb"}[memory]
    out = table[["run_id", "state", "batch_size", column, "oom"]].rename(columns={column: "peak_mb"})
    out.attrs["memory"] = memory
    return out.sort_values("batch_size", na_position="last").reset_index(drop=True)


def memory_fit(table: pd.DataFrame) -> dict | None:
    """Least-squares line through completed runs: {'model_mb', 'activation_mb_per_sample'}."""
    ok = table[(table["state"] == COMPLETED) & ~table["oom"]].dropna(subset=["batch_size", "peak_mb"])
    if ok["batch_size"].nunique() < 2:
        return None
    slope, intercept = np.polyfit(ok["batch_size"].astype(float), ok["peak_mb"].astype(float), 1)
    return {"model_mb": float(intercept), "activation_mb_per_sample": float(slope)}


def memory_vs_batch(runs, runs_dir=None, memory: str = "auto"):
    """Scatter of peak memory vs batch size, a linear fit, and a red cross per OOM batch size."""
    table = memory_table(runs, runs_dir, memory)
    measured = table[~table["oom"]].dropna(subset=["batch_size", "peak_mb"])
    ooms = table[table["oom"]].dropna(subset=["batch_size"])
    notes = [f"run {r.run_id}: {r.state}, no {'batch size' if pd.isna(r.batch_size) else 'memory reading'}"
             for r in table.itertuples() if not r.oom and (pd.isna(r.batch_size) or pd.isna(r.peak_mb))]
    if measured.empty and ooms.empty:
        return message_figure(notes or ["no runs"], title="memory vs batch size")
    figure, axes = new_figure()
    ax = axes[0, 0]
    ax.plot(measured["batch_size"], measured["peak_mb"], "o", label="peak memory", color="tab:blue")
    fit = memory_fit(table)
    if fit:
        xs = np.linspace(0, max(table["batch_size"].dropna().max(), 1), 50)
        ax.plot(xs, fit["model_mb"] + fit["activation_mb_per_sample"] * xs, "--", color="tab:gray",
                label=f"fit: {fit['model_mb']:.0f} MiB + {fit['activation_mb_per_sample']:.2f} MiB/sample")
    if not ooms.empty:
        top = measured["peak_mb"].max() if not measured.empty else 0.0
        ys = [fit["model_mb"] + fit["activation_mb_per_sample"] * b if fit else top for b in ooms["batch_size"]]
        ax.plot(ooms["batch_size"], ys, "x", color="tab:red", markersize=12, mew=3, label="out of memory")
        for b in ooms["batch_size"]:
            ax.axvline(b, color="tab:red", alpha=0.3)
    label = "GPU peak allocated" if table.attrs["memory"] == "gpu" else "host peak RSS"
    ax.set(xlabel="batch size (per GPU)", ylabel=f"{label} (MiB)", title="memory vs batch size")
    ax.legend(fontsize=8)
    add_notes(figure, notes)
    return figure


def throughput_vs_batch(runs, runs_dir=None, metric: str = "throughput_train"):
    """Throughput against batch size (the batch scan), with the out-of-memory batch sizes marked."""
    table = runs_table(load_runs(runs, runs_dir))
    table[metric] = pd.to_numeric(table[metric], errors="coerce")
    measured = table[~table["oom"]].dropna(subset=["batch_size", metric]).sort_values("batch_size")
    ooms = table[table["oom"]].dropna(subset=["batch_size"])
    notes = [f"run {r.run_id}: {r.state}, no {metric}" for r in table.itertuples()
             if not r.oom and pd.isna(getattr(r, metric))]
    notes += [f"⚠ run {r.run_id} overlapped {r.overlapped_by}: not a valid measurement"
              for r in table.itertuples() if r.overlapped_by]
    if measured.empty:
        return message_figure(notes or ["no runs"], title="throughput vs batch size")
    figure, axes = new_figure()
    ax = axes[0, 0]
    ax.plot(measured["batch_size"], measured[metric], "o-", color="tab:blue", label=metric)
    for b in ooms["batch_size"]:
        ax.axvline(b, color="tab:red", alpha=0.4, label="out of memory" if b == ooms["batch_size"].iloc[0] else None)
    best = measured.loc[measured[metric].idxmax()]
    ax.annotate(f"best: batch {int(best['batch_size'])}", (best["batch_size"], best[metric]), fontsize=8,
                xytext=(5, -12), textcoords="offset points")
    ax.set(xlabel="batch size (per GPU)", ylabel="images / s", title="throughput vs batch size", xscale="log")
    ax.set_xticks(measured["batch_size"], [str(int(b)) for b in measured["batch_size"]])
    ax.legend(fontsize=8)
    add_notes(figure, notes)
    return figure
