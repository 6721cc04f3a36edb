"""Day 4's paths that one GPU can run, submitted through the kit as the notebook submits them, and what proves the rest.

    python bench/gpu_day4.py --dry --card-gib 141   # each command parsed by its script, planned on the card: 0 findings
    python bench/gpu_day4.py                        # run them here (local profile): one line per job, then the checks

One process each: train_llm.py alone (eager, compiled, with activation checkpointing, fp32 with TF32, under a
--memory-limit it must exceed: the CUDA allocator's cap and the memory meter's CUDA peak), DeepSpeed's ZeRO 1-3 and its
optimizer offload on one rank (loss-matched against the single process), the matmul peak the planner calibrates on.
What needs two GPUs or more is listed with the test that proves it on a CPU (gloo processes). bench/gpu_course.sh
calls this beside the Day 1 notebook.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "helpers")]

from dataclasses import dataclass, fields  # noqa: E402

from dlokit import gpu_plan  # noqa: E402
from dlokit.submission.day import LlmDay, setup_llm_day  # noqa: E402

OOM_BY_DESIGN = {"OUT_OF_MEMORY": "under half of what the memory model says the single process needs"}

# What one GPU cannot run, and where a CPU run proves it (two gloo processes, the same code paths above the device)
NEEDS_TWO = [
    ("DDP, ZeRO-1, FSDP2, FSDP2 + TP, HSDP: memory per rank and loss match",
     "tests/test_notebooks.py::test_day4_local_solutions (TP4.1, TP4.6)"),
    ("tensor, sequence and context parallelism (scratch, DTensor, ring attention)", "tests/test_day4_tp_cp.py"),
    ("pipeline schedules (GPipe, 1F1B) and their bubble", "tests/test_day4_pipeline.py"),
    ("FSDP2's CPU offload on GPUs read as a GPU run", "tests/test_gpu_paths.py::test_an_offloaded_fsdp_record_on_gpus_is_a_gpu_run_everywhere"),
    ("DeepSpeed on a node of 4 GPUs: LOCAL_RANK 0 in each task", "tests/test_rank.py::test_each_task_of_a_4_gpu_node_drives_its_own_gpu_as_cuda_0"),
    ("DeepSpeed ZeRO 1-3 on 2 ranks: sharding and loss match", "tests/test_deepspeed.py"),
    ("bus bandwidth of all-reduce, all-gather, reduce-scatter", "tests/test_notebooks.py::test_day4_local_solutions (TP4.9)"),
]


@dataclass
class CheckDay(LlmDay):
    """The Day 4 jobs at a precision chosen here, not carried from a Day 1 this machine may never have run."""
    dtype_chosen: str = "bf16"

    @property
    def carried(self) -> list[str]:
        return ["--dtype", self.dtype_chosen]


def jobs(day, memory_limit_mb: float, compile_steps: int) -> list[tuple[str, str, dict | None]]:
    """(label, command, expected) of every one-GPU job, written by the day's own methods."""
    text = ["--data", "text", "--grad-norm"]
    found = [("single", day.command("single", *text), None),
             ("single, compiled", day.command("single", *text, "--compile", steps=compile_steps), None),
             ("single, activation checkpointing", day.command("single", *text, "--activation-checkpointing"), None),
             ("single, fp32 with TF32", day.command("single", *text, "--dtype", "fp32", "--tf32"), None)]
    for command in day.deepspeed_runs([1, 2, 3], offload_stage=2):
        argv = shlex.split(command) + ["--one-process"]  # the script refuses one process unless told
        command = shlex.join(argv)
        found.append((f"DeepSpeed ZeRO-{argv[argv.index('--zero-stage') + 1]}"
                      + (", optimizer offloaded" if "--offload-optimizer" in argv else ""), command, None))
    found.append(("matmul peak (the planner's calibration)",
                  day.command(None, "--measure", "peak", "--dtype", day.dtype, script="comm_bench.py"), None))
    found.append(("single under a --memory-limit it exceeds",
                  day.command("single", "--memory-limit", max(1, round(memory_limit_mb)), "--steps", "1"), OOM_BY_DESIGN))
    return found


def half_of_single(day, card_gib: float) -> float:
    """Half the MB the memory model gives the single job on CUDA: a limit it must run out under."""
    _, args = gpu_plan.parse(gpu_plan.Job("TP4.2", day.command("single", "--data", "text"), 1))
    return gpu_plan.train_llm_need(args, 1)[0] * 1024 / 2


def dry(day, card_gib: float, compile_steps: int) -> int:
    """Each command parsed by its script's own parser and planned on one card of `card_gib`; the Day 1 notebook's jobs
    on that card as well. The findings, counted: 0 is the pass."""
    found = 0
    for label, command, expected in jobs(day, half_of_single(day, card_gib), compile_steps):
        row = gpu_plan.check(gpu_plan.Job("TP4", command, 1, "out of memory" if expected else "fits"), card_gib)
        need = f"{row['need_gib']:6.1f} GiB" if row["need_gib"] is not None else "     -    "
        print(f"  {need}  {row['finding'] or 'ok'}  {label}  <- {row['job']}")
        found += bool(row["finding"])
    day1 = gpu_plan.plan(1, card_gib, sizes={}, dtype="bf16", day="day1")
    print(f"  Day 1 at its own parameters on one {card_gib:g} GB card: {len(day1)} jobs, "
          f"{len(gpu_plan.findings(day1))} finding(s)")
    for row in gpu_plan.findings(day1):
        print(f"    {row['tp']}  {row['finding']}  <- {row['job']}")
    found += len(gpu_plan.findings(day1))
    print(f"{found} finding(s)")
    return found


def run(day, card_gib: float, compile_steps: int) -> int:
    from dlokit.analysis import loss_match
    from dlokit.submission.jobs import job_outcome

    planned = jobs(day, half_of_single(day, card_gib), compile_steps)
    ids = day.submit([c for _, c, _ in planned], n_gpu=1, tp="TP4", expected=[e for _, _, e in planned])
    failed = 0
    for (label, _, expected), job in zip(planned, ids):
        outcome = job_outcome(job)
        good = outcome.state == (next(iter(expected)) if expected else "COMPLETED")
        failed += not good
        print(f"{'✅' if good else '❌'} {label}: {outcome.state} (job {job})" + ("" if good else f": {outcome.cause}"))
    single, *others = [job for (label, _, _), job in zip(planned, ids) if label == "single" or label.startswith("DeepSpeed")]
    table = loss_match.loss_match_table(others, reference=single, throughput=False)
    for row in table.itertuples():
        delta = "no step to compare" if row.max_abs_dloss is None else f"max |Δloss| {row.max_abs_dloss:.3g}"
        print(f"{'✅' if row.matched else '❌'} loss match against the single process: run {row.run_id} ({row.mode}), "
              f"{delta} (tolerance {table.attrs['tolerance']:g}, {table.attrs['dtype']})")
        failed += not row.matched
    print("\nWhat one GPU cannot run, and what proves it on a CPU:")
    for path, proof in NEEDS_TWO:
        print(f"➖ {path}: {proof}")
    return failed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="parse and plan every command, run nothing")
    parser.add_argument("--card-gib", type=float, default=141, help="the GPU's memory (an H200: 141)")
    parser.add_argument("--config", default="125m")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--compile-steps", type=int, default=20)
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--profile", default="local")
    args = parser.parse_args(argv)
    base = setup_llm_day("gpucheck", args.profile, str(REPO / "tp_scripts" / "solutions"), config=args.config,
                         seq_len=args.seq_len, batch_size=args.batch, steps=args.steps, verbose=not args.dry)
    day = CheckDay(**{f.name: getattr(base, f.name) for f in fields(base) if f.init}, dtype_chosen=args.dtype)
    return min(1, dry(day, args.card_gib, args.compile_steps) if args.dry else run(day, args.card_gib, args.compile_steps))


if __name__ == "__main__":
    sys.exit(main())
