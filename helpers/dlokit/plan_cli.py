"""`dlokit plan`: which layout to submit on a cluster, on paper, in a terminal.

    dlokit plan --config 1b --n-gpu 64 --profile jean-zay                 # A100s (the profile's constraint), 80 GiB
    dlokit plan --config 3b --n-gpu 16 --gpu H100 --gpu-memory 80 --profile jean-zay   # H100s on paper, 8 a node
    dlokit plan --config 3b --n-gpu 16 --profile jean-zay --preview --account abc@a100   # the script for its A100s
    dlokit plan --config 1b --n-gpu 16 --profile jean-zay --peak-job 1234 --comm-job 1235   # measured there (TP4.9)

Every layout the kit runs (layout_planner.plan) at one global batch: the layouts that fit ranked by predicted step
time (each layout's fastest variant, memory levers included), then those that fit nowhere with what they need, then
those whose script refuses these sizes with its reason. The basis of every number is printed first: the datasheet's
peak and the links' line rates when nothing was measured, else the cluster's own comm_bench.py jobs (--peak-job, the
matmul peak; --comm-job, the bus bandwidths), and the memory model. `--preview [N]` prints the batch script of the N-th
layout (default the first) as `dlokit preview` would (nothing is submitted).
"""
from __future__ import annotations

import argparse
import sys

import pandas as pd

from . import layout_planner, memory_model
from .analysis.llm_memory import model_config
from .analysis.run import load_run
from .submission import profiles

DEFAULT_RANKS_PER_NODE = 8  # a profile whose gpus_per_node is "auto" (this machine): a DGX-like node


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="1b", help="Day 4's model config (tp_scripts/llm/llm_kit/model.py): "
                        "125m, 1b, 3b, ...")
    parser.add_argument("--n-gpu", type=int, default=8, help="GPUs of the job (its world size)")
    parser.add_argument("--profile", default="jean-zay", help="the cluster's profile: GPUs a node, their model")
    parser.add_argument("--gpu", help="GPU model on paper: " + ", ".join(_gpus()) + " (default: the profile's "
                        "constraint)")
    parser.add_argument("--gpu-memory", type=float, help="GiB of each GPU (default: the datasheet's)")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch, in sequences")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--top", type=int, default=12, help="layouts shown that fit")
    parser.add_argument("--preview", nargs="?", type=int, const=1, metavar="N",
                        help="print the batch script of the N-th layout (default 1)")
    parser.add_argument("--account", help="Slurm account, for --preview on profiles that need one")
    parser.add_argument("--time", default="00:30:00", help="--preview's time limit HH:MM:SS")
    parser.add_argument("--steps", type=int, default=100, help="--preview's training steps")
    parser.add_argument("--peak-job", help="a comm_bench.py --measure peak job on the cluster: its matmul peak")
    parser.add_argument("--comm-job", help="a comm_bench.py job on the cluster: its bus bandwidths")
    parser.add_argument("--runs", help="where those jobs' records are (default: the profile's runs folder)")


def _gpus() -> list[str]:
    return sorted({target.split("-")[0] for target in layout_planner.PAPER})


def target_of(gpu: str | None, profile: profiles.Profile) -> str:
    """The PAPER entry of `gpu` (or of the profile's constraint, e.g. jean-zay's 'a100'); ValueError if none."""
    wanted = (gpu or profile.constraint or "").upper()
    found = [target for target in layout_planner.PAPER if target.split("-")[0] == wanted]
    if not found:
        said = f"--gpu {gpu}" if gpu else f"profile {profile.name!r}'s constraint {profile.constraint!r}"
        raise ValueError(f"{said} names no GPU on paper: pass --gpu {' or '.join(_gpus())}")
    return found[0]


def ranks_per_node(profile: profiles.Profile) -> int:
    per_node = profile.gpus_per_node
    return per_node if isinstance(per_node, int) and per_node > 0 else DEFAULT_RANKS_PER_NODE


def _hardware(args, profile, target: str, per_node: int):
    """(the step model's hardware, what was measured in words or ''): the jobs' records, else the datasheet's."""
    if not (args.peak_job or args.comm_job):
        return layout_planner.paper_hardware(target, args.dtype, per_node), ""
    if not (args.peak_job and args.comm_job):
        raise ValueError("--peak-job and --comm-job go together: the peak and the bus bandwidths of one cluster")
    runs = args.runs or profile.runs
    peak, comm = load_run(args.peak_job, runs), load_run(args.comm_job, runs)
    for run in (peak, comm):
        if run.state != "completed":
            raise ValueError(f"job {run.run_id} in {runs}: {run.describe_state()}")
    hardware = layout_planner.measured_hardware(peak, comm, per_node)
    words = f"jobs {peak.run_id} and {comm.run_id}"
    if args.n_gpu > comm.world_size:
        words += (f"; collectives timed on {comm.world_size} ranks at most: larger groups, and groups across nodes, are "
                  "taken at the bus bandwidth of the largest group measured")
    return hardware, words


def make_plan(args) -> tuple[pd.DataFrame, list, str]:
    """(the planner's table, the layouts refused with why, the basis of its numbers in words)."""
    if args.n_gpu < 2:
        raise ValueError(f"--n-gpu {args.n_gpu}: a layout needs at least 2 GPUs")
    profile = profiles.get_profile(args.profile, required=())  # the node's shape: no account needed to plan
    target = target_of(args.gpu, profile)
    config = model_config(layout_planner.LLM, args.config)
    per_node = ranks_per_node(profile)
    hardware, measured = _hardware(args, profile, target, per_node)
    card = args.gpu_memory or layout_planner.PAPER[target]["memory_gib"]
    usable = layout_planner.usable_gib(card, args.n_gpu)
    table = layout_planner.plan(config, world=args.n_gpu, memory_gib=usable, hardware=hardware,
                                batch_size=args.batch_size, seq_len=args.seq_len, dtype=args.dtype)
    refused = layout_planner.refused(config, world=args.n_gpu, batch_size=args.batch_size, seq_len=args.seq_len,
                                     dtype=args.dtype)
    margin = layout_planner.MARGIN
    weights = sum(memory_model.parameter_counts(config).values())
    nodes = -(-args.n_gpu // per_node)
    basis = "\n".join([
        f"dlokit plan: {args.config} ({weights / 1e9:.2f} B weights) on {args.n_gpu} x {target.split('-')[0]} of "
        f"profile {profile.name} ({per_node} a node: {nodes} node(s)), global batch {args.batch_size} x "
        f"{args.seq_len} tokens, {args.dtype}",
        f"basis of every number ({'measured: ' + measured if measured else 'nothing measured'}):",
        f"  step time: {hardware.basis}",
        "    = compute (FLOPs / peak) + exposed communication (bytes / bus bandwidth) + pipeline bubble (+ offload);",
        "    not counted: kernel launches, matmuls below the peak, the optimizer step, the data (a lower bound);",
        f"    steps within {layout_planner.TIE:.0%} of each other are a tie: the simpler layout ranks first",
        f"  memory per rank: the memory model (memory_model.estimate_for_run, DDP's buckets added); "
        f"{card:g} GiB a GPU ({'given' if args.gpu_memory else 'datasheet'}), {usable:.1f} usable after the CUDA "
        f"context {margin['cuda_context_gib']:g} GiB, NCCL {margin['nccl_gib']:g} GiB and the allocator's "
        f"{margin['allocator_share']:.0%}",
        *([] if measured else ["  measure before trusting a close call: comm_bench.py on the cluster (TP4.9), then "
                               "--peak-job and --comm-job"])])
    table.attrs["target"] = target  # the GPU the plan holds for: --preview refuses a profile that asks for another
    return table, refused, basis


def ranking(table: pd.DataFrame) -> pd.DataFrame:
    """Each layout's fastest fitting variant, numbered 1, 2 ... by predicted step time."""
    best = layout_planner.best_per_layout(table)
    ranked = best[best["fits"]].reset_index(drop=True)
    ranked.index = ranked.index + 1
    return ranked


def text(table: pd.DataFrame, refused: list, basis: str, top: int = 12) -> str:
    """The report `dlokit plan` prints."""
    lines = [basis, ""]
    usable = table.attrs.get("memory_gib", float("nan"))
    ranked = ranking(table) if len(table) else table
    if len(ranked):
        view = pd.DataFrame({"layout": ranked["layout"], "GiB/rank": ranked["memory_gib"].round(1),
                             "step ms": (1e3 * ranked["step_s"]).round(1),
                             "compute ms": (1e3 * ranked["compute_s"]).round(1),
                             "exposed comm ms": (1e3 * ranked["exposed_comm_s"]).round(1),
                             "bubble ms": (1e3 * ranked["bubble_s"]).round(1),
                             "tokens/s": ranked["tokens_per_s"].map("{:,.0f}".format),
                             "degrees": ranked["degrees"]}).head(top)
        view.index.name = "#"
        lines += [f"fits ({len(ranked)} layouts, fastest first; each its fastest variant):", view.to_string(), ""]
    else:
        lines += [f"no layout fits {usable:.1f} GiB a rank: more GPUs, a smaller batch or model, or bigger cards", ""]
    best = layout_planner.best_per_layout(table) if len(table) else table
    missing = best[~best["fits"]] if len(best) else best
    if len(missing):
        lines.append(f"does not fit ({usable:.1f} GiB usable a rank):")
        lines += [f"  {row.base}: needs {row.memory_gib:.1f} GiB a rank at best"
                  + (f" ({row.layout})" if row.layout != row.base else "") for row in missing.itertuples()]
        lines.append("")
    if refused:
        lines.append("refused by its script at these sizes:")
        reasons = {}
        for name, why in refused:
            reasons.setdefault(why, []).append(name)
        lines += [f"  {', '.join(names)}: {why}" for why, names in reasons.items()]
    return "\n".join(lines).rstrip("\n")


def run(args) -> int:
    """`dlokit plan`: print the plan, and with --preview the chosen layout's batch script; 2 on bad input."""
    try:
        table, refused, basis = make_plan(args)
        print(text(table, refused, basis, args.top))
        if args.preview is not None:
            print(preview(table, args))
    except (ValueError, LookupError, profiles.ProfileError) as err:
        print(f"dlokit plan: {err}", file=sys.stderr)
        return 2
    return 0


def preview(table: pd.DataFrame, args) -> str:
    """The batch script of the --preview-th layout of the ranking."""
    ranked = ranking(table)
    if not 1 <= args.preview <= len(ranked):
        raise ValueError(f"--preview {args.preview}: choose one of the {len(ranked)} layouts that fit")
    try:
        profiles.get_profile(args.profile, account=args.account)
    except profiles.ProfileError as err:
        raise ValueError(f"--preview: {err}" + ("" if args.account else " (here: --account ...)")) from None
    row = ranked.loc[args.preview]
    row.attrs = dict(table.attrs)
    script = layout_planner.preview(row, profile=args.profile, n_gpu=args.n_gpu, time_max=args.time,
                                    account=args.account, config=args.config, steps=args.steps)
    return (f"\n# batch script of #{args.preview}, {row['layout']} ({row['degrees']}), on {args.n_gpu} GPUs "
            f"(as dlokit preview prints it: nothing submitted)\n{script}")
