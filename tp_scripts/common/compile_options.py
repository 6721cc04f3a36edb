"""compile_bench.py's options (TP3.3): the parts it times, the variants it compares, each checked up front.

Variants: eager, trace (torch.jit.trace), script (torch.jit.script), compile-<mode> (torch.compile, mode one of
torch._inductor.list_mode_options(): default, max-autotune-no-cudagraphs, reduce-overhead (GPU only), ...),
for the function part only: numpy (the same function in NumPy) and numpy-compile (torch.compile of the NumPy code),
for the inference part only: compile-frozen, and for the optimizer part only: fused. A part runs the variants that
apply to it (no TorchScript for an optimizer step: it is Python over a list of tensors, not a module).
"""
from __future__ import annotations

import argparse

import torch
import torchvision

from .compile_support import compile_modes, inductor_cache_dir

PARTS = ("model", "inference", "optimizer", "function")

NUMPY_VARIANTS = ("numpy", "numpy-compile")  # function part only

FUSED = "fused"  # optimizer part only

FROZEN = "compile-frozen"  # inference part only: torch.compile with Inductor's freezing



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
    # 2048 x 1024 (8 MiB a tensor): compile-default ran the function x3.3 to x4.8 eager's speed in four standalone
    # processes, and read "agrees" in three course runs (2026-11-29, docs/benchmarks.md)
    p.add_argument("--function-rows", type=int, default=2048, help="rows of the function's input")
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


def compiles(variant: str) -> bool:
    """A variant that runs through torch.compile (its make_variant calls compile_with)."""
    return variant.startswith("compile-") or variant == "numpy-compile"


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
