"""TP4.2's batch scan per layout: under one memory limit per rank, the largest batch DDP fits and FSDP2 fits, then
what each memory lever adds to FSDP2's.

    plan = scan_limit(config, ranks=2, batches=[32, 64, 128, 256], seq_len=16)  # the limit, from the memory model
    table = scan_table(ddp_ids, fsdp_ids)   # per run: layout, batch, how it ended, MiB per rank measured, modelled
    largest_batches(table)                  # {"ddp": {"batch": 64, "bracketed": True, ...}, "fsdp": ...}
    scan_plot(table)                        # MiB per rank against the batch, the limit, a cross where a run ran out
    lever_batches(batches, plan)            # the batches past what FSDP2 fits: where a lever is tried
    levers = scan_table(ddp_ids, fsdp_ids, levers=lever_ids)   # + FSDP2 runs with activation checkpointing,
    lever_table(levers)                     # gradient accumulation, CPU offload: the batch each buys, at what speed

Every run of the scan trains two steps under `--memory-limit`: the second step is the first to hold the optimizer
states together with the activations, as every later step does. A run that ran out of memory is recorded as such
(run.oom): that, not a model, says which batch fits.
"""
from __future__ import annotations

import math

import pandas as pd

from dlokit.analysis.figures import add_notes, message_figure, new_figure
from dlokit.analysis.llm_memory import MIB, _measured, layout_need_mb
from dlokit.analysis.run import COMPLETED, load_runs
from dlokit.analysis.throughput import mfu_estimate, mfu_text, rate_text, tokens_per_s

LAYOUTS = ("ddp", "fsdp")
LEVERS = ("fsdp+ac", "fsdp+accum", "fsdp+offload")  # FSDP2 with one memory lever of train_llm.py each
COLORS = {"ddp": "tab:blue", "fsdp": "tab:orange", "fsdp+ac": "tab:green", "fsdp+accum": "tab:purple",
          "fsdp+offload": "tab:brown"}
NAMES = {"ddp": "DDP", "fsdp": "FSDP2", "fsdp+ac": "FSDP2 + activation checkpointing",
         "fsdp+accum": "FSDP2 + gradient accumulation", "fsdp+offload": "FSDP2 + CPU offload"}


def scan_limit(config: dict, *, ranks: int, batches, seq_len: int, dtype: str = "fp32") -> dict:
    """The limit per rank as far, in ratio, from every modelled need of the scan as it can be, among the limits under
    which DDP fits some batches but not all, and FSDP2 fits more of them: {"limit_mb", "needs" ({layout: [MiB per
    batch]}), "fits" ({layout: batches that fit, modelled}), "margin" (the ratio to the nearest need)}."""
    batches = sorted(int(b) for b in batches)
    needs = {layout: [layout_need_mb(config, layout, ranks=ranks, batch_size=b, seq_len=seq_len, dtype=dtype)
                      for b in batches] for layout in LAYOUTS}
    edges = sorted(needs["ddp"] + needs["fsdp"])
    best = None
    for low, high in zip(edges, edges[1:]):
        limit = math.sqrt(low * high)
        fits = {layout: [b for b, need in zip(batches, needs[layout]) if need < limit] for layout in LAYOUTS}
        if 0 < len(fits["ddp"]) < len(batches) and len(fits["fsdp"]) > len(fits["ddp"]):
            if best is None or high / low > best["margin"] ** 2:
                best = {"limit_mb": round(limit), "needs": needs, "fits": fits, "margin": math.sqrt(high / low)}
    if best is None:
        raise ValueError(f"no limit lets DDP fit some of the batches {batches} and FSDP2 more: modelled needs per rank "
                         f"DDP {[round(n) for n in needs['ddp']]} MiB, FSDP2 {[round(n) for n in needs['fsdp']]} MiB. "
                         "Scan more batch sizes (DDP must fit the smallest and not the largest), or a model whose "
                         "weights weigh more against its activations")
    return best


def lever_batches(batches, plan: dict) -> list[int]:
    """The batches of the scan a lever is tried at: those the memory model says FSDP2 does not fit under the scan's
    limit (`plan`: scan_limit's), else the largest."""
    fits = max(plan["fits"]["fsdp"], default=0)
    return [b for b in batches if b > fits] or list(batches)[-1:]


def _layout(run) -> str | None:
    """'ddp', 'fsdp', or FSDP2 with its memory lever ('fsdp+ac', 'fsdp+accum', 'fsdp+offload'; one at a time)."""
    config = run.config
    layout = config.get("data_parallel")
    if layout == "fsdp":
        for lever, on in (("ac", config.get("activation_checkpointing")), ("accum", int(config.get("grad_accum") or 1) > 1),
                          ("offload", config.get("cpu_offload"))):
            if on:
                return f"fsdp+{lever}"
    return layout if layout in LAYOUTS else None


def _busiest_mib(run) -> float | None:
    """The busiest rank's tensors at their peak (llm_memory's reading of train_llm.py's memory_bytes), MiB."""
    measured = _measured(run)
    return sum(measured.values()) / MIB if measured else None


def _modelled_mib(run) -> float | None:
    config = run.config
    try:
        return layout_need_mb(config["model"], _layout(run).split("+")[0], ranks=run.world_size,
                              batch_size=int(config["batch_size"]), seq_len=int(config["seq_len"]),
                              dtype=config.get("dtype") or "fp32",
                              activation_checkpointing=bool(config.get("activation_checkpointing")),
                              grad_accum=int(config.get("grad_accum") or 1),
                              cpu_offload=bool(config.get("cpu_offload")) and run.on_gpu, cuda=run.on_gpu)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def _last_step_s(run) -> float | None:
    """The last step's time: the scan's second step, the first to run with every state in place."""
    steps = run.steps
    if steps.empty or "t_step" not in steps:
        return None
    value = pd.to_numeric(steps["t_step"], errors="coerce").dropna()
    return float(value.iloc[-1]) if len(value) else None


def _speed(run, peak) -> dict:
    """tokens/s and MFU of a run that fitted, each with its interval (analysis/throughput.py: the scan's one settled
    step carries the run-to-run spread of this machine)."""
    rate = tokens_per_s(run)
    mfu, _ = mfu_estimate(run, peak)
    return {"tokens_per_s": rate_text(rate), "mfu": mfu_text(mfu)}


def scan_table(ddp_ids, fsdp_ids, runs_dir=None, levers=(), peak=None) -> pd.DataFrame:
    """(ids, or Run objects already loaded) One row per run: layout, global batch, batch per rank, outcome ('fits', 'out of memory', or the run's state),
    the limit per rank, MiB per rank measured (from the tensors, where it ran) and modelled, and the last step's time,
    tokens/s and MFU (with their 95 % intervals; `peak`: the measured peak MFU needs on a CPU) where it fitted.
    levers: FSDP2 runs with a memory lever each (their layout says which)."""
    rows = []
    for expected, run_ids in (("ddp", ddp_ids), ("fsdp", fsdp_ids), ("fsdp", levers)):
        for run in load_runs(list(run_ids), runs_dir):
            layout = _layout(run) or run.config.get("mode") or expected
            batch = int(run.config.get("batch_size") or 0)
            outcome = "out of memory" if run.oom else ("fits" if run.state == COMPLETED else run.state)
            rows.append({"run_id": run.run_id, "layout": layout, "batch": batch,
                         "batch_per_rank": batch // max(1, run.world_size), "outcome": outcome,
                         "limit_mb": run.summary.get("memory_limit_mb") or run.config.get("memory_limit"),
                         "measured_mb": _busiest_mib(run) if outcome == "fits" else None,
                         "modelled_mb": _modelled_mib(run),
                         "step_s": _last_step_s(run) if outcome == "fits" else None,
                         **(_speed(run, peak) if outcome == "fits" else {}), "on_gpu": run.on_gpu})
    columns = ["run_id", "layout", "batch", "batch_per_rank", "outcome", "limit_mb", "measured_mb", "modelled_mb",
               "step_s", "tokens_per_s", "mfu", "on_gpu"]
    table = pd.DataFrame(rows, columns=columns).sort_values(["layout", "batch"], kind="stable").reset_index(drop=True)
    table.attrs["basis"] = ("limit_mb: the --memory-limit of each rank's tensors; measured_mb: the busiest rank's tensors; "
                            "modelled_mb: the memory model's; step_s: the last step's seconds; tokens_per_s and mfu "
                            "with their 95 % intervals (analysis/throughput.py)")
    return table


def largest_batches(table: pd.DataFrame) -> dict:
    """Per layout: the largest batch that fits ("batch", None if none did), whether a larger one of the scan ran out
    of memory ("bracketed": then it is the largest of the scan's sizes that fits; else only a lower bound), and the
    runs that ended otherwise ("other")."""
    found = {}
    for layout in [*LAYOUTS, *(lever for lever in LEVERS if lever in set(table["layout"]))]:
        rows = table[table["layout"] == layout]
        fit = rows.loc[rows["outcome"] == "fits", "batch"]
        largest = int(fit.max()) if len(fit) else None
        over = rows.loc[rows["outcome"] == "out of memory", "batch"]
        found[layout] = {"batch": largest,
                         "bracketed": bool(len(over)) and (largest is None or bool((over > largest).any())),
                         "smallest_out": int(over.min()) if len(over) else None,
                         "other": rows.loc[~rows["outcome"].isin(["fits", "out of memory"]), "run_id"].tolist()}
    return found


def describe(found: dict) -> str:
    """'DDP fits a batch of 64 (128 ran out of memory), FSDP2 fits a batch of 128 (256 ran out of memory)'."""
    def one(layout):
        entry = found[layout]
        if entry["batch"] is None:
            return f"{NAMES[layout]} fits none of the batches"
        out = f" ({entry['smallest_out']} ran out of memory)" if entry["bracketed"] else " (no batch ran out of memory)"
        return f"{NAMES[layout]} fits a batch of {entry['batch']}{out}"
    return ", ".join(one(layout) for layout in LAYOUTS)


def scan_plot(table: pd.DataFrame):
    """MiB per rank against the global batch, per layout: the tensors measured where the run fitted (a dot; the limit
    also bounds what the meter does not count, DDP's gradient buckets and the optimizer's temporaries), modelled for
    every batch (a dashed line), a cross at the modelled need where the run ran out of memory; the limit as a line."""
    if table.empty:
        return message_figure(["no runs"], title="the batch scan")
    levers = bool(set(table["layout"]) & set(LEVERS))
    figure, axes = new_figure(size=(10, 4.5) if levers else (7, 4.5))
    ax = axes[0, 0]
    for layout in [*LAYOUTS, *LEVERS]:
        rows = table[table["layout"] == layout]
        if rows.empty:
            continue
        color = COLORS[layout]
        ax.plot(rows["batch"], rows["modelled_mb"], "--", marker="_", markersize=14, color=color, alpha=0.6,
                label=f"{NAMES[layout]}, modelled")
        fits = rows[rows["outcome"] == "fits"]
        ax.plot(fits["batch"], fits["measured_mb"], "o-", color=color,
                label=f"{NAMES[layout]}, fits: tensors measured" if len(fits) else None)
        out = rows[rows["outcome"] == "out of memory"]
        why = ("on a CPU it has nothing to move" if layout == "fsdp+offload" and not rows["on_gpu"].any() else
               "at the modelled need")
        shift = 1.07 if layout in LEVERS else 1.0  # beside FSDP2's own cross where a lever models the same need
        ax.plot(out["batch"] * shift, out["modelled_mb"], "x", color=color, markersize=11, markeredgewidth=2.5,
                label=f"{NAMES[layout]}, out of memory ({why})" if len(out) else None)
    limits = table["limit_mb"].dropna().unique()
    for limit in limits:
        ax.axhline(float(limit), color="black", linewidth=1)
        ax.annotate(f"limit per rank {float(limit):.0f} MiB", (0.01, float(limit)), xycoords=("axes fraction", "data"),
                    va="bottom", fontsize=8)
    batches = sorted(table["batch"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    said = describe(largest_batches(table)).replace(", FSDP2", ",\nFSDP2")
    ax.set(xlabel="global batch (sequences)", ylabel="MiB per rank (busiest rank)",
           title=f"the largest batch under one limit: {said}")
    ax.title.set_fontsize(9)
    if levers:  # beside the plot: the levers' points sit low on the right
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize=8, loc="upper left")
    other = table[~table["outcome"].isin(["fits", "out of memory"])]
    add_notes(figure, [f"run {r.run_id} ({NAMES.get(r.layout, r.layout)}, batch {r.batch}): {r.outcome}"
                       for r in other.itertuples()])
    return figure


def lever_table(table: pd.DataFrame) -> pd.DataFrame:
    """FSDP2 and each lever, under the scan's limit: the largest batch that fitted (and the smallest that ran out), the
    last step's time there and sequences per second, and both against plain FSDP2's at its own largest batch. On a
    CPU, CPU offload has nothing to move: the shards it would send to the host are in host memory already."""
    found = largest_batches(table)
    rows = []
    for layout in ["fsdp", *(lever for lever in LEVERS if lever in found)]:
        entry = found[layout]
        fits = table[(table["layout"] == layout) & (table["outcome"] == "fits")]
        at = fits[fits["batch"] == entry["batch"]]
        step = float(at["step_s"].iloc[0]) if len(at) and pd.notna(at["step_s"].iloc[0]) else None
        cpu_only = not table.loc[table["layout"] == layout, "on_gpu"].any()
        rows.append({"layout": NAMES[layout], "largest_batch": entry["batch"], "smallest_out": entry["smallest_out"],
                     "step_s": step, "sequences_per_s": entry["batch"] / step if step and entry["batch"] else None,
                     "note": ("not applicable here: on a CPU the shards offload would move are in host memory "
                              "already" if layout == "fsdp+offload" and cpu_only else "")})
    result = pd.DataFrame(rows, columns=["layout", "largest_batch", "smallest_out", "step_s", "sequences_per_s", "note"])
    base = result.iloc[0] if len(result) else None
    if base is not None:
        result.insert(3, "batch_x", [b / base["largest_batch"] if b and base["largest_batch"] else None
                                     for b in result["largest_batch"]])
        result.insert(6, "speed_x", [v / base["sequences_per_s"] if v and base["sequences_per_s"] else None
                                     for v in result["sequences_per_s"]])
    result.attrs["basis"] = ("largest_batch: the largest of the scan's batches that fitted under the limit "
                             "(smallest_out: the smallest that ran out); step_s: the last step's seconds there; "
                             "batch_x and speed_x: against plain FSDP2's, one run each")
    return result
