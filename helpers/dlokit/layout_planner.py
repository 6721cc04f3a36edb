"""Which layout trains fastest? Every layout the kit runs, its memory per rank and its step time, ranked.

    hw = measured_hardware(peak_job, comm_job)            # this machine: comm_bench.py --measure peak and comm_bench.py's jobs
    hw = paper_hardware("H100-80GB")                       # or a cluster on paper: datasheet peak and link rates
    table = plan(config, world=2, memory_gib=6, hardware=hw, batch_size=8, seq_len=64)
    table.head()                                           # rank 1 first; a layout that does not fit has no rank
    candidates(table, top=3, slow=True)                    # what the notebook runs to check the ranking
    preview(table.iloc[0], profile="jean-zay", n_gpu=16)   # the batch script of the chosen layout
    paper_plans(config, "H100-80GB", [8, 64], batch_size=64, seq_len=2048)   # {GPUs: plan} on paper; shown_by_gpus

Every layout of train_llm.py (DDP, ZeRO-1, FSDP2 with and without resharding, HSDP, TP from scratch and DTensor's
with and without sequence parallel, FSDP x TP, the pipeline's schedules with their micro-batches, CP) with the memory
levers (activation checkpointing, gradient accumulation, FSDP2's CPU offload) and DeepSpeed's ZeRO 1-3
(train_deepspeed.py), each checked as its script checks it (llm_options.plan_degrees: divisibility, stages), at one
global batch. Memory: memory_model.estimate_for_run, as dlokit.gpu_plan counts it (DDP's gradient buckets added).
Step time: analysis/step_model.py. Only a layout that fits `memory_gib` gets a rank.
"""
from __future__ import annotations

import math
import shlex
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd

from dlokit import memory_model
from dlokit.analysis.bus_bandwidth import bandwidth_curve, bandwidth_table
from dlokit.analysis.run import load_run
from dlokit.analysis.step_model import Hardware, Layout, step_time
from dlokit.analysis.throughput import measured_peak
from dlokit.script_modules import common_module

LLM = Path(__file__).resolve().parents[2] / "tp_scripts" / "llm" / "solutions"
GIB = memory_model.GIB
# What a card gives the tensors the memory model counts: the CUDA context (and cuBLAS's workspace) and NCCL's
# buffers (parallel jobs) come off first, then a share for the caching allocator's fragmentation (dlokit.gpu_plan's).
MARGIN = {"cuda_context_gib": 1.0, "nccl_gib": 1.0, "allocator_share": 0.10}
ACCUMULATIONS = (1, 2, 4)
# Predicted steps this close are a tie for the step model (its inputs, the bench's bus bandwidths and the measured
# peak, are not known closer): within a tie the simpler layout ranks first (fewer levers, then base_layouts' order,
# DDP first), so that a rerun's slightly different bandwidths do not swap the pick between two layouts it cannot tell
# apart. (Session 21: PP gpipe m=2 predicted 0.8 % faster than DDP in one course run, 0.5 % slower in the next.)
TIE = 0.10
# Cluster targets on paper, from the datasheets: MFU's dense peaks (tp_scripts/llm/llm_kit/mfu.py), the GPU's NVLink
# (per direction: NVLink 4 on H100 SXM 900 GB/s both ways, NVLink 3 on A100 SXM 600), one InfiniBand NIC per GPU
# (DGX H100: ConnectX-7 NDR 400 Gb/s = 50 GB/s; DGX A100: HDR 200 Gb/s = 25 GB/s) and PCIe to the host (Gen5 x16
# 64 GB/s a direction, Gen4 32). Line rates: upper bounds of a bus bandwidth. Measure yours (comm_bench.py on the
# cluster, then measured_hardware) before you trust a close call.
PAPER = {
    "H100-80GB": {"gpu": "H100 SXM", "memory_gib": 80, "nvlink": 450e9, "network": 50e9, "host": 64e9},
    "A100-80GB": {"gpu": "A100", "memory_gib": 80, "nvlink": 300e9, "network": 25e9, "host": 32e9},
}


def measured_hardware(peak_run, comm_run, ranks_per_node: int | None = None) -> Hardware:
    """This cluster as its own jobs measured it: each rank's share of the matmul peak comm_bench.py --measure peak measured (every
    rank at once), and comm_bench.py's bus bandwidths; NCCL overlaps data-parallel collectives, gloo does not."""
    peak_run = load_run(peak_run) if isinstance(peak_run, str) else peak_run
    comm_run = load_run(comm_run) if isinstance(comm_run, str) else comm_run
    peak = measured_peak(peak_run)
    if peak.machine is None:
        raise ValueError(peak.basis)
    table = bandwidth_table(comm_run)
    cuda = comm_run.summary.get("device_type") == "cuda"
    per_rank = peak.machine / max(1, peak_run.world_size)
    return Hardware(name="this machine" if not cuda else "this node", peak_flops=per_rank,
                    busbw=bandwidth_curve(table), ranks_per_node=ranks_per_node or (1 << 30),
                    overlap=cuda, cuda=cuda,
                    basis=f"{peak.basis}; bus bandwidths of comm_bench.py run {comm_run.run_id} "
                          f"({table.attrs.get('backend')})")


def usable_gib(card_gib: float, ranks: int) -> float:
    """What the memory model's tensors may take of a card of `card_gib`, after MARGIN."""
    left = card_gib - MARGIN["cuda_context_gib"] - (MARGIN["nccl_gib"] if ranks > 1 else 0.0)
    return left * (1 - MARGIN["allocator_share"])


def memory_per_rank_gib(peak_run) -> float:
    """What the memory model's tensors may take on each rank of this machine, from comm_bench.py --measure peak's
    record: a GPU's memory after MARGIN, or on a CPU 90 % of the host's share of each rank."""
    run = load_run(peak_run) if isinstance(peak_run, str) else peak_run
    memory = float(run.summary.get("memory_bytes_per_rank") or 0) / GIB
    if not memory:
        raise ValueError(f"comm_bench.py --measure peak run {run.run_id} recorded no memory_bytes_per_rank ({run.state})")
    return usable_gib(memory, run.world_size) if run.summary.get("device_type") == "cuda" else 0.9 * memory


def paper_hardware(target: str = "H100-80GB", dtype: str = "bf16", ranks_per_node: int = 8) -> Hardware:
    """A cluster on paper: its datasheet peak for `dtype` and its links' line rates (PAPER)."""
    spec = PAPER[target]
    peak, why = common_module(LLM, "mfu").peak_for_name(spec["gpu"], "bf16" if dtype == "bf16" else "tf32")
    nvlink, network = spec["nvlink"], spec["network"]
    return Hardware(name=target, peak_flops=peak, busbw=lambda op, n, size: nvlink, ranks_per_node=ranks_per_node,
                    inter_node_busbw=lambda op, n, size: network, host_bw=spec["host"], overlap=True, cuda=True,
                    basis=f"on paper: {why}; NVLink {nvlink / 1e9:g} GB/s, network {network / 1e9:g} GB/s a GPU, "
                          f"{ranks_per_node} GPUs a node (datasheet line rates)")


# ---- every layout the kit runs -------------------------------------------------------------------------------

def _divisors(n: int) -> list[int]:
    return [d for d in range(2, n) if n % d == 0]


def base_layouts(world: int) -> list[Layout]:
    """train_llm.py's layouts on `world` ranks, and DeepSpeed's ZeRO stages (not yet checked against a model)."""
    w = world
    found = [Layout("DDP", dp_replicate=w, argv=("--mode", "ddp")),
             Layout("ZeRO-1", dp_replicate=w, zero=1, argv=("--mode", "zero1")),
             Layout("FSDP2", dp_shard=w, zero=3, argv=("--mode", "fsdp")),
             Layout("FSDP2 no-reshard", dp_shard=w, zero=3, reshard=False,
                    argv=("--mode", "fsdp", "--no-reshard-after-forward")),
             Layout("TP from scratch", tp=w, argv=("--mode", "tp-scratch")),
             Layout("TP (DTensor)", tp=w, argv=("--mode", "tp")),
             Layout("TP + SP", tp=w, sequence_parallel=True, argv=("--mode", "tp", "--sequence-parallel")),
             Layout("CP", cp=w, zero=3, argv=("--mode", "cp"))]
    found += [Layout(f"HSDP {r}x{w // r}", dp_replicate=r, dp_shard=w // r, zero=3,
                     argv=("--mode", "hsdp", "--dp-replicate", str(r))) for r in _divisors(w) if w // r >= 2]
    found += [Layout(f"FSDP2 x TP {t}", dp_shard=w // t, tp=t, zero=3, argv=("--mode", "fsdp-tp", "--tp", str(t)))
              for t in _divisors(w) if t <= 8]
    found.append(Layout("PP naive", pp=w, pp_schedule="naive", argv=("--mode", "pp", "--pp-schedule", "naive")))
    for schedule in ("gpipe", "1f1b", "interleaved"):
        for m in (w, 2 * w, 4 * w):
            v = 2 if schedule == "interleaved" else 1
            found.append(Layout(f"PP {schedule} m={m}", pp=w, pp_schedule=schedule, microbatches=m, virtual=v,
                                argv=("--mode", "pp", "--pp-schedule", schedule, "--microbatches", str(m),
                                      *(("--pp-virtual", "2") if v > 1 else ()))))
    found += [Layout(f"DeepSpeed ZeRO-{s}", dp_replicate=w if s < 3 else 1, dp_shard=w if s == 3 else 1, zero=s,
                     script="train_deepspeed.py", argv=("--zero-stage", str(s))) for s in (1, 2, 3)]
    return found


def with_levers(layout: Layout) -> list[Layout]:
    """The layout, and with each combination of train_llm.py's memory levers it accepts."""
    if layout.script != "train_llm.py":
        return [layout]
    found = []
    for ac in (False, True):
        for k in ACCUMULATIONS if layout.pp == 1 else (1,):
            for offload in (False, True) if layout.zero >= 3 else (False,):
                levers = [name for name, on in (("AC", ac), (f"accum {k}", k > 1), ("offload", offload)) if on]
                argv = (*layout.argv, *(("--activation-checkpointing",) if ac else ()),
                        *(("--grad-accum", str(k)) if k > 1 else ()), *(("--cpu-offload",) if offload else ()))
                found.append(replace(layout, name=" + ".join([layout.name, *levers]), activation_checkpointing=ac,
                                     grad_accum=k, cpu_offload=offload, argv=argv))
    return found


def _record(config: dict, layout: Layout, batch_size: int, seq_len: int, dtype: str) -> dict | None:
    """The run record's config this layout's job would write, or None where its script refuses the options."""
    argv = [*layout.argv, "--batch-size", str(batch_size), "--seq-len", str(seq_len), "--dtype", dtype]
    if layout.script == "train_deepspeed.py":
        if batch_size % layout.world:
            return None
        stage = layout.zero
        bucket = int(sum(memory_model.parameter_counts(config).values()) // 32)  # train_deepspeed.BUCKET_SHARE
        return {"model": config, "batch_size": batch_size, "seq_len": seq_len, "dtype": dtype, "dp": layout.world,
                "data_parallel": "deepspeed", "zero_stage": stage,
                "ds_config": {"zero_optimization": {"reduce_bucket_size": bucket}}}
    options = common_module(LLM, "llm_options")
    try:
        args = options.parse_args(argv)
        dims = options.plan_degrees(args, memory_model._config(config), layout.world)
    except (options.ArgumentsError, SystemExit):
        return None
    return {**vars(args), **dims.degrees(), "model": config}


def need_gib(record: dict, cuda: bool) -> float:
    """GiB per rank: the memory model, with DDP's gradient buckets (a copy of the gradients) as gpu_plan counts them."""
    need = memory_model.estimate_for_run(record, cuda=cuda).total
    if record.get("data_parallel") in ("ddp", "zero1"):
        need += 4 * memory_model.params_on_rank(record["model"], int(record.get("tp") or 1), int(record.get("pp") or 1))
    return need / GIB


def plan(config, *, world: int, memory_gib: float, hardware: Hardware, batch_size: int, seq_len: int,
         dtype: str = "fp32", levers: bool = True) -> pd.DataFrame:
    """Every layout on `world` ranks at a global batch of `batch_size` x `seq_len`: its memory per rank, predicted
    step time (and its parts), tokens/s; `rank` 1, 2 ... by step time among those within `memory_gib` per rank, the
    simpler first among steps within TIE of each other (column `tie`)."""
    config = dict(config) if isinstance(config, dict) else asdict(config)
    rows = []
    for order, base in enumerate(base_layouts(world)):
        for layout in with_levers(base) if levers else [base]:
            record = _record(config, layout, batch_size, seq_len, dtype)
            if record is None:
                continue
            need = need_gib(record, hardware.cuda)
            t = step_time(config, layout, batch_size=batch_size, seq_len=seq_len, hardware=hardware, dtype=dtype)
            rows.append({"layout": layout.name, "base": base.name, "script": layout.script, "options": shlex.join(layout.argv),
                         "degrees": f"dp {layout.dp} tp {layout.tp} pp {layout.pp} cp {layout.cp}",
                         "memory_gib": need, "fits": need <= memory_gib, "step_s": t.total, "compute_s": t.compute,
                         "exposed_comm_s": t.exposed, "bubble_s": t.bubble, "offload_s": t.offload,
                         "tokens_per_s": batch_size * seq_len / t.total, "levers": layout.name.count(" + ") - base.name.count(" + "),
                         "order": order, "layout_object": layout})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table = table.sort_values(["fits", "step_s", "levers"], ascending=[False, True, True],
                              kind="stable").reset_index(drop=True)
    table["tie"] = ties(table["step_s"], table["fits"])
    # within a tie the simpler first (fewer levers: the model gives accumulation no cost, a smaller matmul has one)
    table = table.sort_values(["fits", "tie", "levers", "order", "step_s"], ascending=[False, True, True, True, True],
                              kind="stable").reset_index(drop=True)
    table.insert(0, "rank", [i + 1 if fit else None for i, fit in enumerate(table["fits"])])
    table["rank"] = table["rank"].astype("Int64")
    table.attrs.update(hardware=hardware.name, basis=hardware.basis, world=world, memory_gib=memory_gib,
                       batch_size=batch_size, seq_len=seq_len, dtype=dtype)
    return table


def ties(steps: pd.Series, fits: pd.Series) -> list[int]:
    """A tie number per row (rows sorted by step time, those that fit first): each tie starts at the fastest step not
    yet in one and holds every step within TIE of it."""
    found, tie, start = [], -1, None
    for step, fit in zip(steps, fits):
        if start is None or step > start * (1 + TIE) or not fit:
            tie, start = tie + 1, step
        found.append(tie)
    return found


def best_per_layout(table: pd.DataFrame) -> pd.DataFrame:
    """Each layout's first row: its fastest variant that fits (levers included), else its smallest need."""
    fitting = table[table["fits"]].drop_duplicates("base")
    rest = table[~table["base"].isin(fitting["base"])].sort_values("memory_gib").drop_duplicates("base")
    view = pd.concat([fitting, rest]).reset_index(drop=True)
    view.attrs.update(table.attrs)
    return view


def shown(table: pd.DataFrame, top: int = 12, per_layout: bool = True) -> pd.DataFrame:
    """The first `top` rows (per_layout: each layout's best variant only), in ms and GiB, for a notebook."""
    columns = ["rank", "layout", "script", "degrees", "memory_gib", "fits", "step_s", "compute_s", "exposed_comm_s",
               "bubble_s", "tokens_per_s"]
    view = (best_per_layout(table) if per_layout else table)[columns].head(top).copy()
    for column in ("step_s", "compute_s", "exposed_comm_s", "bubble_s"):
        view[column.replace("_s", "_ms")] = view.pop(column) * 1e3
    view.attrs.update(table.attrs)
    return view.round(3)


def candidates(table: pd.DataFrame, top: int = 3, slow: bool = True, script: str = "train_llm.py") -> pd.DataFrame:
    """What to run to check the ranking: the `top` fastest fitting layouts of `script`, and (slow) the slowest
    fitting one without levers, predicted far behind."""
    ranked = best_per_layout(table[table["fits"] & (table["script"] == script)])
    chosen = ranked.head(top)
    if slow:
        plain = ranked[(ranked["levers"] == 0) & ~ranked["base"].isin(chosen["base"])]
        chosen = pd.concat([chosen, plain.tail(1)])
    chosen = chosen.reset_index(drop=True)
    chosen["argv"] = [shlex.split(options) for options in chosen["options"]]  # day.command(None, *argv)
    chosen.attrs.update(table.attrs)
    return chosen


def preview(row, *, profile: str, n_gpu: int, time_max: str = "00:30:00", account: str | None = None,
            name: str = "plan", config: str = "1b", steps: int = 100) -> str:
    """The batch script a chosen layout's job would get on `profile` (dlokit preview's, nothing submitted)."""
    from dlokit.submission import profiles
    from dlokit.submission.jobspec import JobSpec, sbatch_preview

    a = row.attrs if hasattr(row, "attrs") and row.attrs else {}
    chosen = profiles.get_profile(profile, **({"account": account} if account else {}))
    _same_gpu(a.get("target"), chosen)
    command = [row["script"], *shlex.split(row["options"]), "--config", config, "--steps", str(steps),
               *(["--batch-size", str(a["batch_size"]), "--seq-len", str(a["seq_len"]), "--dtype", a["dtype"]]
                 if a else [])]  # the plan's sizes and dtype: its memory holds for these
    spec = JobSpec.from_command(command, name=name, n_gpu=n_gpu, time_max=time_max)
    return sbatch_preview(spec, chosen)


def _same_gpu(target: str | None, profile) -> None:
    """A plan's memory and step hold for its GPU: refuse a batch script whose --constraint asks Slurm for another."""
    asked = (profile.constraint or "").lower()
    models = {name.split("-")[0].lower() for name in PAPER}
    named = [model for model in models if model in asked]
    if target and named and target.split("-")[0].lower() not in named:
        raise ValueError(f"the plan is for {target}, but profile {profile.name!r} asks Slurm for --constraint={asked}: "
                         f"plan for its GPU ({', '.join(t for t in PAPER if t.split('-')[0].lower() in named)}) or "
                         f"choose a profile whose nodes have {target.split('-')[0]}")


def on_paper(config, target: str = "H100-80GB", gpus: int = 8, *, batch_size: int, seq_len: int,
             dtype: str = "bf16", ranks_per_node: int = 8) -> pd.DataFrame:
    """The plan for a cluster-sized target: `gpus` GPUs of `target` (PAPER), their usable memory as gpu_plan counts
    it (the CUDA context, NCCL's buffers and the allocator's share off)."""
    hardware = paper_hardware(target, dtype, ranks_per_node)
    usable = usable_gib(PAPER[target]["memory_gib"], gpus)
    table = plan(config, world=gpus, memory_gib=usable, hardware=hardware, batch_size=batch_size, seq_len=seq_len,
                 dtype=dtype)
    table.attrs.update(target=target, gpus=gpus)
    return table


def paper_plans(config, target: str, gpu_counts, *, batch_size: int, seq_len: int) -> dict[int, pd.DataFrame]:
    """on_paper at each count of `gpu_counts`: {GPUs: plan}."""
    return {gpus: on_paper(config, target, gpus, batch_size=batch_size, seq_len=seq_len) for gpus in gpu_counts}


def shown_by_gpus(plans: dict, top: int = 5) -> pd.DataFrame:
    """shown() of each plan of paper_plans, one under the other, indexed by (GPUs, row)."""
    return pd.concat({gpus: shown(table, top=top) for gpus, table in plans.items()}, names=["GPUs", "row"])


def tokens_per_s(table: pd.DataFrame) -> float:
    ranked = table[table["fits"]]
    return float(ranked["tokens_per_s"].iloc[0]) if len(ranked) else math.nan


def predicted_step(config, *, target: str = "H100-80GB", batch_size: int, seq_len: int, dp: int = 1, zero: int = 0,
                   tp: int = 1, pp: int = 1, cp: int = 1, microbatches: int = 1, precision: str = "bf16-mixed",
                   activation_checkpointing: bool = False, **_) -> str:
    """The step model's time for a layout of memory_model.calculator's options on `target` (PAPER), in a sentence."""
    config = dict(config) if isinstance(config, dict) else asdict(config)
    dtype = "fp32" if precision == "fp32" else "bf16"
    layout = Layout("calculator", dp_replicate=dp if zero < 3 else 1, dp_shard=dp if zero >= 3 else 1, tp=tp, pp=pp,
                    cp=cp, zero=zero, pp_schedule="1f1b", microbatches=microbatches,
                    activation_checkpointing=activation_checkpointing)
    hardware = paper_hardware(target, dtype, ranks_per_node=8)
    t = step_time(config, layout, batch_size=batch_size * dp, seq_len=seq_len, hardware=hardware, dtype=dtype)
    tokens = batch_size * dp * seq_len / t.total
    return (f"predicted step on {layout.world} x {target} ({dtype}): {1e3 * t.total:.0f} ms = compute "
            f"{1e3 * t.compute:.0f} + exposed communication {1e3 * t.exposed:.0f} + bubble {1e3 * t.bubble:.0f}; "
            f"{tokens:,.0f} tokens/s (on paper: datasheet peak and line rates)")


def refused(config, *, world: int, batch_size: int, seq_len: int, dtype: str = "fp32") -> list[tuple[str, str]]:
    """The layouts (without levers) whose script refuses these sizes on `world` ranks, each with the script's reason
    (llm_options.plan_degrees' message: the degrees the model's shapes do not divide into, ...)."""
    config = dict(config) if isinstance(config, dict) else asdict(config)
    options = common_module(LLM, "llm_options")
    found = []
    for layout in base_layouts(world):
        if layout.script == "train_deepspeed.py":
            if batch_size % layout.world:
                found.append((layout.name, f"--batch-size {batch_size} is not divisible by the {layout.world} ranks"))
            continue
        argv = [*layout.argv, "--batch-size", str(batch_size), "--seq-len", str(seq_len), "--dtype", dtype]
        try:
            options.plan_degrees(options.parse_args(argv), memory_model._config(config), world)
        except options.ArgumentsError as err:
            found.append((layout.name, str(err)))
        except SystemExit:
            found.append((layout.name, f"train_llm.py's parser refuses {shlex.join(argv)}"))
    return found
