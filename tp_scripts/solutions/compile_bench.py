"""Time eager PyTorch against TorchScript (trace, script) and torch.compile: training steps, inference, the optimizer step, and a NumPy-style function.

    python compile_bench.py --model resnet18 --image-size 64 --batch-size 16
    python compile_bench.py --parts function --variants eager,compile-default,numpy,numpy-compile
    python compile_bench.py --parts optimizer --variants eager,fused,compile-default
    torchrun --nproc_per_node=2 compile_bench.py --parts model    (compile + DDP: DDP wraps the model, compile wraps DDP)

The job of TP3.3 (Day 3). Four timed parts, and TorchScript's control-flow pitfall:
- model: training steps (forward, loss, backward, SGD step) of a torchvision model on fixed random batches;
  every variant starts from the same weights and sees the same batches, so its losses can be compared with eager's;
- inference: the same model's forward pass in eval mode under torch.inference_mode (no autograd at all), on one
  fixed batch: what serving a model costs, compiled or not, and compiled with Inductor's freezing (`compile-frozen`:
  the weights become constants, folded into the graph and laid out once for the convolution library);
- optimizer: one Adam step over the model's parameters (fixed gradients): eager (foreach) runs one operation at a
  time over the list of tensors (a few multi-tensor kernels per operation on a GPU, a loop over the tensors on a
  CPU), each reading and writing every parameter; `fused` (Adam(fused=True)) updates each tensor in one pass; a
  compiled step lets Inductor generate fused code; compared on the parameters they end with;
- function: a NumPy-style chain of elementwise operations and row reductions (GELU, then softmax) on a big
  tensor: eager runs one kernel per operation, each reading and writing the whole tensor; a compiler fuses them;
- control flow (always, in a blink): a function that branches on its data, traced and scripted on an example that
  takes one branch, then called on data that takes the other: a trace replays the branch it saw (`control_flow`
  lines in metrics.jsonl), a script keeps the `if`.

Per variant, the first calls (tracing, compiling, TorchScript's profiling runs) are timed apart from the steady
state (the median of the timed calls after warm-up). One `compile_result` line per part and variant goes to
metrics.jsonl, and the whole table to summary.json `results` (docs/run-records.md). Compiling needs a C++
compiler on the CPU (Triton on the GPU): without one, the compile variants are recorded as skipped, with why.

Variants: eager, trace (torch.jit.trace), script (torch.jit.script), compile-<mode> (torch.compile, mode one of
torch._inductor.list_mode_options(): default, max-autotune-no-cudagraphs, reduce-overhead (GPU only), ...),
for the function part only: numpy (the same function in NumPy) and numpy-compile (torch.compile of the NumPy code),
for the inference part only: compile-frozen, and for the optimizer part only: fused. A part runs the variants that apply to it (no TorchScript for an optimizer
step: it is Python over a list of tensors, not a module).
TorchScript is deprecated in recent PyTorch (torch.compile and torch.export replace it); it is here to compare.
"""
import argparse
import atexit
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torch._dynamo.utils import counters
from torch.nn.parallel import DistributedDataParallel as DDP

from dlokit.in_job import rank as job
from dlokit.in_job.runrecord import RunRecorder, shared_run_id

# The shared modules: the package common/ (tp_scripts/common; solutions/common links to it).
from common.compile_support import CUDA_GRAPH_MODES, compile_modes, missing_compiler

PARTS = ("model", "inference", "optimizer", "function")
NUMPY_VARIANTS = ("numpy", "numpy-compile")  # function part only
FUSED = "fused"  # optimizer part only
FROZEN = "compile-frozen"  # inference part only: torch.compile with Inductor's freezing
RTOL, ATOL = 1e-3, 1e-5  # "agrees with eager": |variant - eager| <= ATOL + RTOL * |eager|, element by element
# Losses compared with eager's: the first step (same weights, same batch: the forward's rounding) and the
# second (after one update: the backward's too). Later steps drift apart by themselves: training amplifies
# rounding differences (max_abs_diff_all_calls shows how far), most with small batches and BatchNorm.
COMPARED_STEPS = 2


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
    startup = None
    if args.fresh_cache and not compiler_problem and any(v.startswith("compile-") or v == "numpy-compile"
                                                         for v in variants):
        startup = compiler_startup(device)
        say(f"the compiler's one-off start-up (its modules, its first C++ build): {startup:.1f} s, paid before "
            "the variants, so that none of them pays it")
    results = []
    if "model" in args.parts:
        results += bench_model(args, variants, device, env.world_size, compiler_problem, record, say)
    if "inference" in args.parts:
        results += bench_inference(args, variants, device, compiler_problem, record, say)
    if "optimizer" in args.parts:
        results += bench_optimizer(args, variants, device, compiler_problem, record, say)
    if "function" in args.parts:
        results += bench_function(args, variants, device, compiler_problem, record, say)
    control_flow = trace_pitfall(record, say)
    record.finish(results=results, control_flow=control_flow, compile_unavailable=compiler_problem, inductor_cache_dir=inductor_cache_dir(),
                  world_size=env.world_size, ddp=env.world_size > 1, compiler_startup_s=startup)
    job.destroy_process_group()
    return 0


# ---- options ---------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="compile_bench.py", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                description="Eager vs TorchScript vs torch.compile: compile time apart from step time.")
    p.add_argument("--parts", default="model,function",
                   help=f"what to time, comma-separated among {', '.join(PARTS)} (training steps, forward passes under "
                        "inference_mode, Adam steps, a NumPy-style function)")
    p.add_argument("--variants", default="auto",
                   help="comma list of eager, trace, script, compile-<mode>, numpy, numpy-compile, fused, compile-frozen; "
                        "auto = eager, trace, script, compile-default, compile-max-autotune-no-cudagraphs (+ "
                        "compile-reduce-overhead on a GPU), numpy, numpy-compile, fused, compile-frozen")
    p.add_argument("--model", default="resnet18", help="torchvision classification model")
    p.add_argument("--image-size", type=int, default=64, help="image side in pixels")
    p.add_argument("--batch-size", type=int, default=16, help="images per process per step")
    p.add_argument("--num-classes", type=int, default=10, help="classes of the random labels")
    p.add_argument("--lr", type=float, default=0.01, help="learning rate of the model's SGD (momentum 0.9) and of Adam")
    p.add_argument("--function-rows", type=int, default=4096, help="rows of the function's input (softmax over each row)")
    p.add_argument("--function-cols", type=int, default=1024, help="columns of the function's input")
    p.add_argument("--warmup-steps", type=int, default=3,
                   help="first calls of each variant, timed apart: compiling, TorchScript's profiling runs")
    p.add_argument("--steps", type=int, default=10, help="timed calls after the warm-up (their median is t_step)")
    p.add_argument("--fresh-cache", action="store_true",
                   help="compile from scratch: an empty inductor cache for each compiled variant (otherwise the "
                        "per-user cache, $TORCHINDUCTOR_CACHE_DIR, or a variant compiled before it in this run, may "
                        "already hold its kernels, and compiling takes seconds instead of minutes)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto = the GPU when there is one")
    p.add_argument("--seed", type=int, default=0, help="same seed, same weights, batches and function input")
    p.add_argument("--runs-dir", default=None, help="where run records go [default: $DLOKIT_RUNS_DIR or ./runs]")
    args = p.parse_args(argv)
    args.parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    if not args.parts or any(part not in PARTS for part in args.parts):
        p.error(f"--parts: choose among {', '.join(PARTS)} (comma-separated)")
    for name in ("image_size", "batch_size", "num_classes", "function_rows", "function_cols", "warmup_steps", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.batch_size < 2:
        p.error("--batch-size must be at least 2: BatchNorm needs two samples")
    if args.model not in torchvision.models.list_models(module=torchvision.models):
        p.error(f"unknown model '{args.model}': a torchvision classification model, e.g. resnet18, resnet50")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this machine has no usable GPU")
    if args.variants != "auto":
        modes = compile_modes()
        for name in args.variants.split(","):
            name = name.strip()
            if name.startswith("compile-") and name != FROZEN and name.removeprefix("compile-") not in modes:
                p.error(f"--variants: unknown torch.compile mode in '{name}'; modes: {', '.join(modes)}")
            if not name.startswith("compile-") and name not in ("eager", "trace", "script", *NUMPY_VARIANTS, FUSED):
                p.error(f"--variants: unknown variant '{name}'; choose among eager, trace, script, "
                        f"compile-<mode>, {', '.join(NUMPY_VARIANTS)}, {FUSED}, {FROZEN}")
    return args


def resolve_variants(text: str, device) -> list[str]:
    if text != "auto":
        return list(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    gpu_only = ["compile-reduce-overhead"] if device.type == "cuda" else []
    return ["eager", "trace", "script", "compile-default", "compile-max-autotune-no-cudagraphs", *gpu_only,
            *NUMPY_VARIANTS, FUSED, FROZEN]


def applying_to(part: str, variants) -> list[str]:
    """The variants that apply to a part: NumPy's to the function only, fused to the optimizer only, compile-frozen
    to inference only, TorchScript to all but the optimizer step."""
    if part == "optimizer":
        return [v for v in variants if v in ("eager", FUSED) or (v.startswith("compile-") and v != FROZEN)]
    return [v for v in variants if v != FUSED and (part == "function" or v not in NUMPY_VARIANTS)
            and (part == "inference" or v != FROZEN)]


def config(args, env, device, variants, compiler_problem) -> dict:
    return {**vars(args), "variants": variants, "world_size": env.world_size, "launcher": env.source,
            "device_type": device.type, "threads": torch.get_num_threads(), "compile_unavailable": compiler_problem,
            "inductor_cache_dir": inductor_cache_dir()}


def inductor_cache_dir() -> str:
    """Where Inductor keeps compiled kernels (TORCHINDUCTOR_CACHE_DIR: the kit sets one per user)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


def use_fresh_cache() -> None:
    """An empty cache folder, removed at the end, and Inductor's in-memory caches emptied: every kernel is generated
    and built again (called before each compiled variant, so that no variant reuses another's kernels)."""
    from torch._inductor.utils import clear_inductor_caches

    folder = tempfile.mkdtemp(prefix="dlokit-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    os.environ["TRITON_CACHE_DIR"] = os.path.join(folder, "triton")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    clear_inductor_caches()


# ---- the variants ----------------------------------------------------------------------------------

def compiler_startup(device) -> float:
    """Compile and run a one-line function once, untimed by the variants: Dynamo's and Inductor's modules load,
    the C++ (or Triton) toolchain starts, whatever the first compiled variant would otherwise pay alone.
    Returns the seconds it took."""
    started = time.perf_counter()
    use_fresh_cache()
    torch.compile(lambda x: torch.relu(x) + 1)(torch.ones(8, device=device))
    torch._dynamo.reset()
    return time.perf_counter() - started


def compile_with(fn, mode: str):
    """torch.compile a module or a function: Dynamo captures its graph on the first call, Inductor fuses the
    operations and generates kernels for them; later calls with the same shapes reuse the compiled code."""
    # >>> SOLUTION TP3.3: compile `fn` with torch.compile in the given mode
    return torch.compile(fn, mode=mode)
    # --- STUDENT
    # return fn  # not compiled yet: the compile variants run eagerly
    # <<< SOLUTION


def is_compiled(fn) -> bool:
    """The object torch.compile returns: an OptimizedModule for a module, a wrapper for a function."""
    return hasattr(fn, "_orig_mod") or hasattr(fn, "_torchdynamo_orig_callable")


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


def skip_reason(variant: str, device, compiler_problem) -> str | None:
    compiles = variant.startswith("compile-") or variant == "numpy-compile"
    if compiles and compiler_problem:
        return compiler_problem
    if variant.removeprefix("compile-") in CUDA_GRAPH_MODES and device.type != "cuda":
        return f"{variant}: CUDA graphs replay GPU work, there is none on the CPU"
    return None


# ---- timing ----------------------------------------------------------------------------------------

def time_calls(call, warmup: int, steps: int, device) -> tuple[list[float], list]:
    """(seconds of each call, what each returned); every call ends once the device has finished."""
    seconds, outputs = [], []
    for _ in range(warmup + steps):
        started = time.perf_counter()
        out = call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - started)
        outputs.append(out)
    return seconds, outputs


def dynamo_counts() -> dict:
    """Graphs Dynamo compiled, graph breaks, and Inductor's on-disk cache hits/misses so far."""
    return {"graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values()),
            "cache_hits": counters["inductor"]["fxgraph_cache_hit"],
            "cache_misses": counters["inductor"]["fxgraph_cache_miss"]}


def measure(build, device, args, *, items: int, item_name: str):
    """Build the variant (timed: tracing, scripting, wrapping), then call it warm-up + timed times:
    (result fields, what the calls returned). `build()` returns (fn, call) or (fn, call, compared): then
    `compared()`, read after the calls, is what is compared with the reference instead."""
    torch._dynamo.reset()  # each compile variant compiles from nothing (no graph kept from the previous one)
    if args.fresh_cache:  # ... and no kernel either: a cold cache for each, so their compile times compare
        use_fresh_cache()
    counters.clear()
    started = time.perf_counter()
    fn, call, *compared = build()
    t_build = time.perf_counter() - started
    seconds, outputs = time_calls(call, args.warmup_steps, args.steps, device)
    if compared:  # what to compare is read after the timed calls (e.g. the parameters the steps ended with)
        outputs = compared[0]()
    warmup, timed = seconds[:args.warmup_steps], seconds[args.warmup_steps:]
    t_step = statistics.median(timed)
    fields = {"status": "ok", "reason": None, "t_build": t_build, "t_first": seconds[0], "t_warmup": sum(warmup),
              # what the first calls cost beyond the steady state: the price of tracing or compiling
              "t_compile": max(0.0, t_build + sum(warmup) - len(warmup) * t_step),
              "t_step": t_step, "t_step_min": min(timed), "t_step_max": max(timed),
              "warmup_steps": len(warmup), "timed_steps": len(timed), "step_times": [round(s, 6) for s in seconds],
              "items": item_name, "items_per_s": items / t_step, "compiled": is_compiled(fn),
              "cache": "fresh" if args.fresh_cache else "shared (may hold kernels compiled before)", **dynamo_counts()}
    return fields, outputs


def compare(outputs, reference, first: int | None) -> dict:
    """Largest difference from the reference's outputs (losses step by step, or the function's output) over the
    first `first` calls (None: all), which decide `agrees`; and over all calls."""
    if reference is None:
        return {"max_abs_diff": None, "agrees": None, "compared_calls": 0, "max_abs_diff_all_calls": None}
    a, b = np.asarray(outputs, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    first = len(a) if first is None else min(first, len(a))
    return {"max_abs_diff": float(np.max(np.abs(a[:first] - b[:first]))), "compared_calls": first,
            "agrees": bool(np.allclose(a[:first], b[:first], rtol=RTOL, atol=ATOL)),
            "max_abs_diff_all_calls": float(np.max(np.abs(a - b)))}


def run_variants(part: str, variants, device, compiler_problem, record, say, build_for, args, *, items, item_name,
                 extra: dict, compare_first: int | None = None) -> list[dict]:
    """Every variant of one part, the reference (eager) first: measured, compared with the reference,
    one compile_result line each. `build_for(variant)` prepares what is not timed and returns the builder."""
    reference_variant = next((v for v in ("eager", "numpy") if v in variants), None)
    variants = sorted(variants, key=lambda v: v != reference_variant)
    results, reference, reference_step = [], None, None
    for variant in variants:
        line = {"part": part, "variant": variant, **extra}
        reason = skip_reason(variant, device, compiler_problem)
        if reason:
            line.update(status="skipped", reason=reason)
        else:
            try:
                fields, outputs = measure(build_for(variant), device, args, items=items, item_name=item_name)
            except Exception as error:  # recorded: the other variants still run
                line.update(status="failed", reason=f"{type(error).__name__}: {str(error).strip()[:500]}")
            else:
                if variant == reference_variant:
                    reference, reference_step = outputs, fields["t_step"]
                line.update(fields, **compare(outputs, reference, compare_first), reference=reference_variant,
                            speedup=reference_step / fields["t_step"] if reference_step else None)
        record.log("compile_result", **line)
        results.append(line)
        say(describe(line))
    return results


def describe(line: dict) -> str:
    head = f"{line['part']:8s} {line['variant']:36s}"
    if line["status"] != "ok":
        return f"{head} {line['status']}: {line['reason']}"
    diff = "" if line["max_abs_diff"] is None else f" | max |Δ| vs {line['reference']} {line['max_abs_diff']:.2e}"
    return (f"{head} compile {line['t_compile']:7.2f} s | step {line['t_step'] * 1e3:8.2f} ms | "
            f"{line['items_per_s']:,.0f} {line['items']}/s{diff} | compiled {line['compiled']} graphs {line['graphs']}")


# ---- part 1: training steps of a model ---------------------------------------------------------------

def bench_model(args, variants, device, world_size, compiler_problem, record, say) -> list[dict]:
    torch.manual_seed(args.seed)  # same initial weights on every rank and for every variant
    initial = torchvision.models.get_model(args.model, num_classes=args.num_classes).state_dict()
    generator = torch.Generator().manual_seed(args.seed + 1 + (torch.distributed.get_rank() if world_size > 1 else 0))
    batches = [(torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=generator).to(device),
                torch.randint(0, args.num_classes, (args.batch_size,), generator=generator).to(device))
               for _ in range(4)]

    def build_for(variant):
        model = torchvision.models.get_model(args.model, num_classes=args.num_classes)
        model.load_state_dict(initial)
        model = model.to(device).train()

        def build():
            step_model = wrap(variant, model, batches[0][0], device, world_size)
            optimizer = torch.optim.SGD(step_model.parameters(), lr=args.lr, momentum=0.9)
            next_batch = itertools.cycle(batches).__next__
            return step_model, lambda: train_step(step_model, optimizer, *next_batch())
        return build

    return run_variants("model", applying_to("model", variants), device, compiler_problem, record, say, build_for, args,
                        items=args.batch_size, item_name="images", compare_first=COMPARED_STEPS,
                        extra={"ddp": world_size > 1, "model": args.model, "batch_size": args.batch_size,
                               "image_size": args.image_size})


def wrap(variant: str, model: nn.Module, example, device, world_size: int) -> nn.Module:
    """One process: the variant of the model. Several: DDP around the TorchScript module, or torch.compile
    around DDP (Dynamo then splits the graph at DDP's gradient buckets, so communication still overlaps)."""
    if world_size == 1:
        return make_variant(variant, model, example)
    device_ids = [device.index] if device.type == "cuda" else None
    if variant.startswith("compile-"):
        return make_variant(variant, DDP(model, device_ids=device_ids), example)
    return DDP(make_variant(variant, model, example), device_ids=device_ids)


def train_step(model, optimizer, images, labels) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss.item()  # waits for the step: the next one starts from here


# ---- part 2: inference (forward passes, no autograd) ------------------------------------------------------

def bench_inference(args, variants, device, compiler_problem, record, say) -> list[dict]:
    from torch._inductor import config as inductor_config

    freezing_before = inductor_config.freezing  # TORCHINDUCTOR_FREEZING=1 makes it the default
    torch.manual_seed(args.seed)
    model = torchvision.models.get_model(args.model, num_classes=args.num_classes).to(device).eval()
    generator = torch.Generator().manual_seed(args.seed + 1)
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=generator).to(device)

    def build_for(variant):
        # Freezing (inference graphs only): the weights become constants, folded into the graph and, on a CPU,
        # laid out once for oneDNN's convolutions instead of at every call. Read when the first call compiles.
        inductor_config.freezing = variant == FROZEN

        def build():
            fn = make_variant(variant, model, images)  # traced, scripted or compiled outside inference_mode

            def call():
                with torch.inference_mode():  # no autograd bookkeeping at all: tensors without a version counter
                    return checksum(fn(images))
            return fn, call
        return build

    try:
        return run_variants("inference", applying_to("inference", variants), device, compiler_problem, record, say,
                            build_for, args, items=args.batch_size, item_name="images",
                            extra={"ddp": False, "model": args.model, "batch_size": args.batch_size,
                                   "image_size": args.image_size})
    finally:
        inductor_config.freezing = freezing_before


# ---- part 3: the optimizer step -----------------------------------------------------------------------

def bench_optimizer(args, variants, device, compiler_problem, record, say) -> list[dict]:
    """Adam steps over tensors shaped like the model's parameters, with fixed random gradients: the same start and
    the same gradients for every variant, so the parameters they end with can be compared with eager's."""
    torch.manual_seed(args.seed)
    initial = [p.detach().to(device) for p in
               torchvision.models.get_model(args.model, num_classes=args.num_classes).parameters()]
    generator = torch.Generator().manual_seed(args.seed + 1)
    gradients = [torch.randn(p.shape, generator=generator).to(device) for p in initial]

    def build_for(variant):
        params = [p.clone().requires_grad_() for p in initial]
        for param, gradient in zip(params, gradients):
            param.grad = gradient.clone()
        kernels = {"fused": True} if variant == FUSED else {"foreach": True}  # eager: the for-each kernels
        optimizer = torch.optim.Adam(params, lr=args.lr, **kernels)

        def build():
            step = make_variant(variant, optimizer_step(optimizer), None)
            return step, step, lambda: [checksum_of_parameters(params)]
        return build

    return run_variants("optimizer", applying_to("optimizer", variants), device, compiler_problem, record, say,
                        build_for, args, items=sum(p.numel() for p in initial), item_name="parameters",
                        extra={"ddp": False, "model": args.model, "optimizer": "Adam", "tensors": len(initial)})


def optimizer_step(optimizer):
    """The step as a function: what torch.compile compiles (a compiled optimizer step). Its record shows 2 graph
    breaks: PyTorch's own, around the update (torch/optim/optimizer.py), so that it compiles as an in-place,
    gradient-free graph."""
    def step():
        optimizer.step()
    return step


def checksum_of_parameters(params) -> list[float]:
    """A few numbers that stand for the parameters: the sums of eight tensors spread over the list."""
    every = max(1, len(params) // 8)
    return [float(p.detach().double().sum()) for p in params[::every][:8]]


# ---- TorchScript's pitfall: a trace keeps one branch ----------------------------------------------------

def double_or_shift(x: torch.Tensor) -> torch.Tensor:
    """A branch on the data: doubled when the sum is positive, shifted down by one otherwise."""
    if x.sum() > 0:
        return x * 2
    return x - 1


def trace_pitfall(record, say) -> list[dict]:
    """Trace and script double_or_shift on a positive example, then call both on a negative input too: does
    each still give eager's answer? (torch.jit.trace only warns, with a TracerWarning, that it froze the branch.)"""
    example, other = torch.ones(3), torch.full((3,), -3.0)  # eager: 2s, then -4s (a trace replays x * 2: -6s)
    lines = []
    for variant in ("trace", "script"):
        fn = make_variant(variant, double_or_shift, example)
        line = {"variant": variant, "example_branch": "x.sum() > 0",
                "same_as_eager_on_example": torch.equal(fn(example), double_or_shift(example)),
                "same_as_eager_on_other_branch": torch.equal(fn(other), double_or_shift(other))}
        record.log("control_flow", **line)
        lines.append(line)
        say(f"control flow {variant:6s}: eager's answer on the branch of its example "
            f"{'yes' if line['same_as_eager_on_example'] else 'NO'}, on the other branch "
            f"{'yes' if line['same_as_eager_on_other_branch'] else 'NO'}")
    return lines


# ---- part 4: a NumPy-style function -------------------------------------------------------------------

def gelu_softmax(x: torch.Tensor) -> torch.Tensor:
    """GELU (tanh approximation), then a softmax over each row: ten elementwise operations and two reductions."""
    y = 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))  # sqrt(2/pi), as a literal for script
    e = torch.exp(y - y.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def gelu_softmax_numpy(x: np.ndarray) -> np.ndarray:
    """The same in NumPy: torch.compile traces NumPy code too and turns it into the same fused kernels."""
    y = 0.5 * x * (1.0 + np.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))
    e = np.exp(y - y.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def bench_function(args, variants, device, compiler_problem, record, say) -> list[dict]:
    generator = torch.Generator().manual_seed(args.seed)
    host = torch.randn(args.function_rows, args.function_cols, generator=generator)
    on_device = host.to(device)

    def build_for(variant):
        numpy_code = variant in NUMPY_VARIANTS  # NumPy arrays live on the host
        x = host.numpy() if numpy_code else on_device

        def build():
            fn = make_variant(variant, gelu_softmax_numpy if numpy_code else gelu_softmax, x)
            return fn, lambda: checksum(fn(x))
        return build

    return run_variants("function", applying_to("function", variants), device, compiler_problem, record, say,
                        build_for, args,
                        items=args.function_rows * args.function_cols, item_name="elements",
                        extra={"ddp": False, "shape": [args.function_rows, args.function_cols]})


def checksum(out) -> list[float]:
    """A few numbers that stand for the output (compared with eager's): row sums of the first rows, one value."""
    out = torch.as_tensor(out)
    return [*out[:8].double().sum(dim=1).tolist(), float(out[0, 0]), float(out[-1, -1])]


if __name__ == "__main__":
    sys.exit(main())
