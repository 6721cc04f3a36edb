"""Day 4: what each rank hands to the collectives in one training step, from the records (no profiler).

    traffic_table(["1234", "1235", ...])   # one row per run, rank and collective: calls and MiB per step
    traffic_plot(["1234", "1235", ...])    # a bar per rank, grouped by run, stacked by collective

train_llm.py logs the collectives of its first step as PyTorch's dispatcher sees them (summary
`collectives_per_step`, tp_scripts/llm/llm_kit/collectives.py): DDP's all-reduces, FSDP2's all-gathers and
reduce-scatters, ZeRO-1's broadcasts, the pipeline's sends. Where a run also timed its communication (`comm_s`
of its step lines: tensor parallel from scratch), the table gives the mean seconds per step of each rank.
"""
from __future__ import annotations

import pandas as pd

from dlokit.analysis.figures import add_notes, message_figure, new_figure
from dlokit.analysis.llm_memory import MIB, mode_label
from dlokit.analysis.run import load_runs

COLUMNS = ["run_id", "mode", "rank", "collective", "calls", "MiB", "comm_s"]
COLORS = {"allreduce": "tab:blue", "allgather": "tab:green", "reduce_scatter": "tab:orange", "broadcast": "tab:purple",
          "send": "tab:red", "recv": "tab:pink", "alltoall": "tab:brown"}


def _comm_seconds(run, rank: int) -> float | None:
    steps = run.lines("step", rank=rank)
    if steps.empty or "comm_s" not in steps or steps["comm_s"].isna().all():
        return None
    return float(steps["comm_s"].mean())


def traffic_table(runs, runs_dir=None) -> pd.DataFrame:
    rows = []
    for run in load_runs(runs, runs_dir):
        for rank, record in sorted(run.ranks.items()):
            per_step = (record.get("summary") or {}).get("collectives_per_step")
            if not isinstance(per_step, dict):
                continue
            seconds = _comm_seconds(run, rank)
            for collective, seen in sorted(per_step.items()):
                rows.append({"run_id": run.run_id, "mode": mode_label(run), "rank": rank, "collective": collective,
                             "calls": int(seen.get("calls", 0)), "MiB": float(seen.get("bytes", 0)) / MIB,
                             "comm_s": seconds})
    return pd.DataFrame(rows, columns=COLUMNS)


def traffic_plot(runs, runs_dir=None):
    """MiB each rank hands to each kind of collective in one step: DDP all-reduces every gradient, FSDP2 gathers
    every weight (twice when it reshards after forward) and reduce-scatters every gradient, each rank its share."""
    runs = load_runs(runs, runs_dir)
    table = traffic_table(runs)
    logged = set(table["run_id"])
    notes = [f"run {run.run_id} ({mode_label(run)}): no collective logged" + (" (one process)" if run.world_size == 1
                                                                            else f", {run.state}")
             for run in runs if run.run_id not in logged]
    if table.empty:
        return message_figure(notes or ["no runs"], title="collectives of one step, per rank")
    bars = table.groupby(["run_id", "rank"], sort=False)
    figure, axes = new_figure(size=(max(6.0, 0.45 * bars.ngroups + 3), 4.5))
    ax = axes[0, 0]
    positions, names, seen_labels, x, last_run = [], [], set(), 0.0, None
    for (run_id, rank), rows in bars:
        if last_run is not None and run_id != last_run:
            x += 0.8  # a gap between runs
        bottom = 0.0
        for row in rows.itertuples():
            ax.bar(x, row.MiB, 0.8, bottom=bottom, color=COLORS.get(row.collective, "tab:gray"), edgecolor="white",
                   label=None if row.collective in seen_labels else row.collective)
            seen_labels.add(row.collective)
            bottom += row.MiB
        positions.append(x)
        names.append(f"r{rank}" + (f"\n{rows['mode'].iloc[0]}\n{run_id}" if run_id != last_run else ""))
        last_run, x = run_id, x + 1.0
    ax.set_xticks(positions, names, fontsize=7)
    ax.set(ylabel="MiB handed over per step", title="collectives of one step, per rank")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    add_notes(figure, notes)
    return figure
