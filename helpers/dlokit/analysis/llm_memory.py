"""Day 4: what each rank holds, modelled (dlokit.memory_model) and measured (train_llm.py's tensors).

    memory_comparison(["1234", "1235", ...])   # one row per run and source (modelled, measured), MiB
    memory_plot(["1234", "1235", ...])         # per run: a modelled and a measured bar, stacked by category
    rank_memory_plot(["1234", "1235", ...])    # per run: a measured bar for every rank (pipeline stages differ)

train_llm.py measures each rank's parameters, gradients, optimizer states and peak saved activations
from the tensors themselves (summary `memory_bytes`, see tp_scripts/llm/llm_kit/memory_meter.py), and so does
train_deepspeed.py where DeepSpeed's engine keeps them (its gradients at their peak in backward, its optimizer states
with the fp32 master copy); the busiest rank (largest measured total) stands for the run. The model is estimate_for_run() on the run's config.
"""
from __future__ import annotations

import pandas as pd

from dlokit.analysis.figures import add_notes, message_figure, new_figure
from dlokit.analysis.run import COMPLETED, load_runs
from dlokit.memory_model import estimate_for_run

MIB = 1024**2
CATEGORIES = ("params", "grads", "optimizer", "activations", "gathered")
COLORS = {"params": "tab:blue", "grads": "tab:orange", "optimizer": "tab:green", "activations": "tab:red",
          "gathered": "tab:gray"}
LABELS = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer states",
          "activations": "activations (peak saved)", "gathered": "gathered weights (FSDP)"}


def mode_label(run) -> str:
    """'fsdp', 'fsdp no-reshard = ZeRO-2', 'zero1', 'hsdp 2x2', ... with the options that change memory. FSDP2 that
    keeps each block's weights gathered from its forward to its backward holds, at its peak, what ZeRO-2 holds: the
    whole weights, the gradients and the optimizer states as shards (torchtitan's docs call it ZeRO-2)."""
    config = run.config
    label = str(config.get("mode", "?"))
    if config.get("mode") == "deepspeed":
        label = f"DeepSpeed ZeRO-{config.get('zero_stage')}" + (" offload" if config.get("offload_optimizer") else "")
    if config.get("mode") == "hsdp":
        label += f" {config.get('dp_replicate')}x{config.get('dp_shard')}"
    if config.get("no_reshard_after_forward") and config.get("data_parallel") in ("fsdp", "hsdp"):
        label += " no-reshard" + (" = ZeRO-2" if config.get("mode") == "fsdp" else "")
    if config.get("activation_checkpointing"):
        label += " +AC"
    if config.get("dtype", "fp32") != "fp32":
        label += f" {config['dtype']}"
    return f"{label} ×{run.world_size}" if run.world_size > 1 else label


def _per_rank(run) -> dict:
    """{rank: memory_bytes in the view's categories}, for the ranks that measured theirs."""
    found = {}
    for rank, record in sorted(run.ranks.items()):
        memory = (record.get("summary") or {}).get("memory_bytes")
        if isinstance(memory, dict) and memory.get("params") is not None:
            row = {"params": memory.get("params"), "grads": memory.get("grads"), "optimizer": memory.get("optimizer"),
                   "activations": memory.get("activations_peak"), "gathered": memory.get("gathered_params_peak")}
            found[rank] = {k: float(v or 0) for k, v in row.items()}
    return found


def _measured(run) -> dict | None:
    """The busiest rank's memory_bytes (largest total), in the view's categories."""
    found = list(_per_rank(run).values())
    return max(found, key=lambda row: sum(row.values())) if found else None


def _modelled(run) -> dict | None:
    try:
        b = estimate_for_run(run.config)
    except (KeyError, TypeError, ValueError):
        return None
    # DeepSpeedMemory does not look inside the blocks: ZeRO-3's gathered weights are not measured, nor modelled here
    gathered = 0.0 if run.config.get("data_parallel") == "deepspeed" else b.gathered
    return {"params": b.weights, "grads": b.gradients, "optimizer": b.optimizer, "activations": b.activations,
            "gathered": gathered}


def _states(values: dict) -> float:
    return values["params"] + values["grads"] + values["optimizer"]


def memory_comparison(runs, runs_dir=None) -> pd.DataFrame:
    """Per run, two rows (source 'modelled' and 'measured') of MiB per rank by category, the total, and
    on the measured row the ratio measured / modelled of the model states (params + grads + optimizer)."""
    rows, dtypes = [], set()
    for run in load_runs(runs, runs_dir):
        dtypes.add(str(run.config.get("dtype") or "fp32"))
        measured, modelled = _measured(run), _modelled(run)
        base = {"run_id": run.run_id, "mode": mode_label(run), "world_size": run.world_size, "state": run.state}
        for source, values in (("modelled", modelled), ("measured", measured)):
            row = {**base, "source": source, **{c: (values[c] / MIB if values else None) for c in CATEGORIES}}
            row["total"] = sum(row[c] for c in CATEGORIES) if values else None
            rows.append(row)
        rows[-1]["states_ratio"] = _states(measured) / _states(modelled) if measured and modelled else None
    columns = ["run_id", "mode", "world_size", "state", "source", *CATEGORIES, "total", "states_ratio"]
    table = pd.DataFrame(rows, columns=columns)
    table.attrs["basis"] = (f"MiB per rank, the tensors each rank holds ({', '.join(sorted(dtypes))}); gathered: FSDP's "
                            "weights gathered for a block's forward or backward at their largest; states_ratio: "
                            "measured over modelled params + grads + optimizer")
    return table


def memory_plot(runs, runs_dir=None):
    """Grouped bars, one group per run: modelled and measured MiB per rank, stacked by category."""
    table = memory_comparison(runs, runs_dir)
    shown = table.groupby("run_id", sort=False).filter(lambda g: g["total"].notna().all())
    notes = [f"run {r.run_id} ({r.mode}): {r.state}, no memory measured" for r in
             table[table["source"] == "measured"].itertuples() if pd.isna(r.total)]
    notes += [f"run {r.run_id}: {r.state}" for r in table[table["source"] == "measured"].itertuples()
              if r.state != COMPLETED and pd.notna(r.total)]
    if shown.empty:
        return message_figure(notes or ["no runs"], title="memory per rank: modelled vs measured")
    figure, axes = new_figure(size=(max(6.0, 1.6 * shown["run_id"].nunique() + 2) + 2.0, 4.5))
    ax = axes[0, 0]
    ticks, names = [], []
    for group, (run_id, rows) in enumerate(shown.groupby("run_id", sort=False)):
        for offset, source in ((-0.2, "modelled"), (0.2, "measured")):
            row = rows[rows["source"] == source].iloc[0]
            bottom = 0.0
            for category in CATEGORIES:
                value = row[category] or 0.0
                ax.bar(group + offset, value, 0.38, bottom=bottom, color=COLORS[category],
                       hatch="//" if source == "modelled" else None, edgecolor="white",
                       label=LABELS[category] if group == 0 and source == "measured" else None)
                bottom += value
            ax.text(group + offset, bottom, "model" if source == "modelled" else "meas.", ha="center",
                    va="bottom", fontsize=7)
        ticks.append(group)
        names.append(f"{rows['mode'].iloc[0]}\n{run_id}")
    ax.set_xticks(ticks, names, fontsize=8)
    ax.set(ylabel="MiB per rank (busiest rank)", title="memory per rank: modelled (hatched) vs measured")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.08)  # room for the bars' labels
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the plot: the first run is the tallest
    add_notes(figure, notes)
    return figure


def model_config(scripts, name: str) -> dict:
    """A model config of the Day 4 scripts (`CONFIGS[name]` of llm_kit/model.py, their shared package), as a dict: the
    memory model takes it."""
    from dataclasses import asdict

    from ..script_modules import common_module

    return asdict(common_module(scripts, "model").get_config(name))


def layout_need_mb(config: dict, layout: str, *, ranks: int, batch_size: int, seq_len: int,
                   dtype: str = "fp32", activation_checkpointing: bool = False, grad_accum: int = 1,
                   cpu_offload: bool = False, cuda: bool = False) -> float:
    """What one rank needs, from the memory model, in MiB: fp32 weights, AdamW, computing in `dtype` (train_llm.py's
    --dtype), `batch_size` sequences in all (global), under DDP ("ddp": its gradient buckets included, 4 bytes a
    weight, a copy of the gradients the all-reduce works on, which the per-rank model leaves out) or FSDP2 ("fsdp"),
    with the memory levers train_llm.py has: activation checkpointing, gradient accumulation (--grad-accum), FSDP2's
    CPU offload (give it only where the device is not the host: on a CPU the offloaded shards stay in the memory the
    limit counts); cuda: on a GPU, with AdamW's foreach temporaries (memory_model.estimate's cuda)."""
    from dlokit.memory_model import estimate, params_on_rank

    zero = {"ddp": 0, "fsdp": 3}[layout]
    need = estimate(config, batch_size=max(1, batch_size // ranks), seq_len=seq_len, dp=ranks, zero=zero,
                    precision="fp32" if dtype == "fp32" else "bf16-amp", optimizer="adamw",
                    activation_checkpointing=activation_checkpointing, grad_accum=grad_accum,
                    cpu_offload=cpu_offload, cuda=cuda).total / MIB
    return need + (4 * params_on_rank(config) / MIB if layout == "ddp" else 0.0)


def oom_demo_limit_mb(config: dict, *, ranks: int, batch_size: int, seq_len: int, dtype: str = "fp32") -> dict:
    """TP4.2: each rank's memory limit between what FSDP and DDP need per rank (layout_need_mb): {"ddp_mb",
    "fsdp_mb", "limit_mb"}, the limit at their geometric mean (as far from each, in ratio). Measured on the oom-demo
    config with 2 CPU ranks: FSDP needed 0.94-0.97 GB, DDP 1.7-1.9 GB, against 0.87 and 1.82 modelled."""
    if batch_size < ranks or batch_size % ranks:  # what train_llm.py refuses: no job of this batch would run
        raise ValueError(f"--batch-size {batch_size} does not split over {ranks} ranks: give a multiple of {ranks} "
                         f"(e.g. {ranks}, one sequence per rank)")
    ddp, fsdp = (layout_need_mb(config, layout, ranks=ranks, batch_size=batch_size, seq_len=seq_len, dtype=dtype)
                 for layout in ("ddp", "fsdp"))
    return {"ddp_mb": ddp, "fsdp_mb": fsdp, "limit_mb": round((ddp * fsdp) ** 0.5)}


def rank_memory_table(runs, runs_dir=None) -> pd.DataFrame:
    """One row per run and rank: what that rank measured holding, MiB by category, and its total."""
    rows = []
    for run in load_runs(runs, runs_dir):
        for rank, values in _per_rank(run).items():
            row = {"run_id": run.run_id, "mode": mode_label(run), "rank": rank,
                   **{c: values[c] / MIB for c in CATEGORIES}}
            rows.append({**row, "total": sum(row[c] for c in CATEGORIES)})
    return pd.DataFrame(rows, columns=["run_id", "mode", "rank", *CATEGORIES, "total"])


def rank_memory_plot(runs, runs_dir=None):
    """A bar per rank, grouped by run, stacked by category: every rank, not only the busiest (the stages of a
    pipeline, the partitions of ZeRO, the shards of FSDP hold different amounts)."""
    runs = load_runs(runs, runs_dir)
    table = rank_memory_table(runs)
    notes = [f"run {run.run_id}: {run.state}, no memory measured" for run in runs
             if run.run_id not in set(table["run_id"])]
    if table.empty:
        return message_figure(notes or ["no runs"], title="memory of every rank")
    figure, axes = new_figure(size=(max(6.0, 0.45 * len(table) + 3), 4.5))
    ax = axes[0, 0]
    positions, names, x = [], [], 0.0
    for group, (run_id, rows) in enumerate(table.groupby("run_id", sort=False)):
        for row in rows.itertuples():
            bottom = 0.0
            for category in CATEGORIES:
                value = getattr(row, category)
                ax.bar(x, value, 0.8, bottom=bottom, color=COLORS[category], edgecolor="white",
                       label=LABELS[category] if not positions else None)
                bottom += value
            positions.append(x)
            names.append(f"r{row.rank}" + (f"\n{row.mode}\n{run_id}" if row.rank == rows["rank"].iloc[0] else ""))
            x += 1.0
        x += 0.8  # a gap between runs
    ax.set_xticks(positions, names, fontsize=7)
    ax.set(ylabel="MiB (measured)", title="memory of every rank, by what it holds")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    add_notes(figure, notes)
    return figure


def offload_table(runs, runs_dir=None) -> pd.DataFrame:
    """DeepSpeed runs (train_deepspeed.py), one row each: the device the model trained on, this rank's optimizer
    states (MiB, the busiest rank's) and how many of them sat on the host (`offload_optimizer: cpu`), and a note: on
    a machine without a GPU the states are on the host already, and offload has nothing to move."""
    rows = []
    for run in load_runs(runs, runs_dir):
        found = [(r.get("summary") or {}).get("memory_bytes") or {} for r in run.ranks.values()]
        found = [m for m in found if m.get("optimizer") is not None]
        busiest = max(found, key=lambda m: m["optimizer"]) if found else {}
        gpus = run.on_gpu
        offload = bool(run.config.get("offload_optimizer"))
        note = ("" if not offload else "not applicable here: the model trains on the CPU, its optimizer states are on the "
                "host already (nothing to move)" if not gpus else "the states and their step on the host")
        rows.append({"run_id": run.run_id, "mode": mode_label(run), "state": run.state,
                     "device": "GPU" if gpus else "CPU", "optimizer": busiest.get("optimizer", float("nan")) / MIB,
                     "on_host": busiest.get("optimizer_offloaded", float("nan")) / MIB, "note": note})
    return pd.DataFrame(rows, columns=["run_id", "mode", "state", "device", "optimizer", "on_host", "note"])
