"""Day 4: parallelism changes the speed, not the maths. Every mode's loss, step by step, against one process.

    loss_match_table(["1235", "1236"], reference="1234")   # max |Δloss| (and Δ gradient norm) per run
    loss_overlay(["1235", "1236"], reference="1234")       # the curves on the reference's, and |Δloss|

Runs are compared on the steps both logged (train_llm.py logs every step's global-batch loss, and the
global gradient norm with --grad-norm). Same seed, same global batch, same data: a correct parallel
run differs from the single process by floating-point reordering only (about 1e-6 in fp32); a wrong
gradient scaling or a rank reading the wrong slice of the batch shows at once. In bf16 the rounding itself
depends on the layout (FSDP2 casts the whole weights to bf16, autocast only each product's inputs), so a bf16 pair
is judged at bf16's tolerance (TOLERANCES: measured on the notebook's tiny runs).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from dlokit.analysis.figures import add_notes, message_figure, new_figure
from dlokit.analysis.llm_memory import mode_label
from dlokit.analysis.run import load_run, load_runs
from dlokit.analysis.throughput import throughput_columns

# |Δloss| below which a run counts as matching, by the compute dtype of the pair (the coarser one's). Measured on
# Day 4's tiny config, 6 steps of text, 2 ranks (CPU, 2026-11-27): every correct layout differs from one process by
# at most 1e-6 in fp32 and 1.3e-3 in bf16 (FSDP2 and ring attention the most), the untouched TODOs of TP4.2, TP4.4
# and TP4.5 by 1.7e-2 or more in either dtype; each tolerance sits between the two. TF32 (fp32 with --tf32 on a GPU,
# never measured) rounds each product's inputs to a 10-bit mantissa (fp16's, 2^-11) where bf16 rounds to 7 (2^-8), and
# leaves the weights fp32 in every layout: bf16's 1.3e-3 scaled by 1/8 gives ~1.6e-4; its tolerance sits at the
# geometric mean of that and the wrong TODOs' 1.7e-2 (1.65e-3, as bf16's 5e-3 sits at that of 1.3e-3 and 1.7e-2).
TOLERANCES = {"fp32": 1e-3, "tf32": 2e-3, "bf16": 5e-3}


def compute_dtype(run) -> str:
    """What a run's matrix products computed in: train_llm.py's --dtype, or "tf32" for an fp32 run on a GPU with TF32
    on (its record's tf32_applied, else --tf32; a CPU's products stay fp32 whatever the flag)."""
    dtype = str(run.config.get("dtype", "fp32"))
    tf32 = run.config.get("tf32_applied", run.config.get("tf32"))
    return "tf32" if dtype == "fp32" and tf32 and run.on_gpu else dtype


def coarsest_dtype(*runs) -> str:
    """The compute dtype (compute_dtype) with the widest tolerance among `runs`."""
    dtypes = {compute_dtype(run) for run in runs} & set(TOLERANCES) or {"fp32"}
    return max(dtypes, key=TOLERANCES.get)


def _by_step(run, column: str) -> pd.Series:
    steps = run.steps
    if steps.empty or column not in steps or "step" not in steps:
        return pd.Series(dtype=float)
    data = steps[["step", column]].apply(pd.to_numeric, errors="coerce").dropna()
    return data.drop_duplicates("step", keep="last").set_index("step")[column]


def loss_match_table(runs, reference, runs_dir=None, tolerance: float | None = None, peak=None,
                     throughput: bool = True) -> pd.DataFrame:
    """One row per run: steps compared, max |Δloss|, max relative Δ of the gradient norm (when both
    logged it), and `matched` (max |Δloss| <= tolerance over at least one step). tolerance None: that of the
    runs' coarsest compute dtype (coarsest_dtype). throughput: the runs' tokens/s and MFU with their 95 % intervals
    (analysis/throughput.py; `peak`: the measured peak MFU needs on a CPU)."""
    ref = load_run(reference, runs_dir)
    ref_loss, ref_norm = _by_step(ref, "loss"), _by_step(ref, "grad_norm")
    runs = load_runs(runs, runs_dir)
    dtype = coarsest_dtype(ref, *runs)
    tolerance = tolerance or TOLERANCES[dtype]
    rows = []
    for run in runs:
        loss, norm = _by_step(run, "loss"), _by_step(run, "grad_norm")
        common = loss.index.intersection(ref_loss.index)
        d_loss = (loss[common] - ref_loss[common]).abs()
        both = norm.index.intersection(ref_norm.index)
        d_norm = ((norm[both] - ref_norm[both]).abs() / ref_norm[both].abs().clip(lower=1e-12))
        rows.append({"run_id": run.run_id, "mode": mode_label(run), "world_size": run.world_size, "state": run.state,
                     "steps_compared": len(common),
                     "max_abs_dloss": float(d_loss.max()) if len(common) else None,
                     "max_rel_dgrad_norm": float(d_norm.max()) if len(both) else None,
                     "matched": bool(len(common)) and float(d_loss.max()) <= tolerance})
    columns = ["run_id", "mode", "world_size", "state", "steps_compared", "max_abs_dloss", "max_rel_dgrad_norm",
               "matched"]
    table = pd.DataFrame(rows, columns=columns)
    if throughput and len(table):
        speed = throughput_columns(runs, peak)
        table["tokens_per_s"] = [speed.loc[r.run_id, "tokens_per_s"] for r in runs]
        table["mfu"] = [speed.loc[r.run_id, "mfu"] for r in runs]
        table.attrs["mfu_basis"] = "; ".join(sorted(set(speed["mfu_basis"])))
    table.attrs.update(reference=ref.run_id, tolerance=tolerance, dtype=dtype)
    table.attrs["basis"] = (f"against the single process (run {ref.run_id}), step by step: max_abs_dloss the largest "
                            f"|Δloss| (matched: at most {tolerance:g}, {dtype}'s tolerance), max_rel_dgrad_norm the "
                            "largest relative Δ of the gradient norm" +
                            ("; tokens_per_s and mfu: the median of the settled steps [95 % interval]; MFU's peak: "
                             + table.attrs["mfu_basis"] if "mfu_basis" in table.attrs else ""))
    return table


def loss_overlay(runs, reference, runs_dir=None):
    """Left: every run's loss per step drawn over the reference's (thick grey). Right: |Δloss| per step
    (log scale), with the matching tolerance."""
    ref = load_run(reference, runs_dir)
    ref_loss = _by_step(ref, "loss")
    runs = load_runs(runs, runs_dir)
    notes = [r.describe_state() for r in [ref, *runs] if r.state != "completed"]
    if ref_loss.empty:
        return message_figure([f"reference {ref.describe_state()}: no loss to compare with", *notes],
                              title="loss match")
    figure, axes = new_figure(1, 2, size=(12, 4))
    curves, deltas = axes[0]
    curves.plot(ref_loss.index, ref_loss.values, color="0.6", linewidth=5, label=f"{mode_label(ref)} (reference)")
    for index, run in enumerate(runs):
        loss = _by_step(run, "loss")
        if loss.empty:
            notes.append(f"run {run.run_id}: no loss logged")
            continue
        color = f"C{index % 10}"
        curves.plot(loss.index, loss.values, "o-", color=color, markersize=3, linewidth=1,
                    label=f"{mode_label(run)} ({run.run_id})")
        common = loss.index.intersection(ref_loss.index)
        delta = (loss[common] - ref_loss[common]).abs().to_numpy()
        deltas.semilogy(common, np.maximum(delta, 1e-9), "o-", color=color, markersize=3)
    dtype = coarsest_dtype(ref, *runs)
    deltas.axhline(TOLERANCES[dtype], color="tab:red", linestyle="--", linewidth=1,
                   label=f"tolerance {TOLERANCES[dtype]:g} ({dtype})")
    curves.set(xlabel="step", ylabel="loss (global batch)", title="loss per step, over one process's")
    deltas.set(xlabel="step", ylabel="|Δloss| vs reference", title="difference (0 shown as 1e-9)")
    for ax in (curves, deltas):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    curves.legend(fontsize=7)
    deltas.legend(fontsize=7)
    add_notes(figure, notes)
    return figure
