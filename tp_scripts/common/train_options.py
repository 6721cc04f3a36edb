"""Command-line options of train_classifier.py: grouped, each with a one-line why, checked up front.

A module shared by tp_scripts/train_classifier.py (yours) and tp_scripts/solutions/train_classifier.py
(the reference): it is not part of any TP, you do not need to edit it.

Every check here runs before any process group is joined, so a bad option stops every rank at once
with a short message and exit code 2 (no traceback, no hanging rank).
"""
from __future__ import annotations

import argparse
import difflib
import functools
import importlib.util
import os
import sys
import warnings

MAKE_DATA = "python data/make_synthetic_imagenet.py --out"
NO_DATA = ("no data set: pass --data PATH (an ImageNet-layout folder), --data synthetic, "
           f"or make one with: {MAKE_DATA} data/generated/tiny")
MIN_IMAGE_SIZE = 32  # torchvision ImageNet classifiers downsample by 32: smaller inputs leave no features
AUGMENTATIONS = ("none", "randaugment", "mixup", "cutmix")  # --augment takes one, or several joined by commas
DATA_FORMATS = ("folder", "webdataset", "raw")  # --data-format (storage_formats.py)
OPTIMIZERS = ("sgd", "adamw", "lamb", "lars", "lion")  # built by optim_setup.py (TP3.1)
LR_SCHEDULES = ("constant", "onecycle", "cosine")
LR_SCALINGS = ("none", "linear", "sqrt")
RESNETS = ("resnet", "resnext", "wide_resnet")  # the models --cifar-stem applies to (conv1 + maxpool)


class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def build_parser() -> argparse.ArgumentParser:  # long on purpose: one flat add_argument per option, grouped by TP
    p = argparse.ArgumentParser(
        prog="train_classifier.py",
        formatter_class=Formatter,
        description="Train a torchvision image classifier and record honest timings (DLO-Kit).",
        epilog="examples:\n"
               "  python train_classifier.py --data data/generated/tiny --model resnet18 --image-size 64 --epochs 3\n"
               "  python train_classifier.py --data synthetic --test --amp bf16 --channels-last\n"
               "  torchrun --nproc_per_node=2 train_classifier.py --data $DLOKIT_DATA --test\n"
               "  srun python -u train_classifier.py ...   (one task per GPU; rank from SLURM_PROCID)",
    )
    g = p.add_argument_group("model and data")
    g.add_argument("--model", default="resnet50", help="torchvision classification model name")
    g.add_argument("--data", default=os.environ.get("DLOKIT_DATA"),
                   help="ImageNet-layout folder (train/ and val/ with one folder per class), or 'synthetic' "
                        "for random tensors made once on the device: the compute ceiling, no loading at all "
                        "[default: $DLOKIT_DATA]")
    g.add_argument("--data-format", choices=DATA_FORMATS, default="folder",
                   help="how --data is stored: folder (JPEG files), webdataset (tar shards) or raw (decoded uint8 "
                        "arrays, memory-mapped); the last two are made by data/convert_formats.py")
    g.add_argument("--image-size", type=int, default=224, help="training crop in pixels: cost grows with its square")
    g.add_argument("--num-classes", type=int, default=1000, help="classes in --data synthetic (a folder sets its own)")
    g.add_argument("--synthetic-steps", type=int, default=100, help="steps per epoch in --data synthetic")

    g = p.add_argument_group("training")
    g.add_argument("--batch-size", type=int, default=None,
                   help="images per process per step (default 32); the global batch is this times the processes")
    g.add_argument("--global-batch-size", type=int, default=None,
                   help="alternative to --batch-size: the total per step, split evenly across processes")
    g.add_argument("--epochs", type=int, default=1, help="passes over the training set")
    g.add_argument("--lr", type=float, default=0.1,
                   help="peak learning rate of the schedule, for --base-batch-size images per step when "
                        "--lr-scaling scales it to the global batch")
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    g.add_argument("--weight-decay", type=float, default=5e-5, help="L2 penalty on the weights")
    g.add_argument("--label-smoothing", type=float, default=0.1, help="soften the targets: better calibrated logits")
    g.add_argument("--seed", type=int, default=0, help="same seed, same initial weights and batches")
    g.add_argument("--test", action="store_true", help="short timed run: stop after --test-nsteps steps, no validation")
    g.add_argument("--test-nsteps", type=int, default=50, help="steps of a --test run")

    g = p.add_argument_group("one device: speed (Day 1)")
    g.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where to compute; auto = the GPU when there is one")
    g.add_argument("--amp", choices=["none", "fp16", "bf16"], default="none",
                   help="mixed precision: matrix maths in 16 bits on tensor cores; fp16 also needs loss scaling")
    g.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=False,
                   help="let fp32 matmuls and convolutions use TF32 tensor cores (GPU)")
    g.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=False,
                   help="NHWC memory layout for weights and images: what tensor-core convolutions want")
    g.add_argument("--compile", action="store_true", help="torch.compile the model: fused kernels, slow first steps")
    g.add_argument("--compile-mode", default=None,
                   help="torch.compile mode (implies --compile): default, max-autotune-no-cudagraphs, max-autotune, "
                        "reduce-overhead (CUDA graphs: GPU only) [default: default]")
    g.add_argument("--cudnn-benchmark", action="store_true",
                   help="let cuDNN time its algorithms on the first batches and keep the fastest")
    g.add_argument("--profile", action="store_true",
                   help="torch.profiler trace of a few steps, one file per rank in the run folder (TensorBoard/Perfetto)")
    g.add_argument("--profile-wait", type=int, default=1, help="profiler: steps skipped first")
    g.add_argument("--profile-warmup", type=int, default=2, help="profiler: steps traced but thrown away (warm caches)")
    g.add_argument("--profile-active", type=int, default=3, help="profiler: steps kept in the trace")

    g = p.add_argument_group("when the batch does not fit (Day 1, TP1.5: your fit_levers.py)")
    g.add_argument("--grad-accum", type=int, default=1, metavar="K",
                   help="gradient accumulation: each process's batch in K micro-batches (the activations of one), "
                        "their gradients added up, one optimizer step; under DDP one all-reduce per step (no_sync)")
    g.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=False,
                   help="ResNets: each residual block keeps only its input and runs again in backward (less "
                        "memory, one forward more)")

    g = p.add_argument_group("data loading (Day 2)")
    g.add_argument("--num-workers", type=int, default=0, help="processes decoding images beside the training loop")
    g.add_argument("--pin-memory", action=argparse.BooleanOptionalAction, default=False,
                   help="page-locked host batches: faster, asynchronous copies to the GPU")
    g.add_argument("--non-blocking", action=argparse.BooleanOptionalAction, default=False,
                   help="copy the next batch to the GPU while it still computes")
    g.add_argument("--prefetch-factor", type=int, default=2, help="batches each worker prepares in advance")
    g.add_argument("--persistent-workers", action=argparse.BooleanOptionalAction, default=False,
                   help="keep workers alive between epochs (no restart cost)")
    g.add_argument("--drop-last", action="store_true", help="skip the last, incomplete batch of an epoch")
    g.add_argument("--augment", default="none",
                   help="data augmentation (TP2.4): none, randaugment (per image, in the DataLoader workers), "
                        "mixup or cutmix (per batch, on the device, soft targets); combine with commas, "
                        "e.g. randaugment,mixup (mixup,cutmix: one of the two, at random, per batch)")

    g = p.add_argument_group("several processes (Day 2)")
    g.add_argument("--sync-bn", action="store_true", help="BatchNorm statistics over the global batch (costs a collective per layer)")
    g.add_argument("--find-unused-parameters", action="store_true",
                   help="DDP: tolerate parameters without gradient (multi-head models, stochastic depth); slower")
    g.add_argument("--layer-drop", type=float, default=0.0, metavar="P",
                   help="skip each shape-keeping ResNet block for a whole batch with probability P (stochastic "
                        "depth by the batch): its parameters then have no gradient that step, which DDP refuses "
                        "without --find-unused-parameters")
    g.add_argument("--metric-step", type=int, default=1,
                   help="compute and average loss/accuracy across ranks every k steps: each sync stalls the GPU")
    g.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="DDP: size of the gradient buckets all-reduced together during backward "
                        "[default: DDP's own, 25 MiB]")
    g.add_argument("--static-graph", action="store_true",
                   help="DDP: promise that every step uses the same parameters in the same order "
                        "(DDP then skips some per-step bookkeeping)")
    g.add_argument("--gradient-as-bucket-view", action="store_true",
                   help="DDP: gradients are views into the communication buckets (one copy and one "
                        "gradient-sized buffer less)")

    g = p.add_argument_group("large batches: optimiser, schedule, learning rate (Day 3)")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd",
                   help="sgd and adamw from torch; lamb, lars (layer-wise adaptive: large batches) and lion from timm")
    g.add_argument("--lr-schedule", choices=LR_SCHEDULES, default="onecycle",
                   help="constant, onecycle (rises over the first 30%% or the warm-up, then anneals) or cosine")
    g.add_argument("--warmup-steps", type=int, default=0,
                   help="linear warm-up to the peak lr over the first k steps (constant, cosine; onecycle: its rise)")
    g.add_argument("--warmup-epochs", type=float, default=0,
                   help="the warm-up in epochs instead of steps (may be a fraction)")
    g.add_argument("--lr-scaling", choices=LR_SCALINGS, default="none",
                   help="peak lr = --lr x (global batch / --base-batch-size) (linear) or its square root (sqrt)")
    g.add_argument("--base-batch-size", type=int, default=256, help="the global batch --lr was tuned for")
    g.add_argument("--cifar-stem", action="store_true",
                   help="ResNets on 32 px images: a 3x3 stride-1 first convolution and no max-pool (CIFAR-style), "
                        "instead of 7x7 stride 2 + pool that leave 8x8 pixels to the first block")
    g.add_argument("--lr-finder", action="store_true",
                   help="LR range test instead of training: --lr-finder-trials log-spaced lrs, each trained "
                        "--lr-finder-steps steps from the same initial weights with a fresh optimiser")
    g.add_argument("--lr-finder-min", type=float, default=1e-7, help="smallest lr tried")
    g.add_argument("--lr-finder-max", type=float, default=10.0, help="largest lr tried")
    g.add_argument("--lr-finder-trials", type=int, default=16, help="learning rates tried, log-spaced")
    g.add_argument("--lr-finder-steps", type=int, default=8,
                   help="training steps per trial (the same batches each time)")
    g.add_argument("--lr-finder-optimizers", default=None,
                   help="comma list: one range test per optimiser, each from the same initial weights (the "
                        "summary's suggestion stays --optimizer's) [default: --optimizer alone]")

    g = p.add_argument_group("results tracking (Day 3)")
    g.add_argument("--tensorboard", action="store_true",
                   help="TensorBoard event files in <runs-dir>/<run-id>/tensorboard (rank 0): loss, acc, lr, "
                        "img/s, val")
    g.add_argument("--wandb", action="store_true",
                   help="Weights & Biases, offline (needs the wandb package; sync later with `wandb sync`; "
                        "a key is only ever read from $WANDB_API_KEY, never from an option)")

    g = p.add_argument_group("checkpoints and records")
    g.add_argument("--checkpoint-steps", type=int, default=0, help="save a checkpoint every k steps (0 = never)")
    g.add_argument("--checkpoint-epochs", action="store_true", help="save a checkpoint at the end of each epoch")
    g.add_argument("--checkpoint-path", default=None, help="where to save [default: <runs-dir>/<run-id>/checkpoint.pt]")
    g.add_argument("--checkpoint-on-signal", action="store_true",
                   help="on SIGUSR1/SIGUSR2 (Slurm's --signal before the time limit) save a checkpoint at the next "
                        "step and exit with code 75, to be run again with --resume (dlokit.race jobs requeue)")
    g.add_argument("--resume", default=None, help="checkpoint file (or a run folder holding checkpoint.pt) to continue from")
    g.add_argument("--runs-dir", default=None, help="where run records go [default: $DLOKIT_RUNS_DIR or ./runs]")
    g.add_argument("--print-every", type=int, default=20, help="rank 0 prints a progress line every k steps")
    g.add_argument("--breakdown-every", type=int, default=10,
                   help="GPU: split one step in k (and the first timed one) into data/h2d/augment/forward/"
                        "backward/optimizer times, synchronising at each boundary; the other steps keep "
                        "the CPU/GPU overlap and are timed whole (CPU: every step is split)")
    return p


def model_names() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def check_model(parser, name: str, image_size: int) -> None:
    """Unknown names and image sizes the model cannot take are refused before anything starts."""
    names = model_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
        hint = f"did you mean: {', '.join(close)}?" if close else f"choose from: {', '.join(names)}"
        parser.error(f"unknown model '{name}'; {hint}")
    if image_size < MIN_IMAGE_SIZE:
        parser.error(f"--image-size {image_size} is too small: ImageNet models downsample by 32, "
                     f"use at least {MIN_IMAGE_SIZE} px")
    problem = dry_run(name, image_size)
    if problem is not None:
        parser.error(f"model '{name}' cannot take {image_size} px images ({problem}); try a larger --image-size")


@functools.lru_cache(maxsize=None)
def dry_run(name: str, image_size: int) -> str | None:
    """Why the model cannot take images of this size (None: it can), from a forward pass on the meta device: shapes
    only, no memory, no compute. Cached: ~0.5 s for resnet50 at 224 px, and a GPU plan parses dozens of jobs."""
    import torch
    import torchvision

    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = torchvision.models.get_model(name, num_classes=10).eval()
            model(torch.empty(2, 3, image_size, image_size))
    except Exception as error:
        return (str(error).splitlines() or [type(error).__name__])[0][:120]
    return None


def check_options(parser, args, world_size: int, cuda_available: bool) -> None:
    if args.batch_size is not None and args.global_batch_size is not None:
        parser.error("give --batch-size (per process) or --global-batch-size, not both")
    if args.global_batch_size is not None:
        if args.global_batch_size % world_size:
            parser.error(f"--global-batch-size {args.global_batch_size} is not divisible by the "
                         f"{world_size} processes of this job")
        args.batch_size = args.global_batch_size // world_size
    args.batch_size = 32 if args.batch_size is None else args.batch_size
    if args.batch_size < 2:
        parser.error("--batch-size must be at least 2: BatchNorm needs two samples to compute statistics")
    for name in ("epochs", "test_nsteps", "metric_step", "print_every", "synthetic_steps", "prefetch_factor",
                 "breakdown_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.num_workers < 0 or args.checkpoint_steps < 0:
        parser.error("--num-workers and --checkpoint-steps cannot be negative")
    if args.device == "cuda" and not cuda_available:
        parser.error("--device cuda: this machine has no usable GPU (torch.cuda.is_available() is False)")
    on_gpu = cuda_available and args.device != "cpu"
    if args.sync_bn and not on_gpu:
        parser.error("--sync-bn needs GPUs: PyTorch's SyncBatchNorm only works with GPU modules")
    if args.amp == "fp16" and not on_gpu:
        parser.error("--amp fp16 is refused on the CPU: CPU autocast computes in bfloat16, and fp16 loss "
                     "scaling is a GPU technique; use --amp bf16 (same 16-bit speed-up idea, no scaler needed)")
    if args.resume is not None and not os.path.exists(args.resume):
        parser.error(f"--resume {args.resume}: no such file or folder")
    if args.bucket_cap_mb is not None and args.bucket_cap_mb <= 0:
        parser.error("--bucket-cap-mb must be positive")
    if not 0 <= args.layer_drop < 1:
        parser.error(f"--layer-drop {args.layer_drop}: a probability, at least 0 and below 1")
    if args.layer_drop and not args.model.startswith(("resnet", "resnext", "wide_resnet")):
        parser.error(f"--layer-drop skips residual blocks: {args.model} is not a ResNet (try resnet18)")
    args.augment = check_augment(parser, args.augment, args.data)
    check_levers(parser, args)
    check_compile(parser, args, on_gpu)
    check_large_batch_options(parser, args, world_size)


def check_levers(parser, args) -> None:
    """--grad-accum: equal micro-batches of two images or more (BatchNorm); --activation-checkpointing: a ResNet."""
    k = args.grad_accum
    if k < 1 or args.batch_size % k or args.batch_size // k < 2:
        parser.error(f"--grad-accum {k}: the batch of {args.batch_size} per process must split into {k} equal "
                     "micro-batches of 2 images or more (BatchNorm needs two)")
    if args.activation_checkpointing and not args.model.startswith(RESNETS):
        parser.error(f"--activation-checkpointing checkpoints a ResNet's residual blocks; {args.model} is not a ResNet")
    if args.lr_finder and (k > 1 or args.activation_checkpointing):
        parser.error("--lr-finder trains its trials whole-batch: leave out --grad-accum and --activation-checkpointing")


def check_large_batch_options(parser, args, world_size: int) -> None:
    """Day 3: learning rate, warm-up, LR range test, trackers."""
    if args.lr <= 0 or args.base_batch_size < 1:
        parser.error("--lr must be positive and --base-batch-size at least 1")
    if args.warmup_steps < 0 or args.warmup_epochs < 0:
        parser.error("--warmup-steps and --warmup-epochs cannot be negative")
    if args.warmup_steps and args.warmup_epochs:
        parser.error("give --warmup-steps or --warmup-epochs, not both")
    if args.cifar_stem and not args.model.startswith(RESNETS):
        parser.error(f"--cifar-stem replaces a ResNet's first convolution and max-pool; {args.model} is not a ResNet")
    if args.lr_finder:
        if world_size > 1:
            parser.error(f"--lr-finder runs in one process ({world_size} here): every trial restarts from the "
                         "same weights, there is nothing to share; submit it on one GPU / one task")
        if not 0 < args.lr_finder_min < args.lr_finder_max:
            parser.error("--lr-finder-min must be positive and smaller than --lr-finder-max")
        if args.lr_finder_trials < 2 or args.lr_finder_steps < 1:
            parser.error("--lr-finder-trials must be at least 2 and --lr-finder-steps at least 1")
        if args.amp == "fp16":
            parser.error("--lr-finder runs in fp32 or --amp bf16 (no loss scaling in its trials)")
    names = [name.strip() for name in (args.lr_finder_optimizers or args.optimizer).split(",") if name.strip()]
    unknown = [name for name in names if name not in OPTIMIZERS]
    if unknown or not names:
        parser.error(f"--lr-finder-optimizers: unknown {', '.join(unknown) or 'empty list'}; choose among "
                     f"{', '.join(OPTIMIZERS)}")
    if args.lr_finder_optimizers and not args.lr_finder:
        parser.error("--lr-finder-optimizers goes with --lr-finder")
    args.lr_finder_optimizers = list(dict.fromkeys([args.optimizer, *names] if args.lr_finder_optimizers else names))
    for flag, package, hint in (("--tensorboard", "tensorboard", "pip install tensorboard"),
                                ("--wandb", "wandb", "pip install wandb; or use --tensorboard")):
        if getattr(args, flag[2:]) and importlib.util.find_spec(package) is None:
            parser.error(f"{flag}: the {package} package is not installed in this Python ({hint})")


def check_compile(parser, args, on_gpu: bool) -> None:
    """--compile-mode: a mode torch.compile knows, that this device can run, with a compiler to build it."""
    from .compile_support import CUDA_GRAPH_MODES, compile_modes, missing_compiler

    if args.compile_mode is not None:
        args.compile = True
        if args.compile_mode not in compile_modes():
            parser.error(f"--compile-mode {args.compile_mode}: choose from {', '.join(compile_modes())}")
        if args.compile_mode in CUDA_GRAPH_MODES and not on_gpu:
            parser.error(f"--compile-mode {args.compile_mode} uses CUDA graphs: GPU only")
    if args.compile:
        args.compile_mode = args.compile_mode or "default"
        problem = missing_compiler("cuda" if on_gpu else "cpu")
        if problem:
            parser.error(f"--compile: {problem}")


def augmentations(text: str) -> list[str]:
    """'randaugment,mixup' -> ['randaugment', 'mixup']; 'none' -> []."""
    return [name for name in text.split(",") if name != "none"]


def check_augment(parser, text: str, data) -> str:
    """The --augment list, checked and put in a canonical order ('mixup,randaugment' -> 'randaugment,mixup')."""
    names = [name.strip().lower() for name in text.split(",") if name.strip()] or ["none"]
    unknown = [name for name in names if name not in AUGMENTATIONS]
    if unknown:
        parser.error(f"--augment {text}: unknown {', '.join(unknown)}; choose from {', '.join(AUGMENTATIONS)} "
                     "(several joined by commas)")
    if "none" in names and len(names) > 1:
        parser.error(f"--augment {text}: 'none' cannot be combined with another augmentation")
    if "randaugment" in names and data == "synthetic":
        parser.error("--augment randaugment needs image files: --data synthetic makes its batches on the device, "
                     "with no per-image transform to extend")
    return ",".join(name for name in AUGMENTATIONS if name in names)


def parse_args(argv=None, world_size: int = 1, cuda_available: bool | None = None):
    """Parse and check every option; the data set is checked by image_data.check_image_folder."""
    import torch

    parser = build_parser()
    args = parser.parse_args(argv)
    cuda_available = torch.cuda.is_available() if cuda_available is None else cuda_available
    check_options(parser, args, world_size, cuda_available)
    check_model(parser, args.model, args.image_size)
    if args.data is None:  # neither --data nor $DLOKIT_DATA
        refuse(parser, NO_DATA)
    if args.data == "synthetic" and args.data_format != "folder":
        parser.error(f"--data-format {args.data_format} reads files: --data synthetic has none")
    if args.data != "synthetic" and args.data_format != "folder":
        from .storage_formats import DataSetError, check_converted

        try:
            check_converted(args.data, args.data_format, world_size)
        except DataSetError as error:
            refuse(parser, str(error))
    elif args.data != "synthetic":
        from .image_data import DataSetError, check_image_folder

        try:
            check_image_folder(args.data)
        except DataSetError as error:
            hint = "" if os.path.isdir(os.path.join(args.data, "train")) else \
                f"; pass --data synthetic, or make one with: {MAKE_DATA} {args.data}"
            refuse(parser, f"{error}{hint}")
    return args


def refuse(parser, message: str) -> None:
    """A data set problem: one line on stderr, exit code 2 (the usage text would only hide the sentence)."""
    parser.exit(2, f"{parser.prog}: error: {message}\n")


if __name__ == "__main__":  # python train_options.py --help
    build_parser().print_help(sys.stdout)
