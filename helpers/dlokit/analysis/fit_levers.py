"""TP1.5's views of fit_levers.py's records: what gradient accumulation and activation checkpointing cost and save.

    lever_table(job)            # per lever: tensors held, step time, each against the plain step with its interval
    norm_table(job)             # per norm and step: the accumulated step against the plain large batch
    norm_plot(norm_table(job))  # their relative difference, BatchNorm against GroupNorm
    scan_limit(job, 256)        # the scan's limit: the plain step's tensors at that batch
    scan_table(scan_ids)        # per lever under the limit: fits or out of memory
    scan_plot(scan_table(...))

Memory is counted from the tensors (common/tensor_memory.py) on the first and last step of each arm: exact, the same
every step, so its interval is the value itself when both counts agree. Time: the arms' steps alternate in one
process (plain, accumulate, checkpoint, plain...), so each round's ratio to the plain step is paired, and the
interval is a bootstrap of their median (stats.estimate_of_samples): the drift of the machine hits every arm alike.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dlokit.analysis import stats
from dlokit.analysis.figures import message_figure, new_figure
from dlokit.analysis.run import COMPLETED, load_run, load_runs

LEVERS = ("plain", "accumulate", "checkpoint")
NAMES = {"plain": "plain large batch", "accumulate": "gradient accumulation", "checkpoint": "activation checkpointing"}
COLORS = {"plain": "tab:blue", "accumulate": "tab:purple", "checkpoint": "tab:green"}
SCAN_ENDS = {"COMPLETED": "", "OUT_OF_MEMORY": "TP1.5's scan under one limit: the plain step is meant not to fit"}
ROUNDING = 1e-4  # relative: two orders of summing one batch's fp32 gradients differ by ~1e-7 (measured), far below


def lever_steps(job) -> pd.DataFrame:
    """The measurement's step lines (kind 'lever_step'), one row per arm and step."""
    lines = load_run(job).lines("lever_step")
    return lines if len(lines) else pd.DataFrame(columns=["lever", "step", "timed", "t_step", "held_mib"])


def _counted(steps: pd.DataFrame, lever: str, column: str) -> np.ndarray:
    rows = steps[(steps["lever"] == lever) & ~steps["timed"].astype(bool)]
    return pd.to_numeric(rows.get(column, pd.Series(dtype=float)), errors="coerce").dropna().to_numpy()


def _median(values: np.ndarray) -> float:
    return float(np.median(values)) if len(values) else math.nan


def _paired_time_ratios(steps: pd.DataFrame, lever: str) -> np.ndarray:
    timed = steps[steps["timed"].astype(bool)]
    by_step = timed.pivot_table(index="step", columns="lever", values="t_step")
    if lever not in by_step or "plain" not in by_step:
        return np.array([])
    return (by_step[lever] / by_step["plain"]).dropna().to_numpy()


def untreated(steps: pd.DataFrame, lever: str) -> str:
    """'' when the lever's records show it did what it is named for, else why not, naming the TODO: an accumulated
    step in one forward pass, checkpointed blocks that ran once (their activations kept)."""
    rows = steps[steps["lever"] == lever]
    if rows.empty or lever == "plain":
        return ""
    if lever == "accumulate" and all(len(passes) == 1 for passes in rows["forward_images"]):
        return "the accumulated step ran the whole batch in one forward pass (TODO TP1.5)"
    if lever == "checkpoint" and (rows["block_forwards"] <= rows["blocks"]).all():
        return "the checkpointed blocks ran once a step, nothing recomputed (TODO TP1.5)"
    return ""


def verdict(ratio: stats.Estimate, expects: str) -> str:
    """'falls'/'rises' as the lesson says, from the interval: agrees, contradicts or within noise."""
    if not ratio.usable:
        return stats.NO_MEASUREMENT
    return ratio.outcome(expects_gain=expects == "rises")


def lever_table(job) -> pd.DataFrame:
    """Per lever: MiB held in tensors (activations saved for backward + weights, gradients, optimizer states; on a
    GPU also the allocator's peak over the step above what it held before: max_memory_allocated), the median step
    time, and both against the plain step: the ratio with its 95 % interval and the lesson's verdict (memory falls,
    time rises)."""
    steps = lever_steps(job)
    rows = []
    for lever in [lever for lever in LEVERS if lever in set(steps["lever"])]:
        held, saved = _counted(steps, lever, "held_mib"), _counted(steps, lever, "saved_mib")
        times = pd.to_numeric(steps.loc[(steps["lever"] == lever) & steps["timed"].astype(bool), "t_step"],
                              errors="coerce").dropna().to_numpy()
        row = {"lever": NAMES[lever], "saved_mib": float(np.median(saved)) if len(saved) else math.nan,
               "held_mib": float(np.median(held)) if len(held) else math.nan,
               "device_step_peak_mib": _median(_counted(steps, lever, "device_step_peak_mib")),
               "step_s": stats.estimate_of_samples([times]).text("s"), "memory_x": "", "memory_verdict": "",
               "time_x": "", "time_verdict": "", "steps": len(times)}
        same = untreated(steps, lever)
        if same:
            row.update(memory_x=f"same computation: {same}", time_x="no effect to judge")
        elif lever != "plain":
            plain_held = _counted(steps, "plain", "held_mib")
            n = min(len(held), len(plain_held))
            memory = stats.estimate_of_samples([held[:n] / plain_held[:n]]) if n else stats.NO_ESTIMATE
            time = stats.estimate_of_samples([_paired_time_ratios(steps, lever)])
            row.update(memory_x=memory.text(), memory_verdict=f"falls: {verdict(memory, 'falls')}",
                       time_x=time.text(), time_verdict=f"rises: {verdict(time, 'rises')}")
        rows.append(row)
    table = pd.DataFrame(rows, columns=["lever", "saved_mib", "held_mib", "device_step_peak_mib", "memory_x",
                                        "memory_verdict", "step_s", "time_x", "time_verdict", "steps"])
    if table["device_step_peak_mib"].isna().all():  # a CPU: no allocator of its own to read
        table = table.drop(columns="device_step_peak_mib")
    table.attrs["basis"] = ("memory counted from the tensors on two steps of each arm; time: the arms' steps "
                            "alternated in one run, each round's ratio to the plain step, 95 % interval of their "
                            "median")
    return table


def ratios(job) -> dict:
    """{lever: {"memory": Estimate, "time": Estimate}} against the plain step (what the check judges)."""
    steps = lever_steps(job)
    plain_held = _counted(steps, "plain", "held_mib")
    found = {}
    for lever in ("accumulate", "checkpoint"):
        held = _counted(steps, lever, "held_mib")
        n = min(len(held), len(plain_held))
        found[lever] = {"memory": stats.estimate_of_samples([held[:n] / plain_held[:n]]) if n else stats.NO_ESTIMATE,
                        "time": stats.estimate_of_samples([_paired_time_ratios(steps, lever)])}
    return found


def norm_table(job) -> pd.DataFrame:
    """Per norm and step: the plain large batch's loss and gradient norm, the accumulated step's, and their relative
    difference (|accumulated - plain| / plain)."""
    lines = load_run(job).lines("norm_step")
    if not len(lines):
        return pd.DataFrame(columns=["norm", "step", "loss_plain", "loss_accumulate", "loss_apart",
                                     "grad_norm_plain", "grad_norm_accumulate", "grad_norm_apart"])
    table = lines[["norm", "step", "loss_plain", "loss_accumulate", "grad_norm_plain", "grad_norm_accumulate"]].copy()
    table["loss_apart"] = (table["loss_accumulate"] - table["loss_plain"]).abs() / table["loss_plain"].abs()
    table["grad_norm_apart"] = ((table["grad_norm_accumulate"] - table["grad_norm_plain"]).abs()
                                / table["grad_norm_plain"].abs())
    return table.reset_index(drop=True)


def norm_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per norm: the largest and smallest relative difference over the steps, and whether it is beyond rounding."""
    rows = []
    for norm, group in table.groupby("norm", sort=False):
        apart = group[["loss_apart", "grad_norm_apart"]].max(axis=1)
        rows.append({"norm": norm, "steps": len(group), "smallest_apart": float(apart.min()),
                     "largest_apart": float(apart.max()),
                     "accumulation is the large batch": bool(apart.max() <= ROUNDING)})
    return pd.DataFrame(rows, columns=["norm", "steps", "smallest_apart", "largest_apart",
                                       "accumulation is the large batch"])


def norm_plot(table: pd.DataFrame):
    """The accumulated step's relative difference from the plain large batch, step by step, per norm (log scale)."""
    if table.empty:
        return message_figure(["no norm lesson in this run"], title="accumulation against the large batch")
    figure, axes = new_figure(size=(7, 4))
    ax = axes[0, 0]
    for (norm, group), marker in zip(table.groupby("norm", sort=False), "os^"):
        for column, style in (("loss_apart", "-"), ("grad_norm_apart", "--")):
            ax.plot(group["step"], group[column].clip(lower=1e-9), style, marker=marker,
                    label=f"{norm}: {'loss' if column == 'loss_apart' else 'gradient norm'}")
    ax.axhline(ROUNDING, color="black", linewidth=1)
    ax.annotate(f"the check's tolerance, {ROUNDING:g} (fp32 rounding: ~1e-7)", (0.01, ROUNDING),
                xycoords=("axes fraction", "data"), va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(sorted(table["step"].unique()))
    ax.set(xlabel="step (both from the same weights)", ylabel="|accumulated - large batch| / large batch",
           title="k micro-batches against one large batch (1e-9: identical)")
    ax.legend(fontsize=8)
    return figure


def scan_limit(job, batch: int) -> float:
    """The scan's limit (MiB): what the plain step holds in tensors at `batch`, from the measurement (activations
    grow with the batch, weights, gradients and optimizer states do not). The plain step also needs its gradients
    in flight and the allocator's own room, so it cannot fit in exactly its tensors; the levers hold far less."""
    steps = lever_steps(job)
    saved, held = _counted(steps, "plain", "saved_mib"), _counted(steps, "plain", "held_mib")
    measured = int(load_run(job).config.get("batch_size") or 0)
    if not (len(saved) and len(held) and measured):
        raise ValueError(f"run {job} has no counted plain step: run the measurement first")
    states = float(np.median(held) - np.median(saved))
    return round(states + float(np.median(saved)) * batch / measured)


def scan_table(job_ids) -> pd.DataFrame:
    """One row per run of the scan: lever, batch, how it ended ('fits', 'out of memory', or the run's state), the
    limit, and the tensors it held where it fitted."""
    rows = []
    for run in load_runs(list(job_ids)):
        levers = run.config.get("levers") or []
        lever = levers[0] if len(levers) == 1 else ",".join(levers)
        outcome = "out of memory" if run.oom else ("fits" if run.state == COMPLETED else run.state)
        lines = run.lines("lever_step")
        held = pd.to_numeric(lines["held_mib"], errors="coerce").max() if "held_mib" in lines else None
        rows.append({"run_id": run.run_id, "lever": lever, "batch": int(run.config.get("batch_size") or 0),
                     "micro_batches": run.config.get("micro_batches") if lever == "accumulate" else None,
                     "outcome": outcome,
                     "limit_mib": run.summary.get("memory_limit_mib") or run.config.get("memory_limit"),
                     "held_mib": held if outcome == "fits" else None})
    return pd.DataFrame(rows, columns=["run_id", "lever", "batch", "micro_batches", "outcome", "limit_mib", "held_mib"])


def describe(table: pd.DataFrame) -> str:
    """'batch 256 under 416 MiB: plain large batch out of memory, gradient accumulation fits, ...'."""
    if table.empty:
        return "no scan run"
    parts = [f"{NAMES.get(r.lever, r.lever)} {r.outcome}" for r in table.itertuples()]
    limit = table["limit_mib"].max()
    under = f"under {limit:.0f} MiB" if pd.notna(limit) else "under no limit"
    return f"batch {table['batch'].max()} {under}: " + ", ".join(parts)


def scan_plot(table: pd.DataFrame, job=None):
    """MiB per lever at the scan's batch: the tensors held where the run fitted (a bar), a cross where it ran out of
    memory (at the limit: it needed more), the limit as a line."""
    if table.empty:
        return message_figure(["no runs"], title="the scan under one limit")
    figure, axes = new_figure(size=(7, 4))
    ax = axes[0, 0]
    for x, row in enumerate(table.itertuples()):
        color = COLORS.get(row.lever, "tab:gray")
        if row.outcome == "fits":
            ax.bar(x, row.held_mib, color=color, alpha=0.8)
            ax.annotate(f"fits: {row.held_mib:.0f} MiB", (x, row.held_mib), ha="center", va="bottom", fontsize=8)
        else:
            ax.plot([x], [row.limit_mib], "x", color=color, markersize=14, markeredgewidth=3)
            ax.annotate(row.outcome, (x, row.limit_mib), ha="center", va="top", fontsize=8,
                        xytext=(0, -12), textcoords="offset points")
    limits = table["limit_mib"].dropna().unique()
    for limit in limits:
        ax.axhline(float(limit), color="black", linewidth=1)
        ax.annotate(f"limit {float(limit):.0f} MiB", (0.99, float(limit)), xycoords=("axes fraction", "data"),
                    ha="right", va="bottom", fontsize=8)
    if len(limits):
        ax.set_ylim(0, 1.15 * float(max(limits)))
    ax.set_xticks(range(len(table)), [NAMES.get(lever, lever) for lever in table["lever"]])
    ax.set(ylabel="MiB held in tensors", title=describe(table))
    ax.title.set_fontsize(9)
    return figure
