"""Power against batch size (Day 1's scan): what the device draws, and the energy each image costs.

    power_table(sweep_jobs)      # per run: batch, power (W) and its source, compute img/s, J per image
    power_vs_batch(sweep_jobs)   # the two against the batch; "n/a" with the reason where nothing was readable

On a GPU the power is NVML's peak over the training steps (the script samples it every 0.2 s). On a CPU it is
the host packages' mean over the run, from RAPL, where the kernel lets this user read it. The energy of one
image is that power divided by the compute throughput: what an image costs while the device trains.
"""
from __future__ import annotations

import pandas as pd

from dlokit.analysis.figures import message_figure, new_figure
from dlokit.analysis.run import COMPLETED, load_runs
from dlokit.analysis.table import as_number, run_metric

COLUMNS = ["run_id", "batch_size", "power_w", "source", "throughput_compute", "joules_per_image"]


def _power(run) -> tuple[float | None, str]:
    """(watts, where they come from), or (None, why there is no reading)."""
    summary = run.summary
    peak = as_number(summary.get("peak_power_w"))
    if peak:
        return peak, "GPU peak (NVML)"
    host, wall = as_number(summary.get("host_energy_j")), as_number(summary.get("wall_time_s"))
    if host and wall:
        return host / wall, "CPU packages, mean over the run (RAPL)"
    return None, (summary.get("energy_unavailable") or summary.get("host_energy_unavailable")
                  or "no energy counter in the record")


def power_table(runs, runs_dir=None) -> pd.DataFrame:
    rows, missing = [], []
    for run in load_runs(runs, runs_dir):
        batch = as_number(run.config.get("batch_size"))
        if run.state != COMPLETED or batch is None:
            continue
        watts, source = _power(run)
        if watts is None:
            missing.append(source)
            continue
        speed = run_metric(run, "throughput_compute")
        rows.append({"run_id": run.run_id, "batch_size": int(batch), "power_w": watts, "source": source,
                     "throughput_compute": speed, "joules_per_image": watts / speed if speed else None})
    table = pd.DataFrame(rows, columns=COLUMNS).sort_values("batch_size").reset_index(drop=True)
    table.attrs["unavailable"] = sorted(set(missing))
    table.attrs["basis"] = "power_w: as source says; joules_per_image = power_w / throughput_compute"
    return table


def power_vs_batch(runs, runs_dir=None):
    table = power_table(runs, runs_dir)
    if table.empty:
        why = "; ".join(table.attrs["unavailable"]) or "no completed run"
        return message_figure([f"power: n/a on this hardware ({why})"], title="power vs batch size")
    figure, axes = new_figure(1, 2, size=(10, 3.6))
    for ax, column, label in ((axes[0, 0], "power_w", "W"), (axes[0, 1], "joules_per_image", "J per image")):
        ax.plot(table["batch_size"], table[column], "o-")
        ax.set(xlabel="batch size (per GPU)", ylabel=label, xscale="log")
        ax.set_xticks(table["batch_size"], [str(b) for b in table["batch_size"]])
        ax.minorticks_off()
    axes[0, 0].set_title(f"power: {table['source'].iloc[0]}", fontsize=9)
    axes[0, 1].set_title("energy per image = power / compute img/s", fontsize=9)
    return figure
