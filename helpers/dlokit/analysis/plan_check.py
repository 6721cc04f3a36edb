"""The planner's predictions beside what its layouts' jobs measured: memory per rank and step time, with the ratio.

    chosen = layout_planner.candidates(plan_table)                # the layouts to run, in the order they were submitted
    table = predicted_vs_measured(chosen, job_ids)         # per layout: predicted, measured, measured / predicted
    table.attrs["notes"]                                   # where the model is wrong here, and why
    comparison_plot(table)

Memory: the memory model for the run's own config (memory_model.estimate_for_run) against the tensors the busiest rank
held (train_llm.py's memory meter, as TP4.1 reads it). Step time: the step model (analysis/step_model.py) against the
median of the run's settled steps (t_step: forward, backward and optimizer, no data loading), with its 95 % interval;
the ratio's interval is the measurement's, divided by the prediction (a number, without an interval of its own).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dlokit import memory_model
from dlokit.analysis.figures import message_figure, new_figure
from dlokit.analysis.llm_memory import MIB, _measured
from dlokit.analysis.run import COMPLETED, load_runs
from dlokit.analysis.stats import Estimate, estimate, ratio

COLUMNS = ["layout", "run_id", "state", "predicted_rank", "memory_predicted_mib", "memory_measured_mib",
           "memory_ratio", "step_predicted_ms", "step_measured_ms", "step_low_ms", "step_high_ms", "step_ratio",
           "step_ratio_low", "step_ratio_high"]


def by_layout(chosen: pd.DataFrame, runs: list) -> list[list]:
    """The runs (loaded, in submission order) of each chosen layout, in the planner's order: the jobs were submitted in
    rounds (day.layout_runs with `repeats`), job i ran layout i % len(chosen). Empty when they are not whole rounds."""
    n = len(chosen)
    if not n or not runs or len(runs) % n:
        return []
    return [runs[i::n] for i in range(n)]


def decided(chosen: pd.DataFrame, job_ids, runs_dir=None) -> bool:
    """TP4.9's rounds (day.submit_until_decided): does the pick against the layout predicted slowest decide (its
    interval clear of 1, either side)? Two runs each read CP ×2.4 [0.59–9.4] of DDP in one course run and ×3.9
    [1.2–12.9] in the next (2026-11-29, the machine loaded): the check's second sentence hung on one slow run."""
    loaded = load_runs(list(job_ids), runs_dir)
    runs = by_layout(chosen, loaded)
    if len(runs) < 2 or any(run.state != COMPLETED for run in loaded):
        return True  # one layout, or a job that did not complete (the check says why): more rounds decide nothing
    slow = slowest_against_pick(runs)
    return not slow.usable or slow.low > 1 or slow.high < 1


def slowest_against_pick(runs: list[list]) -> Estimate:
    """The step of the layout predicted slowest (the last of by_layout) over the pick's (the first), with its interval:
    what TP4.9's check judges and its rounds wait on."""
    return ratio(runs[0], runs[-1], "t_step")


def predicted_vs_measured(chosen: pd.DataFrame, job_ids, runs_dir=None) -> pd.DataFrame:
    """One row per chosen layout: its runs (every round of day.layout_runs) against the prediction."""
    rows = []
    for (_, plan), runs in zip(chosen.iterrows(), by_layout(chosen, load_runs(list(job_ids), runs_dir))):
        run = runs[0]
        measured = _measured(run)
        try:
            modelled = memory_model.estimate_for_run(run.config, cuda=run.on_gpu).total / MIB
        except (KeyError, TypeError, ValueError):
            modelled = math.nan
        held = sum(measured.values()) / MIB if measured else math.nan
        step = estimate(runs, "t_step")
        predicted = float(plan["step_s"]) * 1e3
        states = sorted({r.state for r in runs})
        rows.append({"layout": plan["layout"], "run_id": ", ".join(r.run_id for r in runs), "state": ", ".join(states),
                     "predicted_rank": plan["rank"], "memory_predicted_mib": modelled, "memory_measured_mib": held,
                     "memory_ratio": held / modelled if modelled else math.nan,
                     "step_predicted_ms": predicted, "step_measured_ms": step.value * 1e3,
                     "step_low_ms": step.low * 1e3, "step_high_ms": step.high * 1e3,
                     "step_ratio": step.value * 1e3 / predicted, "step_ratio_low": step.low * 1e3 / predicted,
                     "step_ratio_high": step.high * 1e3 / predicted})
    table = pd.DataFrame(rows, columns=COLUMNS)
    table.attrs.update(notes=notes(table, chosen.attrs if hasattr(chosen, "attrs") else {}), **chosen.attrs)
    table.attrs["basis"] = ("memory: the memory model's against the busiest rank's tensors; step_measured_ms: the "
                            "median of the settled steps, step_low_ms–step_high_ms its 95 % interval; ratios: "
                            "measured / predicted")
    return table


def notes(table: pd.DataFrame, attrs: dict) -> list[str]:
    """Where the model is wrong on these runs, and why, from the numbers themselves."""
    found = []
    ratios = table["step_ratio"].dropna()
    if len(ratios):
        low, high = float(ratios.min()), float(ratios.max())
        if low > 2:
            found.append(f"every step took ×{low:.1f} to ×{high:.1f} the predicted time: the model counts FLOPs at the "
                         "matmul peak and bytes at the bus bandwidth, and nothing else. A small model's step is mostly "
                         "what it leaves out: each operation's launch and Python (hundreds a step, at sizes where a "
                         "matmul runs far under the peak), the optimizer step, and each collective's fixed cost (the "
                         "bench's smallest messages show it: their bus bandwidth is a fraction of the large ones')")
        elif high < 0.5:
            found.append(f"every step took ×{low:.2f} to ×{high:.2f} the predicted time: faster than the model allows; "
                         "the peak or the bandwidths it was given are too low")
        if high / max(low, 1e-12) > 2:
            found.append(f"the ratio varies ×{high / low:.1f} between layouts: the model's relative costs are off "
                         "there (e.g. per-collective overheads where it counts bytes only, or overlap it assumes)")
    if not attrs.get("basis", "").startswith("on paper") and "gloo" in attrs.get("basis", ""):
        found.append("gloo runs each collective on the cores that compute: nothing overlaps on a CPU, so the model "
                     "adds every collective to the step, as it should here")
    memory = table["memory_ratio"].dropna()
    if len(memory):
        found.append(f"memory per rank: the tensors measured are ×{memory.min():.2f} to ×{memory.max():.2f} the "
                     "model's (the meter counts tensors, not the allocator's caching, nor DDP's buckets)")
    over = table[table["memory_ratio"] > 1.15]
    if len(over):
        found.append(f"{', '.join(over['layout'])} held more than modelled: what the model leaves out (the keys and "
                     "values a context-parallel attention fetches from the other ranks, a pipeline stage's received "
                     "activations, the first stage's embedding beside its blocks)")
    return found


def fastest(table: pd.DataFrame) -> int | None:
    """The row whose measured step is the shortest."""
    measured = table["step_measured_ms"]
    return int(np.nanargmin(measured.to_numpy(float))) if measured.notna().any() else None


def comparison_plot(table: pd.DataFrame):
    """Left: memory per rank, predicted and measured. Right: step time predicted and measured (95 % interval)."""
    if table.empty:
        return message_figure(["no layout ran"], title="predicted against measured")
    figure, axes = new_figure(1, 2, size=(12, 4.2))
    memory, step = axes[0]
    x = np.arange(len(table))
    labels = [f"{layout}\n(predicted #{rank})" for layout, rank in zip(table["layout"], table["predicted_rank"])]
    for ax, pred, meas, unit in ((memory, "memory_predicted_mib", "memory_measured_mib", "MiB per rank (busiest)"),
                                 (step, "step_predicted_ms", "step_measured_ms", "step (ms)")):
        ax.bar(x - 0.2, table[pred], 0.4, color="0.7", label="predicted")
        ax.bar(x + 0.2, table[meas], 0.4, color="tab:blue", label="measured")
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_ylabel(unit)
        ax.legend(fontsize=8)
    errors = [table["step_measured_ms"] - table["step_low_ms"], table["step_high_ms"] - table["step_measured_ms"]]
    step.errorbar(x + 0.2, table["step_measured_ms"], yerr=np.nan_to_num(np.asarray(errors, float)), fmt="none",
                  ecolor="black", capsize=4)
    for index, row in table.iterrows():
        if math.isfinite(row["step_ratio"]):
            step.annotate(f"×{row['step_ratio']:.1f}\n[{row['step_ratio_low']:.1f}–{row['step_ratio_high']:.1f}]",
                          (index + 0.2, row["step_high_ms"]), ha="center", va="bottom",
                          fontsize=7, xytext=(0, 2), textcoords="offset points")
    top = np.nanmax(table[["step_high_ms", "step_measured_ms", "step_predicted_ms"]].to_numpy(float))
    if math.isfinite(top):
        step.set_ylim(0, top * 1.18)  # room above the highest whisker for its two-line label, under the title
    memory.set_title("memory per rank:\nmemory model against the tensors held", fontsize=9)
    step.set_title("step time: step model against the settled steps\n(×: measured / predicted, 95 % interval)", fontsize=9)
    return figure
