"""compile_bench.py's parts (TP3.3): what each times, on the same inputs for every variant, and TorchScript's pitfall.

- model: training steps (forward, loss, backward, SGD step) of a torchvision model on fixed random batches;
  every variant starts from the same weights and sees the same batches, so its losses can be compared with eager's;
  on several ranks DDP wraps the model and torch.compile wraps DDP;
- inference: the same model's forward pass in eval mode under torch.inference_mode (no autograd at all), on one
  fixed batch: what serving a model costs, compiled or not, and compiled with Inductor's freezing (`compile-frozen`:
  the weights become constants, folded into the graph and laid out once for the convolution library);
- optimizer: one Adam step over the model's parameters (fixed gradients): eager (foreach) runs one operation at a
  time over the list of tensors (a few multi-tensor kernels per operation on a GPU, a loop over the tensors on a
  CPU), each reading and writing every parameter; `fused` (Adam(fused=True)) updates each tensor in one pass; a
  compiled step lets Inductor generate fused code; compared on the parameters they end with;
- function: a NumPy-style chain of elementwise operations and row reductions (each row standardised, then
  softly clipped) on a big tensor: eager runs one kernel per operation, each reading and writing the whole tensor;
  a compiler fuses them;
- control flow (always, in a blink): a function that branches on its data, traced and scripted on an example that
  takes one branch, then called on data that takes the other: a trace replays the branch it saw (`control_flow`
  lines in metrics.jsonl), a script keeps the `if`.
Each part turns a variant into what it runs with `bench.make_variant`, the script's (TP3.3's compile_with inside).
"""
from __future__ import annotations

import itertools

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP

from .compile_options import FROZEN, FUSED, NUMPY_VARIANTS
from .compile_timing import Bench

# Losses compared with eager's: the first step (same weights, same batch: the forward's rounding) and the
# second (after one update: the backward's too). Later steps drift apart by themselves: training amplifies
# rounding differences (max_abs_diff_all_calls shows how far), most with small batches and BatchNorm.
COMPARED_STEPS = 2


# ---- part 1: training steps of a model ---------------------------------------------------------------

def bench_model(bench: Bench) -> list[dict]:
    args, device, world_size = bench.args, bench.device, bench.world_size
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
            step_model = wrap(bench, variant, model, batches[0][0])
            optimizer = torch.optim.SGD(step_model.parameters(), lr=args.lr, momentum=0.9)
            next_batch = itertools.cycle(batches).__next__
            return step_model, lambda: train_step(step_model, optimizer, *next_batch())
        return build

    return bench.run("model", build_for, items=args.batch_size, item_name="images", compare_first=COMPARED_STEPS,
                     extra={"ddp": world_size > 1, "model": args.model, "batch_size": args.batch_size,
                            "image_size": args.image_size})


def wrap(bench: Bench, variant: str, model: nn.Module, example) -> nn.Module:
    """One process: the variant of the model. Several: DDP around the TorchScript module, or torch.compile
    around DDP (Dynamo then splits the graph at DDP's gradient buckets, so communication still overlaps)."""
    make_variant, device = bench.make_variant, bench.device
    if bench.world_size == 1:
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

def bench_inference(bench: Bench) -> list[dict]:
    from torch._inductor import config as inductor_config

    args, device = bench.args, bench.device
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
            fn = bench.make_variant(variant, model, images)  # traced, scripted or compiled outside inference_mode

            def call():
                with torch.inference_mode():  # no autograd bookkeeping at all: tensors without a version counter
                    return checksum(fn(images))
            return fn, call
        return build

    try:
        return bench.run("inference", build_for, items=args.batch_size, item_name="images",
                         extra={"ddp": False, "model": args.model, "batch_size": args.batch_size,
                                "image_size": args.image_size})
    finally:
        inductor_config.freezing = freezing_before


# ---- part 3: the optimizer step -----------------------------------------------------------------------

def bench_optimizer(bench: Bench) -> list[dict]:
    """Adam steps over tensors shaped like the model's parameters, with fixed random gradients: the same start and
    the same gradients for every variant, so the parameters they end with can be compared with eager's."""
    args, device = bench.args, bench.device
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
            step = bench.make_variant(variant, optimizer_step(optimizer), None)
            return step, step, lambda: [checksum_of_parameters(params)]
        return build

    return bench.run("optimizer", build_for, items=sum(p.numel() for p in initial), item_name="parameters",
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


def trace_pitfall(bench: Bench) -> list[dict]:
    """Trace and script double_or_shift on a positive example, then call both on a negative input too: does
    each still give eager's answer? (torch.jit.trace only warns, with a TracerWarning, that it froze the branch.)"""
    example, other = torch.ones(3), torch.full((3,), -3.0)  # eager: 2s, then -4s (a trace replays x * 2: -6s)
    lines = []
    for variant in ("trace", "script"):
        fn = bench.make_variant(variant, double_or_shift, example)
        line = {"variant": variant, "example_branch": "x.sum() > 0",
                "same_as_eager_on_example": torch.equal(fn(example), double_or_shift(example)),
                "same_as_eager_on_other_branch": torch.equal(fn(other), double_or_shift(other))}
        bench.record.log("control_flow", **line)
        lines.append(line)
        bench.say(f"control flow {variant:6s}: eager's answer on the branch of its example "
            f"{'yes' if line['same_as_eager_on_example'] else 'NO'}, on the other branch "
            f"{'yes' if line['same_as_eager_on_other_branch'] else 'NO'}")
    return lines


# ---- part 4: a NumPy-style function -------------------------------------------------------------------

def standardise_clip(x: torch.Tensor) -> torch.Tensor:
    """Each row standardised (mean 0, variance 1), then softly clipped: a cubic that flattens out at ±3 standard
    deviations. Eight elementwise operations and two row reductions, each a full pass over the tensor when eager."""
    centred = x - x.mean(dim=-1, keepdim=True)
    scaled = torch.clamp(centred / torch.sqrt((centred * centred).mean(dim=-1, keepdim=True) + 1e-5), -3.0, 3.0)
    return scaled * (1.0 - scaled * scaled / 27.0)


def standardise_clip_numpy(x: np.ndarray) -> np.ndarray:
    """The same in NumPy: torch.compile traces NumPy code too and turns it into the same fused kernels."""
    centred = x - x.mean(axis=-1, keepdims=True)
    scaled = np.clip(centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + 1e-5), -3.0, 3.0)
    return scaled * (1.0 - scaled * scaled / 27.0)


def bench_function(bench: Bench) -> list[dict]:
    args = bench.args
    generator = torch.Generator().manual_seed(args.seed)
    host = torch.randn(args.function_rows, args.function_cols, generator=generator)
    on_device = host.to(bench.device)

    def build_for(variant):
        numpy_code = variant in NUMPY_VARIANTS  # NumPy arrays live on the host
        x = host.numpy() if numpy_code else on_device

        def build():
            fn = bench.make_variant(variant, standardise_clip_numpy if numpy_code else standardise_clip, x)
            return fn, lambda: checksum(fn(x))
        return build

    return bench.run("function", build_for, items=args.function_rows * args.function_cols, item_name="elements",
                     extra={"ddp": False, "shape": [args.function_rows, args.function_cols]})


def checksum(out) -> list[float]:
    """A few numbers that stand for the output (compared with eager's): row sums of the first rows, one value."""
    out = torch.as_tensor(out)
    return [*out[:8].double().sum(dim=1).tolist(), float(out[0, 0]), float(out[-1, -1])]
