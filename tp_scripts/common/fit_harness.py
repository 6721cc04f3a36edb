"""The harness of fit_levers.py (TP1.5): its options, the model, fixed batches, what a step did, the run record.

Not part of the TP: what the student edits is in fit_levers.py (the accumulated step, the checkpointed stage).
"""
from __future__ import annotations

import argparse
from contextlib import contextmanager

import torch
import torch.nn as nn
import torchvision
from torchvision import datasets

from dlokit.in_job.runrecord import RunRecorder, shared_run_id

from .image_data import load_image, val_transform

LEVERS = ("plain", "accumulate", "checkpoint")
NORMS = ("batch", "group", "batch-eval")  # batch-eval: BatchNorm with its running statistics (model.eval())
STAGES = ("layer1", "layer2", "layer3", "layer4")  # a torchvision ResNet's four stages


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="fit_levers.py", description="Gradient accumulation and activation "
                                "checkpointing against the plain step: memory, time, and what BatchNorm changes.")
    p.add_argument("--data", default="synthetic", help="an ImageNet-layout folder, or 'synthetic'")
    p.add_argument("--model", default="resnet18", help="a torchvision ResNet (its stages are checkpointed)")
    p.add_argument("--image-size", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=64, help="images per optimizer step (the large batch)")
    p.add_argument("--micro-batches", type=int, default=4, help="k: forward-backward passes per accumulated step")
    p.add_argument("--levers", default="plain,accumulate,checkpoint",
                   help="the arms, alternated step by step: " + ", ".join(LEVERS))
    p.add_argument("--steps", type=int, default=6,
                   help="timed steps of each arm, between two untimed ones that count its tensors")
    p.add_argument("--norm-lesson", default="", help="norms whose accumulated steps are compared with the plain "
                   "large batch, step by step (e.g. 'batch,group'; " + ", ".join(NORMS) + "); '' for none")
    p.add_argument("--norm-steps", type=int, default=2, help="steps of the norm lesson")
    p.add_argument("--memory-limit", type=float, default=None, help="MiB the run may allocate once started "
                   "(a GPU's allocator limit, RLIMIT_DATA on a CPU): past it the run ends out of memory")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs-dir", default=None, help="where run records go [default: $DLOKIT_RUNS_DIR or ./runs]")
    args = p.parse_args(argv)
    args.levers = [lever for lever in args.levers.split(",") if lever]
    args.norm_lesson = [norm for norm in args.norm_lesson.split(",") if norm]
    for name in args.levers + args.norm_lesson:
        if name not in LEVERS + NORMS or (name in NORMS) != (name in args.norm_lesson):
            p.error(f"unknown lever or norm {name!r}: levers {', '.join(LEVERS)}; norms {', '.join(NORMS)}")
    if args.micro_batches < 1 or args.batch_size % args.micro_batches or args.batch_size // args.micro_batches < 2:
        p.error(f"--batch-size {args.batch_size} must split into --micro-batches {args.micro_batches} equal "
                "micro-batches of 2 images or more (BatchNorm needs two)")
    return args


def build_model(name: str, classes: int, norm: str, device, seed: int) -> nn.Module:
    """The same initial weights for every arm (one seed); GroupNorm in place of BatchNorm for norm 'group'.

    A small-image stem (a 3x3 stride-1 convolution, no max-pool, as CIFAR ResNets): with ImageNet's stem the two
    layers before the stages, at half the crop, held more activations than the four stages, and checkpointing the
    stages left most of the memory where it was."""
    torch.manual_seed(seed)
    extra = {"norm_layer": _group_norm} if norm == "group" else {}
    model = torchvision.models.get_model(name, num_classes=classes, **extra)
    missing = [stage for stage in STAGES if not hasattr(model, stage)]
    if missing:
        raise SystemExit(f"fit_levers.py: error: --model {name} has no stages {missing}: give a torchvision ResNet")
    model.conv1 = nn.Conv2d(3, model.conv1.out_channels, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    model = model.to(device)
    return model.eval() if norm == "batch-eval" else model.train()


def blocks(model: nn.Module) -> list[nn.Module]:
    """The residual blocks of the four stages, in order (none for a model that is not a ResNet)."""
    return [block for name in STAGES for block in getattr(model, name, ())]


def _group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(32, channels), channels)


def fixed_batches(data: str, image_size: int, batch_size: int, count: int, device, seed: int):
    """`count` batches, the same for every arm and every run: the first images of a seeded shuffle of the training
    folder, cropped as for validation (no random augmentation), or random tensors. (batches, number of classes)"""
    generator = torch.Generator().manual_seed(seed)
    if data == "synthetic":
        images = torch.randn(count * batch_size, 3, image_size, image_size, generator=generator)
        labels = torch.randint(0, 10, (count * batch_size,), generator=generator)
        classes = 10
    else:
        folder = datasets.ImageFolder(f"{data}/train", transform=val_transform(image_size), loader=load_image)
        order = torch.randperm(len(folder), generator=generator)[:count * batch_size].tolist()
        decoded = [folder[i] for i in order]  # each image once; a batch larger than the folder repeats it
        picked = [decoded[i % len(decoded)] for i in range(count * batch_size)]
        images, labels = torch.stack([p[0] for p in picked]), torch.tensor([p[1] for p in picked])
        classes = len(folder.classes)
    pairs = zip(images.split(batch_size), labels.split(batch_size))
    return [(x.to(device), y.to(device)) for x, y in pairs], classes


class StepWatch:
    """What the model did during a step, seen from outside: the images of each forward pass, and how many times its
    residual blocks ran forward (each twice when its activations were recomputed in backward). Also what
    train_classifier.py records of --grad-accum and --activation-checkpointing."""

    def __init__(self, model: nn.Module):
        self.passes, self.block_calls, self.blocks = [], 0, len(blocks(model))
        model.register_forward_pre_hook(self._model_ran)
        for block in blocks(model):
            block.register_forward_pre_hook(self._block_ran)

    def _model_ran(self, module, inputs) -> None:
        self.passes.append(len(inputs[0]))

    def _block_ran(self, module, inputs) -> None:
        self.block_calls += 1

    def take(self) -> dict:
        seen = {"forward_images": self.passes, "block_forwards": self.block_calls, "blocks": self.blocks}
        self.passes, self.block_calls = [], 0
        return seen


@contextmanager
def device_peak(device):
    """On a GPU, {"device_step_peak_mib"}: the allocator's peak over the step above what was allocated before it
    (torch.cuda.max_memory_allocated: workspaces and gradients in flight included); {} on a CPU."""
    found = {}
    if device.type != "cuda":
        yield found
        return
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    yield found
    torch.cuda.synchronize(device)
    found["device_step_peak_mib"] = (torch.cuda.max_memory_allocated(device) - before) / 2**20


def grad_norm(model: nn.Module) -> float:
    grads = [p.grad.detach().flatten() for p in model.parameters() if p.grad is not None]
    return float(torch.cat(grads).norm()) if grads else 0.0


def start_record(args, env, device) -> RunRecorder:
    config = {**vars(args), "process_group_backend": None}
    return RunRecorder(config, rank=env.rank, world_size=env.world_size, run_id=shared_run_id(),
                       runs_dir=args.runs_dir, script="fit_levers.py", device=device)
