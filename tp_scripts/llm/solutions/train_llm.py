"""Train the Llama-style model under the parallel layout --mode names; write a run record.

    python train_llm.py --config tiny --data text --steps 50                         # one process
    torchrun --nproc_per_node=2 train_llm.py --mode ddp                              # or zero1, fsdp
    torchrun --nproc_per_node=2 train_llm.py --mode fsdp --dtype bf16 --activation-checkpointing
    torchrun --nproc_per_node=4 train_llm.py --mode hsdp --dp-replicate 2            # 2 replicas x 2 shards
    torchrun --nproc_per_node=2 train_llm.py --mode pp --pp-schedule 1f1b --microbatches 4
    torchrun --nproc_per_node=2 train_llm.py --mode tp-scratch        # or tp (DTensor), --sequence-parallel
    torchrun --nproc_per_node=4 train_llm.py --mode fsdp-tp --tp 2    # 2-D mesh: 2 (FSDP) x 2 (TP)
    torchrun --nproc_per_node=2 train_llm.py --mode cp                # the sequence split over 2 ranks
    srun --ntasks=2 python train_llm.py --mode fsdp                  # rank from SLURM_PROCID

The Day 4 script. `--mode` names a set of parallel degrees
(pp, dp_replicate, dp_shard, cp, tp: parallel_dims.py); parallelize.py applies them to the plain
model (model.py) on one device mesh, in torchtitan's order. main() lists what happens, train() the
steps of a run, train_step() one optimizer step. Beside this script, in tp_scripts/llm/: the model,
the data, checkpoints, each parallelism's module, memory_meter.py (what each rank holds, from its
tensors) and collectives.py (which collectives a step issues). Every mode can save a checkpoint
(--checkpoint-dir) and resume from one saved by any other (--resume): DCP reshards.
Exit codes: 0 done (or cleanly skipped), 1 failed, 2 bad arguments, 3 out of memory on this rank
(recorded as status "oom"), 4 stopped because another rank failed (status "aborted", with its cause).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from dlokit import rank as dlorank
from dlokit.measure import EnergyMeter, StepTimer, peak_gpu_memory_mb, peak_rss_mb
from dlokit.runrecord import RunRecorder, shared_run_id

# The shared modules live in tp_scripts/llm/: beside your copy of this script, one folder up from the solution
# (searched right after this script's folder, before site-packages: a package there may have the same name).
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from checkpoint import load_checkpoint, save_checkpoint
from collectives import CollectiveLog
from data import TokenBatches
from device_memory import data_mb, limit_memory
from failures import EXIT_FAILED, EXIT_OOM, FailureWatch, exit_now, is_out_of_memory
from grad_norm import global_grad_norm
from memory_meter import MemoryMeter
from mfu import arithmetic, mfu, peak_flops, tf32_enabled
from model import Llama, count_params, flops_per_token, get_config, loss_fn
from parallel_cp import choose_cp_attention
from parallel_dims import ParallelDims
from parallelize import parallelize

MODES = ("single", "ddp", "zero1", "fsdp", "hsdp", "pp", "tp-scratch", "tp", "fsdp-tp", "cp")


class ArgumentsError(ValueError):
    """A combination of options that cannot run; reported before any process group starts."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=MODES, default="single")
    p.add_argument("--config", default="tiny", help="tiny, small, oom-demo, 125m, 1b, 3b")
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
    p.add_argument("--resume", action="store_true", help="start from --checkpoint-dir")
    p.add_argument("--memory-limit", type=float, default=None, metavar="MB",
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
        if config.tie_embeddings:
            raise ArgumentsError("pipeline stages cannot share the tied embedding/output weight; use an untied config")
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
    if args.resume and not args.checkpoint_dir:
        raise ArgumentsError("--resume needs --checkpoint-dir")
    if args.resume and not (Path(args.checkpoint_dir) / ".metadata").exists():
        raise ArgumentsError(f"--resume: no checkpoint in {args.checkpoint_dir} (no .metadata file): check the folder, "
                             "or leave --resume out to start from step 0")
    return dims


def process_group_backend(args, cuda: bool) -> str | None:
    """None: the default (nccl on GPU, gloo on CPU). FSDP's CPU offload keeps gradients on the host,
    and the gradient norm reduces them there: that needs gloo beside nccl."""
    if cuda and args.cpu_offload:
        return "cpu:gloo,cuda:nccl"
    return None


def main(argv=None) -> int:
    args = parse_args(argv)
    env = dlorank.detect()
    try:
        config = get_config(args.config, max_seq_len=args.seq_len)
        dims = plan_degrees(args, config, env.world_size)
    except (ValueError, ArgumentsError) as error:
        print(f"train_llm.py: error: {error}", file=sys.stderr, flush=True)
        return 2
    device = dlorank.init_process_group(backend=process_group_backend(args, torch.cuda.is_available()))
    if args.tf32:
        torch.set_float32_matmul_precision("high")
    torch.manual_seed(args.seed)
    recorder = start_record(args, config, dims.degrees(), env, device)

    def stopped_by_peer(cause):
        print(f"[train_llm] rank {env.rank}: stopping, {cause}", file=sys.stderr, flush=True)
        recorder.finish(status="aborted", error=f"stopped because {cause}")

    watch = FailureWatch(env.rank, env.world_size, stopped_by_peer).start()
    try:
        status = train(args, config, dims, env, device, recorder)
        if dist.is_initialized():
            dist.barrier()  # every rank is done; a failure before this point is still watched
    except Exception as error:
        if is_out_of_memory(error):
            out_of_memory(error, args, env, device, recorder, watch)
        cause = watch.peer_failure()  # this rank's collective may have failed because a peer died
        if cause:
            watch.stop_for_peer(cause)
        traceback.print_exc()
        recorder.finish(status="failed", error=f"{type(error).__name__}: {error}")
        watch.announce(f"failed: {type(error).__name__}: {error}")
        exit_now(EXIT_FAILED)
    watch.stop()
    if dist.is_initialized():
        dist.barrier()  # every watcher has stopped before any rank leaves (rank 0 may host the store)
    dlorank.destroy_process_group()
    return status


def start_record(args, config, degrees, env, device) -> RunRecorder:
    run_id = shared_run_id()
    n_params = count_params(config)
    config_record = {**vars(args), **degrees, "world_size": env.world_size, "n_params": n_params,
                     "flops_per_token": flops_per_token(config, args.seq_len), "model": config.__dict__,
                     "process_group_backend": dist.get_backend() if dist.is_initialized() else None}
    if env.is_main:
        print(f"[train_llm] mode={args.mode} config={args.config} ({n_params / 1e6:.2f} M params) "
              f"degrees={degrees} run={run_id}", flush=True)
    return RunRecorder(config_record, rank=env.rank, world_size=env.world_size, run_id=run_id,
                       runs_dir=args.runs_dir, script="train_llm.py", device=device)


def out_of_memory(error, args, env, device, recorder, watch):
    message = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    print(f"[train_llm] rank {env.rank}: OUT OF MEMORY in mode {args.mode} with config {args.config}: "
          f"{message}", file=sys.stderr, flush=True)
    recorder.log("event", event="oom", error=message)
    recorder.finish(status="oom", error=message, gpu_mem_peak_mb=peak_gpu_memory_mb(device),
                    host_rss_peak_mb=peak_rss_mb())
    watch.announce(f"ran out of memory: {message}")
    exit_now(EXIT_OOM)


# ---- one run: parallelize, optimizer, resume, steps, checkpoint, summary --------------------------

@dataclass
class Run:
    args: object
    config: object
    dims: ParallelDims
    device: torch.device
    recorder: RunRecorder
    is_main: bool
    rank: int
    parallel: object = None
    optimizer: object = None
    data: TokenBatches = None
    autocast: object = None
    timer: StepTimer = None
    history: list = field(default_factory=list)
    extra_summary: dict = field(default_factory=dict)  # the first step's memory and collectives, CP's choice


def train(args, config, dims, env, device, recorder) -> int:
    run = Run(args, config, dims, device, recorder, env.is_main, env.rank)
    mesh = dims.build_mesh(device.type)
    cp_attention = choose_context_parallel_attention(run, mesh) if dims.has("cp") else None
    if dims.has("cp") and cp_attention is None:
        return 0
    if args.memory_limit:  # right before the model: what the model, its layout and its steps allocate counts
        run.extra_summary.update(limit_memory(args.memory_limit, device))
    with torch.device("meta" if args.meta_init else device):
        model = Llama(config)
    run.parallel = parallelize(model, dims, mesh, args, device, cp_attention=cp_attention)
    run.optimizer = build_optimizer(args, run.parallel.modules, dims, run.parallel.dp_group)
    start_step = resume(run) if args.resume else 0
    run.data = TokenBatches(args.data, config.vocab_size, args.batch_size, args.seq_len, seed=args.seed)
    # FSDP computes in --dtype itself (param_dtype); the other modes compute under autocast.
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    run.autocast = (torch.autocast(device.type, dtype=dtype)
                    if dtype != torch.float32 and not run.parallel.fsdp_casts else nullcontext())
    run.timer = StepTimer(device)
    meter = Meter(run)
    for step in range(start_step, args.steps):
        loss, norm, splits = train_step(run, step, measure=step == start_step)
        meter.log_step(step, loss, norm, splits)
    if args.checkpoint_dir:
        save_checkpoint(args.checkpoint_dir, run.parallel.checkpoint_module, checkpointed(run.optimizer), args.steps,
                        run.parallel.split_mesh)
        recorder.log("event", event="checkpoint_saved", step=args.steps, checkpoint_dir=args.checkpoint_dir)
    meter.finish(start_step)
    return 0


def choose_context_parallel_attention(run, mesh) -> str | None:
    """The attention --cp-attention gets here (recorded with why); None: it cannot run here (PyTorch's
    ring attention has no CPU kernel), and the run is recorded as skipped, with the reason."""
    attention, reason = choose_cp_attention(run.args.cp_attention, mesh["cp"], run.device)
    if attention is None:
        if run.is_main:
            print(f"[train_llm] SKIPPED context parallelism: {reason}", flush=True)
        run.recorder.log("event", event="skipped", reason=reason)
        run.recorder.finish(status="skipped", reason=reason)
    run.extra_summary.update(cp_attention=attention, cp_attention_reason=reason)
    return attention


def build_optimizer(args, modules, dims, dp_group):
    params = [p for module in modules for p in module.parameters()]
    adamw = {"lr": args.lr, "weight_decay": args.weight_decay, "betas": (0.9, 0.95)}
    if dims.zero1:
        from torch.distributed.optim import ZeroRedundancyOptimizer  # a second to import: only where it is used

        # >>> SOLUTION TP4.1: ZeRO-1: each replica keeps the AdamW states (2 x 4 bytes a weight) of its share of the weights only
        # ZeroRedundancyOptimizer gives each rank a partition of the parameters; after the all-reduced
        # gradients, each rank updates its partition and broadcasts the new weights to the others.
        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, process_group=dp_group, **adamw)
        # --- STUDENT
        # return torch.optim.AdamW(params, **adamw)
        # <<< SOLUTION
    return torch.optim.AdamW(params, **adamw)


def checkpointed(optimizer):
    """What the checkpoint saves of the optimizer: ZeRO-1's own partition (its inner AdamW), under the
    weights' full names; DCP puts the partitions of every rank together."""
    return optimizer.optim if type(optimizer).__name__ == "ZeroRedundancyOptimizer" else optimizer


def resume(run) -> int:
    step = load_checkpoint(run.args.checkpoint_dir, run.parallel.checkpoint_module, checkpointed(run.optimizer),
                           run.parallel.split_mesh)
    run.recorder.log("event", event="resumed", step=step, checkpoint_dir=run.args.checkpoint_dir)
    return step


def train_step(run, step: int, measure: bool):
    """One optimizer step on the global batch `step`; on the measured step, what each rank holds and
    which collectives it issues are kept for the summary (run.extra_summary)."""
    parallel, timer = run.parallel, run.timer
    timer.start()
    inputs, targets = run.data.local_batch(step, parallel.data_rank, parallel.data_size)
    timer.split("data")
    inputs, targets = inputs.to(run.device, non_blocking=True), targets.to(run.device, non_blocking=True)
    timer.split("h2d")
    memory = (MemoryMeter(parallel.modules, run.optimizer, run.device, fsdp=run.dims.fsdp,
                          checkpointed=run.args.activation_checkpointing) if measure else None)
    collectives = CollectiveLog() if measure and not run.args.compile else nullcontext()
    with collectives:
        with memory.forward() if memory else nullcontext():
            loss = forward_backward(run, inputs, targets)
        if memory:
            memory.after_backward()
        norm = (global_grad_norm(parallel.modules, run.device, parallel.tp_group, parallel.pp_group)
                if run.args.grad_norm else None)
        run.optimizer.step()
        if memory:
            memory.after_step()
        run.optimizer.zero_grad(set_to_none=True)
    timer.split("optimizer")  # on CUDA: after a synchronisation, so the section timers can be read
    if measure:
        run.extra_summary.update(memory_bytes=memory.bytes(),
                            collectives_per_step=collectives.summary() if isinstance(collectives, CollectiveLog) else None)
    for group in parallel.loss_groups:  # ranks that saw other tokens: the global-batch mean
        dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=group)
    return loss.item(), norm, dict(timer.splits)


def forward_backward(run, inputs, targets):
    parallel, timer = run.parallel, run.timer
    if parallel.pipeline is not None:  # the schedule runs every micro-batch's forward and backward
        with run.autocast:
            loss = parallel.pipeline.step(inputs, targets)
        timer.split("fwd_bwd")
        return loss
    with parallel.context(inputs, targets), run.autocast:
        model_args, model_kwargs, local_targets = parallel.prepare(inputs, targets)
        loss = loss_fn(parallel.modules[0](*model_args, **model_kwargs), local_targets)
        timer.split("forward")
        loss.backward()
    timer.split("backward")
    return loss.detach()


# ---- what the run measured: step lines and the summary ---------------------------------------------

class Meter:
    """Turns each step's loss and section times into a metrics line, and the run into its summary."""

    def __init__(self, run):
        self.run = run
        args, device = run.args, run.device
        self.tokens_per_step = args.batch_size * args.seq_len
        self.fpt = flops_per_token(run.config, args.seq_len)
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.peak, self.peak_basis = peak_flops(device, arithmetic(args.dtype, tf32_enabled()))
        if run.is_main and self.peak is None:
            print(f"[train_llm] MFU not computed: {self.peak_basis}", flush=True)
        self.energy = EnergyMeter(device)

    def log_step(self, step, loss, norm, splits):
        run, args = self.run, self.run.args
        parallel = run.parallel
        t_step = sum(v for k, v in splits.items() if k != "data")
        t_total = t_step + splits["data"]
        fields = {
            "epoch": 0, "step": step + 1, "lr": args.lr, "loss": loss, "batch_size": args.batch_size,
            "t_data": splits["data"], "t_h2d": splits["h2d"],
            "t_forward": splits.get("forward"), "t_backward": splits.get("backward"),
            "t_fwd_bwd": splits.get("fwd_bwd"), "t_optimizer": splits["optimizer"], "t_step": t_step,
            "throughput_train": args.batch_size / t_total, "throughput_compute": args.batch_size / t_step,
            "tokens_per_s": self.tokens_per_step / t_total,
            "mfu": mfu(self.tokens_per_step / t_total, self.fpt, self.world, self.peak),
            "comm_s": parallel.comm.take() if parallel.comm is not None else None,
            "grad_norm": norm, "gpu_mem_mb": peak_gpu_memory_mb(run.device),
        }
        events = []
        if parallel.pipeline is not None:
            stats = parallel.pipeline.take_stats()
            idle = stats.get("idle_fraction")
            fields.update(pp_busy_s=stats["busy_s"], pp_span_s=stats.get("span_s"),
                          pp_peak_in_flight=stats["peak_in_flight"], pp_order=stats["order"],
                          pp_idle_fraction=idle if idle is not None else 1 - stats["busy_s"] / splits["fwd_bwd"])
            events = stats.get("events", [])
        self.energy.sample_power()
        run.recorder.log("step", **fields)
        for event in events:  # each micro-batch's forward/backward on this rank's stages, from the step's start
            run.recorder.log("pp_event", step=step + 1, **event)
        run.history.append(fields)
        if run.is_main:
            extra = f" grad_norm {norm:.4f}" if norm is not None else ""
            print(f"step {step + 1:4d} loss {loss:.4f}{extra} tokens/s {fields['tokens_per_s']:,.0f}", flush=True)
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at step {step + 1}")

    def finish(self, start_step):
        run, device = self.run, self.run.device
        history, parallel = run.history, run.parallel
        summary = _summarise(history, run.args.warmup)
        first_loss = history[0]["loss"] if history else None
        last_loss = history[-1]["loss"] if history else None
        summary.update(first_loss=first_loss, last_loss=last_loss, n_params=count_params(run.config),
                       flops_per_token=self.fpt, params_bytes_this_rank=_local_param_bytes(parallel.modules),
                       energy_j=self.energy.energy_j(), peak_power_w=self.energy.peak_power_w,
                       gpu_mem_peak_mb=peak_gpu_memory_mb(device), host_rss_peak_mb=peak_rss_mb(),
                       peak_flops=self.peak, mfu_basis=self.peak_basis,
                       mfu=mfu(summary.get("tokens_per_s"), self.fpt, self.world, self.peak),
                       data_parallel=run.dims.data_parallel, fsdp_reduce_op=parallel.fsdp_reduce_op,
                       optimizer=type(run.optimizer).__name__, **run.extra_summary)
        if parallel.pipeline is not None:  # a collective: every rank calls it
            summary.update(_pipeline_summary(parallel.pipeline, history, run.args.warmup, device))
        if run.dims.data_parallel in ("ddp", "zero1"):
            summary["comm_probe_s"] = _time_gradient_all_reduce(parallel.modules, device, parallel.dp_group)
        run.recorder.finish(**summary)
        if run.is_main and history:
            print(f"[train_llm] done: loss {first_loss:.4f} -> {last_loss:.4f}, "
                  f"tokens/s {summary.get('tokens_per_s') or 0:,.0f}, mfu {summary.get('mfu')}", flush=True)
        elif run.is_main:
            print(f"[train_llm] nothing to do: the checkpoint is at step {start_step} >= --steps {run.args.steps}",
                  flush=True)


def _local_param_bytes(modules) -> int:
    """Bytes of parameters this rank really holds (a DTensor counts its local shard only)."""
    total = 0
    for module in modules:
        for p in module.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            total += local.numel() * local.element_size()
    return total


def _measured(history, warmup):
    return history[warmup:] or history


def _summarise(history, warmup) -> dict:
    measured = _measured(history, warmup)
    if not measured:
        return {"steps": 0}
    mean = lambda key: (sum(h[key] for h in measured) / len(measured)) if measured[0].get(key) is not None else None
    return {
        "steps": history[-1]["step"], "epochs": 0, "first_step_load_s": history[0]["t_data"],
        **{key: mean(key) for key in ("t_data", "t_h2d", "t_forward", "t_backward", "t_fwd_bwd", "t_optimizer",
                                      "t_step", "throughput_train", "throughput_compute", "comm_s", "tokens_per_s")},
    }


def _pipeline_summary(pipeline, history, warmup, device) -> dict:
    """Idle fraction measured in the run's own steps: 1 - (time this rank computed) / (step time).
    Every rank idles; the pipeline's figure is the least idle (busiest) rank's."""
    measured = _measured(history, warmup)
    if not measured:
        return {}
    idle = sum(h["pp_idle_fraction"] for h in measured) / len(measured)
    least_idle = torch.tensor(idle, device=device)
    dist.all_reduce(least_idle, op=dist.ReduceOp.MIN)
    return {
        "pp_microbatches": pipeline.microbatches, "pp_virtual_stages": pipeline.virtual,
        "pp_busy_s": sum(h["pp_busy_s"] for h in measured) / len(measured),
        "pp_idle_fraction_this_rank": idle,
        "pp_idle_fraction_measured": least_idle.item(),
        "pp_idle_fraction_theory": pipeline.idle_fraction_theory(),  # (p - 1) / (v m + p - 1)
        "pp_peak_in_flight": max(h["pp_peak_in_flight"] for h in history),
        "pp_order": history[-1]["pp_order"],
    }


def _time_gradient_all_reduce(modules, device, group, repeats=3) -> float:
    """Time of one all-reduce of every gradient, alone: DDP's communication if none of it overlapped."""
    flat = torch.zeros(sum(p.numel() for m in modules for p in m.parameters()), device=device)
    best = float("inf")
    for _ in range(repeats):
        dist.barrier(group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        dist.all_reduce(flat, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


if __name__ == "__main__":
    # Leave without the interpreter's teardown: see failures.exit_now. Everything is written and
    # flushed by now.
    exit_now(main())
