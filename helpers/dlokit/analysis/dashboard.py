"""dashboard(run): where the step time goes, throughput, memory and energy of one run."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dlokit.analysis.figures import message_figure, new_figure
from dlokit.analysis.run import load_run

SPLIT_ORDER = ("t_data", "t_h2d", "t_forward", "t_backward", "t_optimizer", "t_metrics")


def _column(frame: pd.DataFrame, name: str) -> np.ndarray:
    if name not in frame:
        return np.zeros(len(frame))
    return pd.to_numeric(frame[name], errors="coerce").fillna(0.0).to_numpy()


def _plot_splits(ax, steps):
    ax.set(title="step time split", xlabel="step", ylabel="seconds")
    # GPU runs split only their breakdown steps; the other lines hold t_data and t_step alone: phases unknown, not 0
    split = steps[steps["breakdown"].fillna(True).astype(bool)] if "breakdown" in steps else steps
    extra = sorted(c for c in split if c.startswith("t_") and c not in SPLIT_ORDER and c not in ("t_step", "t_period"))
    present = [s for s in (*SPLIT_ORDER, *extra) if s in split and split[s].notna().any()]
    if not present:
        ax.text(0.5, 0.5, "no timing splits", ha="center", va="center", transform=ax.transAxes)
        return
    x = _column(split, "step") if "step" in split else np.arange(len(split))
    series = [_column(split, s) for s in present]  # inside a split step an absent phase (t_metrics) is 0
    ax.stackplot(x, *series, labels=[s[2:] for s in present])
    total = np.sum(series, axis=0)
    if len(split) < len(steps) and "t_step" in steps:
        x_all = _column(steps, "step") if "step" in steps else np.arange(len(steps))
        whole = _column(steps, "t_data") + _column(steps, "t_step")
        ax.plot(x_all, whole, color="black", linewidth=0.8, label="whole step (data + step)")
        total = np.concatenate([total, whole])
    typical = float(np.median(total)) if len(total) else 0.0
    if typical > 0 and total.max() > 3 * typical:
        ax.set_ylim(0, 1.5 * float(np.quantile(total, 0.9)))
        ax.text(0.02, 0.88, f"warm-up steps off scale (max {total.max():.3g} s)", fontsize=7,
                va="top", transform=ax.transAxes)
    _legend_above_the_data(ax)


def _plot_throughput(ax, steps):
    x = _column(steps, "step") if "step" in steps else np.arange(len(steps))
    for name in ("throughput_train", "throughput_compute"):
        if name in steps:
            ax.plot(x, _column(steps, name), label=name.split("_")[1])
    ax.set(title="throughput", xlabel="step", ylabel="samples/s")
    ax.set_ylim(bottom=0)
    if ax.lines:
        _legend_above_the_data(ax)


def _legend_above_the_data(ax, per_row: int = 3):
    """The legend in rows of `per_row` (one row of seven phases ran past the plot's left edge), in headroom added
    above the curves, so that it covers none of them."""
    labels = len(ax.get_legend_handles_labels()[1])
    bottom, top = ax.get_ylim()
    ax.set_ylim(bottom, bottom + (1 + 0.15 * math.ceil(labels / per_row)) * (top - bottom))
    ax.legend(fontsize=7, loc="upper right", ncol=min(labels, per_row), frameon=False)


def _per_rank(run, key):
    return {k: r["summary"].get(key) for k, r in sorted(run.ranks.items())
            if r["summary"] and r["summary"].get(key) is not None}


def _plot_memory(ax, run):
    gpu, host = _per_rank(run, "gpu_mem_peak_mb"), _per_rank(run, "host_rss_peak_mb")
    if not gpu:
        steps = run.steps
        if "gpu_mem_mb" in steps:
            gpu = {min(run.ranks): float(pd.to_numeric(steps["gpu_mem_mb"], errors="coerce").max())}
    labels, values, colors = [], [], []
    for kind, readings, color in (("GPU", gpu, "tab:green"), ("host", host, "tab:gray")):
        for rank, value in readings.items():
            labels.append(f"{kind} r{rank}")
            values.append(value)
            colors.append(color)
    if values:
        ax.bar(labels, values, color=colors)
        ax.tick_params(axis="x", labelsize=7, rotation=45)
    else:
        ax.text(0.5, 0.5, "no memory readings yet", ha="center", va="center", transform=ax.transAxes)
    ax.set(title="peak memory", ylabel="MiB")


def _plot_energy(ax, run):
    energy = _per_rank(run, "energy_j")
    if energy:
        ax.bar([f"r{k}" for k in energy], list(energy.values()), color="tab:orange")
        power = _per_rank(run, "peak_power_w")
        title = "GPU energy" + (f" (peak {max(power.values()):.0f} W)" if power else "")
        ax.set(title=title, ylabel="J")
    else:
        ax.axis("off")
        ax.text(0.5, 0.5, "no GPU energy readings\n(NVML absent, CPU run or not finished)",
                ha="center", va="center", transform=ax.transAxes)


def dashboard(run, runs_dir=None):
    """A 2x2 figure for one run (id, path or Run); a text figure when it has no step yet."""
    run = load_run(run, runs_dir)
    steps = run.steps
    if steps.empty:
        return message_figure(run.describe_state())
    figure, axes = new_figure(2, 2, size=(11, 7))
    _plot_splits(axes[0, 0], steps)
    _plot_throughput(axes[0, 1], steps)
    _plot_memory(axes[1, 0], run)
    _plot_energy(axes[1, 1], run)
    figure.suptitle(run.describe_state(), fontsize=10, ha="left", x=0.01)
    return figure
