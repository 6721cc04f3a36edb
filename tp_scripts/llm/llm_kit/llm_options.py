"""Every option of train_llm.py, the check of a combination against the world size and the model before any process
group starts (ArgumentsError: the script says why and exits with code 2), and what the options ask of the process
(its process group, --tf32), the same in train_llm.py and train_deepspeed.py."""
from __future__ import annotations

import argparse
from pathlib import Path

from .parallel_dims import ParallelDims

MODES = ("single", "ddp", "zero1", "fsdp", "hsdp", "pp", "tp-scratch", "tp", "fsdp-tp", "cp")


class ArgumentsError(ValueError):
    """A combination of options that cannot run; reported before any process group starts."""


def megabytes(text: str) -> float:
    """--memory-limit's value: a positive number of MiB (0 or less would refuse every allocation, or none)."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give each rank's memory in MiB, a number above 0")
    return value


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="train_llm.py", description="Train the Llama-style model under the parallel layout --mode names; write a run record.")
    p.add_argument("--mode", choices=MODES, default="single")
    p.add_argument("--config", default="tiny", help="tiny, tiny-tied, small, oom-demo, scan-demo, 125m, 1b, 3b")
    p.add_argument("--data", choices=("random", "text"), default="random")
    p.add_argument("--batch-size", type=int, default=8, help="global batch, in sequences")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                   help="compute dtype: FSDP's param_dtype, autocast elsewhere; weights stay fp32")
    p.add_argument("--tf32", action="store_true", help="fp32 matmuls on TF32 tensor cores (CUDA)")
    p.add_argument("--reduce-dtype", choices=("fp32", "bf16"), default="fp32", help="FSDP gradient reduction dtype")
    p.add_argument("--fsdp-reduce-op", choices=("auto", "avg", "sum"), default="auto",
                   help="FSDP gradient averaging: the backend's AVG (avg), SUM then a division (sum), or AVG "
                        "where a probe finds it exact, else SUM (auto)")
    p.add_argument("--cpu-offload", action="store_true", help="FSDP: keep sharded params/grads/optimizer on the host")
    p.add_argument("--no-reshard-after-forward", action="store_true", help="FSDP: keep gathered weights for backward")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--grad-accum", type=int, default=1, metavar="N",
                   help="micro-batches per optimizer step: each rank's batch cut into N forward-backwards, its "
                        "activations 1/N; DDP and FSDP2 synchronise the gradients on the last one only")
    p.add_argument("--compile", action="store_true", help="torch.compile each block")
    p.add_argument("--meta-init", action="store_true",
                   help="FSDP modes: build on the meta device, allocate each rank's shards only (big configs)")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel degree of fsdp-tp")
    p.add_argument("--dp-replicate", type=int, default=2, help="replicas of hsdp (each sharded over the others)")
    p.add_argument("--sequence-parallel", action="store_true", help="tp/fsdp-tp: split norms' activations by sequence")
    p.add_argument("--cp-attention", choices=("auto", "ring", "allgather", "torch"), default="auto",
                   help="cp: the ring attention from scratch or all-gathered keys/values (any device), PyTorch's "
                        "ring attention (CUDA), or auto: PyTorch's where it runs, else the ring from scratch")
    p.add_argument("--pp-schedule", choices=("naive", "gpipe", "1f1b", "interleaved"), default="gpipe")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--pp-virtual", type=int, default=2, help="stages per rank of the interleaved schedule")
    p.add_argument("--grad-norm", action="store_true", help="log the global gradient norm every step")
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the summary's means")
    p.add_argument("--checkpoint-dir", default=None, help="save a sharded checkpoint there at the end")
    p.add_argument("--checkpoint-step", type=int, default=None,
                   help="save it after this step instead (the run goes on to --steps) [default: the last step]")
    p.add_argument("--resume", action="store_true", help="start from --checkpoint-dir")
    p.add_argument("--memory-limit", type=megabytes, default=None, metavar="MB",
                   help="memory for this rank's tensors, as a device of that size would give (device_memory.py)")
    p.add_argument("--runs-dir", default=None)
    return p.parse_args(argv)


def plan_degrees(args, config, world: int) -> ParallelDims:
    """Check the options against the world size and the config; return the parallel degrees."""
    if args.mode == "single" and world != 1:
        raise ArgumentsError(f"--mode single runs one process, got world size {world}; pick a parallel mode")
    if args.mode != "single" and world == 1:
        raise ArgumentsError(f"--mode {args.mode} needs several processes (torchrun --nproc_per_node=N or srun)")
    if args.mode == "hsdp" and (args.dp_replicate < 2 or world % args.dp_replicate or world // args.dp_replicate < 2):
        raise ArgumentsError(f"--mode hsdp needs --dp-replicate >= 2 dividing the world size {world} into shards "
                             f"of 2 or more ranks (got --dp-replicate {args.dp_replicate})")
    dims = ParallelDims.for_mode(args.mode, world, tp=args.tp, dp_replicate=args.dp_replicate)
    tp, pp, cp = dims.tp, dims.pp, dims.cp
    if tp < 1 or world % (tp * pp * cp) or dims.world_size != world:
        raise ArgumentsError(f"world size {world} is not divisible by tp x pp x cp = {tp} x {pp} x {cp}")
    if tp > 1:
        for name in ("n_heads", "n_kv_heads", "ffn_dim"):
            if getattr(config, name) % tp:
                raise ArgumentsError(f"{name} = {getattr(config, name)} is not divisible by the tensor-parallel degree {tp}")
        if args.sequence_parallel and args.seq_len % tp:
            raise ArgumentsError(f"--seq-len {args.seq_len} is not divisible by tp = {tp} (sequence parallel)")
    if pp > 1:
        virtual = args.pp_virtual if args.pp_schedule == "interleaved" else 1
        microbatches = 1 if args.pp_schedule == "naive" else args.microbatches
        if config.n_layers % (pp * virtual):
            raise ArgumentsError(f"n_layers = {config.n_layers} is not divisible by pp x virtual stages = {pp} x {virtual}")
        if args.batch_size % microbatches:
            raise ArgumentsError(f"--batch-size {args.batch_size} is not divisible by --microbatches {microbatches}")
    if cp > 1 and args.seq_len % (2 * cp):
        raise ArgumentsError(f"--seq-len {args.seq_len} must divide by 2 x cp = {2 * cp} (load-balanced chunks)")
    if args.compile and dims.tp_scratch:
        raise ArgumentsError("--compile cannot trace tp-scratch's hand-written all-reduces (dist.all_reduce inside "
                             "an autograd.Function, timed by the host or CUDA events): use --mode tp to compile")
    fsdp_modes = [m for m in MODES if ParallelDims.for_mode(m, 4).fsdp]
    if args.meta_init and not dims.fsdp:
        raise ArgumentsError(f"--meta-init allocates each rank's FSDP shards: use it with {', '.join(fsdp_modes)}")
    if args.cpu_offload and not dims.fsdp:
        raise ArgumentsError(f"--cpu-offload is FSDP's: use it with {', '.join(fsdp_modes)}")
    if args.batch_size % dims.dp:
        raise ArgumentsError(f"--batch-size {args.batch_size} is not divisible by the data-parallel degree {dims.dp}")
    if args.grad_accum < 1 or (args.batch_size // dims.dp) % args.grad_accum:
        raise ArgumentsError(f"--grad-accum {args.grad_accum}: each rank's {args.batch_size // dims.dp} sequences must "
                             "split into that many micro-batches (1 or more)")
    if args.grad_accum > 1 and pp > 1:
        raise ArgumentsError("--grad-accum with a pipeline: its schedule cuts the batch into --microbatches already")
    if (args.resume or args.checkpoint_step is not None) and not args.checkpoint_dir:
        raise ArgumentsError(f"{'--resume' if args.resume else '--checkpoint-step'} needs --checkpoint-dir")
    if args.checkpoint_step is not None and not 1 <= args.checkpoint_step <= args.steps:
        raise ArgumentsError(f"--checkpoint-step {args.checkpoint_step}: a step from 1 to --steps ({args.steps})")
    if args.resume and not (Path(args.checkpoint_dir) / ".metadata").exists():
        raise ArgumentsError(f"--resume: no checkpoint in {args.checkpoint_dir} (no .metadata file): check the folder, "
                             "or leave --resume out to start from step 0")
    return dims


def setup_device(args):
    """Join the job's process group (dlokit's rank bootstrap, with process_group_backend's backend) and set --tf32's
    maths flags (common.device_setup.set_tf32, the classifier's); returns this rank's device."""
    import torch

    from common.device_setup import set_tf32
    from dlokit.in_job import rank

    device = rank.init_process_group(backend=process_group_backend(args, torch.cuda.is_available()))
    set_tf32(args.tf32)
    return device


def process_group_backend(args, cuda: bool) -> str | None:
    """None: the default (nccl on GPU, gloo on CPU). FSDP's CPU offload keeps gradients on the host,
    and the gradient norm reduces them there: that needs gloo beside nccl."""
    if cuda and args.cpu_offload:
        return "cpu:gloo,cuda:nccl"
    return None
