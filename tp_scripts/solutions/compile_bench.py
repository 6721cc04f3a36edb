"""Time eager PyTorch against TorchScript (trace, script) and torch.compile: training steps, inference, the optimizer step, and a NumPy-style function.

    python compile_bench.py --model resnet18 --image-size 64 --batch-size 16
    python compile_bench.py --parts function --variants eager,compile-default,numpy,numpy-compile
    python compile_bench.py --parts optimizer --variants eager,fused,compile-default
    torchrun --nproc_per_node=2 compile_bench.py --parts model    (compile + DDP: DDP wraps the model, compile wraps DDP)

The job of TP3.3 (Day 3). Yours: `compile_with` (what a compile variant runs) and `make_variant` (what each variant
runs: eager, a TorchScript trace or script, or compiled). The rest is the harness, in the shared package common/:
compile_parts.py (the four parts, model, inference, optimizer, function, and TorchScript's control-flow pitfall),
compile_timing.py (the first calls timed apart from the steady state, each variant compared with eager, one
`compile_result` line each in metrics.jsonl, docs/run-records.md), compile_options.py (the options and variants) and
compile_support.py (a compiler to build kernels with, Inductor's cache). Compiling needs a C++ compiler on the CPU
(Triton on the GPU): without one, the compile variants are recorded as skipped, with why.
TorchScript is deprecated in recent PyTorch (torch.compile and torch.export replace it); it is here to compare.
"""
import sys
import warnings

import torch

from dlokit.in_job import rank as job
from dlokit.in_job.runrecord import RunRecorder, shared_run_id

# The shared package common/ (tp_scripts/common, installed with the kit: found from solutions/ too).
from common.compile_options import FROZEN, compiles, config, parse_args, resolve_variants
from common.compile_parts import bench_function, bench_inference, bench_model, bench_optimizer, trace_pitfall
from common.compile_support import compiler_startup, inductor_cache_dir, missing_compiler
from common.compile_timing import Bench


def compile_with(fn, mode: str):
    """torch.compile a module or a function: Dynamo captures its graph on the first call, Inductor fuses the
    operations and generates kernels for them; later calls with the same shapes reuse the compiled code."""
    # >>> SOLUTION TP3.3: compile `fn` with torch.compile in the given mode
    return torch.compile(fn, mode=mode)
    # --- STUDENT
    # return fn  # not compiled yet: the compile variants run eagerly
    # <<< SOLUTION


def make_variant(variant: str, fn, example):
    """The callable a variant runs: `fn` itself, traced or scripted by TorchScript, or compiled."""
    with warnings.catch_warnings():  # TorchScript's deprecation notice and tracer warnings, once per variant
        warnings.simplefilter("ignore")
        if variant == "trace":
            return torch.jit.trace(fn, example)
        if variant == "script":
            return torch.jit.script(fn)
    if variant == FROZEN:  # the default mode; bench_inference switches Inductor's freezing on for it
        return compile_with(fn, "default")
    if variant.startswith("compile-"):
        return compile_with(fn, variant.removeprefix("compile-"))
    if variant == "numpy-compile":
        return compile_with(fn, "default")
    return fn


def main(argv=None) -> int:
    env = job.detect()
    args = parse_args(argv)
    device = job.init_process_group(device=None if args.device == "auto" else args.device)
    variants = resolve_variants(args.variants, device)
    compiler_problem = missing_compiler(device.type)
    record = RunRecorder(config(args, env, device, variants, compiler_problem), rank=env.rank,
                         world_size=env.world_size, run_id=shared_run_id(), runs_dir=args.runs_dir,
                         script="compile_bench.py", device=device)
    say = print if env.rank == 0 else (lambda *a, **k: None)
    say(f"run {record.run_id} | {env.world_size} process(es) on {device.type}"
        f"{' (DDP)' if env.world_size > 1 else ''} | variants {', '.join(variants)}")
    if compiler_problem:
        say(f"compile variants skipped: {compiler_problem}")
    startup = {"compiler_startup_s": None}
    if args.fresh_cache and not compiler_problem and any(map(compiles, variants)):
        startup = compiler_startup(device, variants, make_variant)
        say(startup.get("compiler_startup_skipped") or "the compiler's one-off start-up (its modules, its first C++ "
            f"build): {startup['compiler_startup_s']:.1f} s, paid before the variants, so that none of them pays it")
    bench = Bench(args, variants, device, env.world_size, compiler_problem, record, say, make_variant)
    results = []
    if "model" in args.parts:
        results += bench_model(bench)
    if "inference" in args.parts:
        results += bench_inference(bench)
    if "optimizer" in args.parts:
        results += bench_optimizer(bench)
    if "function" in args.parts:
        results += bench_function(bench)
    control_flow = trace_pitfall(bench)
    record.finish(results=results, control_flow=control_flow, compile_unavailable=compiler_problem,
                  inductor_cache_dir=inductor_cache_dir(), world_size=env.world_size, ddp=env.world_size > 1,
                  **startup)
    job.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())  # a normal exit, not leave_now: atexit removes the --fresh-cache kernel folders
