"""Train the Llama-style model under one parallelism, chosen by --mode; write a run record.

    python train_llm.py --config tiny --data text --steps 50                         # one process
    torchrun --nproc_per_node=2 train_llm.py --mode ddp
    torchrun --nproc_per_node=2 train_llm.py --mode fsdp --dtype bf16 --activation-checkpointing
    torchrun --nproc_per_node=2 train_llm.py --mode pp --pp-schedule 1f1b --microbatches 4
    torchrun --nproc_per_node=2 train_llm.py --mode tp-scratch        # or tp (DTensor), --sequence-parallel
    torchrun --nproc_per_node=4 train_llm.py --mode fsdp-tp --tp 2    # 2-D mesh: 2 (FSDP) x 2 (TP)
    torchrun --nproc_per_node=2 train_llm.py --mode cp                # the sequence split over 2 ranks
    srun --ntasks=2 python train_llm.py --mode fsdp                  # rank from SLURM_PROCID

Modes: single, ddp, fsdp, pp, tp-scratch, tp, fsdp-tp, cp; every one of them can save a checkpoint
(--checkpoint-dir) and resume from one saved by any other (--resume): DCP reshards.
Exit codes: 0 done (or cleanly skipped), 1 failed, 2 bad arguments, 3 out of memory on this rank
(recorded as status "oom"), 4 stopped because another rank failed (status "aborted", with its cause).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from dlokit import rank as dlorank
from dlokit.measure import EnergyMeter, StepTimer, peak_gpu_memory_mb, peak_rss_mb
from dlokit.runrecord import RunRecorder, shared_run_id

from checkpoint import load_checkpoint, save_checkpoint
from data import TokenBatches
from failures import EXIT_FAILED, EXIT_OOM, FailureWatch, exit_now
from grad_norm import global_grad_norm
from mfu import arithmetic, mfu, peak_flops, tf32_enabled
from model import Llama, count_params, flops_per_token, get_config, loss_fn
from parallel_cp import probe_context_parallel
from parallelize import FSDP_MODES, make_mesh, parallelize

MODES = ("single", "ddp", "fsdp", "pp", "tp-scratch", "tp", "fsdp-tp", "cp")
INJECT_OOM = "DLOKIT_INJECT_OOM"  # "RANK:STEP": raise an out-of-memory error there (tests)


class ArgumentsError(ValueError):
    """A combination of options that cannot run; reported before any process group starts."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=MODES, default="single")
    p.add_argument("--config", default="tiny", help="tiny, small, 125m, 1b, 3b")
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
    p.add_argument("--cpu-offload", action="store_true", help="FSDP: keep sharded params/grads/optimizer on the host")
    p.add_argument("--no-reshard-after-forward", action="store_true", help="FSDP: keep gathered weights for backward")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--compile", action="store_true", help="torch.compile each block")
    p.add_argument("--meta-init", action="store_true",
                   help="FSDP modes: build on the meta device, allocate each rank's shards only (big configs)")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel degree of fsdp-tp")
    p.add_argument("--sequence-parallel", action="store_true", help="tp/fsdp-tp: split norms' activations by sequence")
    p.add_argument("--cp-attention", choices=("allgather", "torch"), default="allgather",
                   help="cp: all-gather the keys/values (any device) or PyTorch's ring attention (CUDA)")
    p.add_argument("--pp-schedule", choices=("naive", "gpipe", "1f1b", "interleaved"), default="gpipe")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--pp-virtual", type=int, default=2, help="stages per rank of the interleaved schedule")
    p.add_argument("--grad-norm", action="store_true", help="log the global gradient norm every step")
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the summary's means")
    p.add_argument("--checkpoint-dir", default=None, help="save a sharded checkpoint there at the end")
    p.add_argument("--resume", action="store_true", help="start from --checkpoint-dir")
    p.add_argument("--runs-dir", default=None)
    return p.parse_args(argv)


def plan_degrees(args, config, world: int) -> dict:
    """Check the options against the world size and the config; return the parallel degrees."""
    tp = {"tp-scratch": world, "tp": world, "fsdp-tp": args.tp}.get(args.mode, 1)
    pp = world if args.mode == "pp" else 1
    cp = world if args.mode == "cp" else 1
    if args.mode == "single" and world != 1:
        raise ArgumentsError(f"--mode single runs one process, got world size {world}; pick a parallel mode")
    if args.mode != "single" and world == 1:
        raise ArgumentsError(f"--mode {args.mode} needs several processes (torchrun --nproc_per_node=N or srun)")
    if tp < 1 or world % (tp * pp * cp):
        raise ArgumentsError(f"world size {world} is not divisible by tp x pp x cp = {tp} x {pp} x {cp}")
    dp = world // (tp * pp * cp)
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
    if args.compile and args.mode == "tp-scratch":
        raise ArgumentsError("--compile cannot trace tp-scratch's hand-written all-reduces (dist.all_reduce inside "
                             "an autograd.Function, timed by the host or CUDA events): use --mode tp to compile")
    if args.meta_init and args.mode not in FSDP_MODES:
        raise ArgumentsError(f"--meta-init allocates each rank's FSDP shards: use it with {', '.join(FSDP_MODES)}")
    if args.cpu_offload and args.mode not in FSDP_MODES:
        raise ArgumentsError(f"--cpu-offload is FSDP's: use it with {', '.join(FSDP_MODES)}")
    if args.batch_size % dp:
        raise ArgumentsError(f"--batch-size {args.batch_size} is not divisible by the data-parallel degree {dp}")
    if args.resume and not args.checkpoint_dir:
        raise ArgumentsError("--resume needs --checkpoint-dir")
    return {"dp": dp, "tp": tp, "pp": pp, "cp": cp}


def process_group_backend(args, cuda: bool) -> str | None:
    """None: the default (nccl on GPU, gloo on CPU). FSDP's CPU offload keeps gradients on the host,
    and the gradient norm reduces them there: that needs gloo beside nccl."""
    if cuda and args.cpu_offload:
        return "cpu:gloo,cuda:nccl"
    return None


def build_model(config, device, meta: bool):
    with torch.device("meta" if meta else device):
        return Llama(config)


def main(argv=None) -> int:
    args = parse_args(argv)
    env = dlorank.detect()
    try:
        config = get_config(args.config, max_seq_len=args.seq_len)
        degrees = plan_degrees(args, config, env.world_size)
    except (ValueError, ArgumentsError) as error:
        print(f"train_llm.py: error: {error}", file=sys.stderr, flush=True)
        return 2

    device = dlorank.init_process_group(backend=process_group_backend(args, torch.cuda.is_available()))
    if args.tf32:
        torch.set_float32_matmul_precision("high")
    run_id = shared_run_id()
    torch.manual_seed(args.seed)
    n_params = count_params(config)
    config_record = {**vars(args), **degrees, "world_size": env.world_size, "n_params": n_params,
                     "flops_per_token": flops_per_token(config, args.seq_len), "model": config.__dict__,
                     "process_group_backend": dist.get_backend() if dist.is_initialized() else None}
    recorder = RunRecorder(config_record, rank=env.rank, world_size=env.world_size, run_id=run_id,
                           runs_dir=args.runs_dir, script="train_llm.py", device=device)
    if env.is_main:
        print(f"[train_llm] mode={args.mode} config={args.config} ({n_params / 1e6:.2f} M params) "
              f"degrees={degrees} run={run_id}", flush=True)

    def stopped_by_peer(cause):
        print(f"[train_llm] rank {env.rank}: stopping, {cause}", file=sys.stderr, flush=True)
        recorder.finish(status="aborted", error=f"stopped because {cause}")

    watch = FailureWatch(env.rank, env.world_size, stopped_by_peer).start()
    try:
        status = train(args, config, degrees, env, device, recorder)
        if dist.is_initialized():
            dist.barrier()  # every rank is done; a failure before this point is still watched
    except torch.OutOfMemoryError as error:
        message = str(error).splitlines()[0]
        print(f"[train_llm] rank {env.rank}: OUT OF MEMORY in mode {args.mode} with config {args.config}: "
              f"{message}", file=sys.stderr, flush=True)
        recorder.log("event", event="oom", error=message)
        recorder.finish(status="oom", error=message, gpu_mem_peak_mb=peak_gpu_memory_mb(device),
                        host_rss_peak_mb=peak_rss_mb())
        watch.announce(f"ran out of memory: {message}")
        exit_now(EXIT_OOM)
    except Exception as error:
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


def train(args, config, degrees, env, device, recorder) -> int:  # long: the Day 4 notebook issue splits it
    mode = args.mode
    mesh = make_mesh(mode, degrees, device)
    if mode == "cp" and args.cp_attention == "torch":
        works, reason = probe_context_parallel(mesh, device)
        if not works:
            if env.is_main:
                print(f"[train_llm] SKIPPED context parallelism: {reason}", flush=True)
            recorder.log("event", event="skipped", reason=reason)
            recorder.finish(status="skipped", reason=reason)
            return 0

    model = build_model(config, device, meta=args.meta_init)
    parallel = parallelize(model, mode, mesh, args, device)
    params = [p for m in parallel.modules for p in m.parameters()]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.95))
    start_step = 0
    if args.resume and (Path(args.checkpoint_dir) / ".metadata").exists():
        start_step = load_checkpoint(args.checkpoint_dir, parallel.checkpoint_module, optimizer, parallel.split_mesh)
        recorder.log("event", event="resumed", step=start_step, checkpoint_dir=args.checkpoint_dir)

    # FSDP computes in --dtype itself (param_dtype); the other modes compute under autocast.
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    autocast = (torch.autocast(device.type, dtype=dtype)
                if dtype != torch.float32 and not parallel.fsdp_casts else nullcontext())
    data = TokenBatches(args.data, config.vocab_size, args.batch_size, args.seq_len, seed=args.seed)
    tokens_per_step = args.batch_size * args.seq_len
    fpt = flops_per_token(config, args.seq_len)
    world = dist.get_world_size() if dist.is_initialized() else 1
    peak, peak_basis = peak_flops(device, arithmetic(args.dtype, tf32_enabled()))
    if env.is_main and peak is None:
        print(f"[train_llm] MFU not computed: {peak_basis}", flush=True)
    timer, energy = StepTimer(device), EnergyMeter(device)
    inject_oom = os.environ.get(INJECT_OOM, "")
    history, first_loss, last_loss = [], None, None

    for step in range(start_step, args.steps):
        timer.start()
        inputs, targets = data.local_batch(step, parallel.data_rank, parallel.data_size)
        timer.split("data")
        inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        timer.split("h2d")
        if inject_oom == f"{env.rank}:{step + 1}":
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected by {INJECT_OOM} at step {step + 1})")
        if parallel.pipeline is not None:
            with autocast:
                loss = parallel.pipeline.step(inputs, targets)
            timer.split("fwd_bwd")
        else:
            with parallel.context(inputs, targets), autocast:
                model_args, model_kwargs, local_targets = parallel.prepare(inputs, targets)
                loss = loss_fn(parallel.modules[0](*model_args, **model_kwargs), local_targets)
                timer.split("forward")
                loss.backward()
            timer.split("backward")
            loss = loss.detach()
        norm = (global_grad_norm(parallel.modules, device, parallel.tp_group, parallel.pp_group)
                if args.grad_norm else None)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        timer.split("optimizer")  # on CUDA: after a synchronisation, so the section timers can be read

        if parallel.loss_group is not None:
            dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=parallel.loss_group)
        loss_value = loss.item()
        first_loss = loss_value if first_loss is None else first_loss
        last_loss = loss_value
        splits = dict(timer.splits)
        t_step = sum(v for k, v in splits.items() if k != "data")
        t_total = t_step + splits["data"]
        fields = {
            "epoch": 0, "step": step + 1, "lr": args.lr, "loss": loss_value, "batch_size": args.batch_size,
            "t_data": splits["data"], "t_h2d": splits["h2d"],
            "t_forward": splits.get("forward"), "t_backward": splits.get("backward"),
            "t_fwd_bwd": splits.get("fwd_bwd"), "t_optimizer": splits["optimizer"], "t_step": t_step,
            "throughput_train": args.batch_size / t_total, "throughput_compute": args.batch_size / t_step,
            "tokens_per_s": tokens_per_step / t_total,
            "mfu": mfu(tokens_per_step / t_total, fpt, world, peak),
            "comm_s": parallel.comm.take() if parallel.comm is not None else None,
            "grad_norm": norm, "gpu_mem_mb": peak_gpu_memory_mb(device),
        }
        if parallel.pipeline is not None:
            stats = parallel.pipeline.take_stats()
            fields.update(pp_busy_s=stats["busy_s"], pp_peak_in_flight=stats["peak_in_flight"],
                          pp_idle_fraction=1 - stats["busy_s"] / splits["fwd_bwd"], pp_order=stats["order"])
        energy.sample_power()
        recorder.log("step", **fields)
        history.append(fields)
        if env.is_main:
            extra = f" grad_norm {norm:.4f}" if norm is not None else ""
            print(f"step {step + 1:4d} loss {loss_value:.4f}{extra} tokens/s {fields['tokens_per_s']:,.0f}", flush=True)
        if not math.isfinite(loss_value):
            raise FloatingPointError(f"loss is {loss_value} at step {step + 1}")

    if args.checkpoint_dir:
        save_checkpoint(args.checkpoint_dir, parallel.checkpoint_module, optimizer, args.steps, parallel.split_mesh)
        recorder.log("event", event="checkpoint_saved", step=args.steps, checkpoint_dir=args.checkpoint_dir)

    summary = _summarise(history, args.warmup)
    summary.update(first_loss=first_loss, last_loss=last_loss, n_params=count_params(config), flops_per_token=fpt,
                   params_bytes_this_rank=_local_param_bytes(parallel.modules), energy_j=energy.energy_j(),
                   peak_power_w=energy.peak_power_w, gpu_mem_peak_mb=peak_gpu_memory_mb(device),
                   host_rss_peak_mb=peak_rss_mb(), peak_flops=peak, mfu_basis=peak_basis,
                   mfu=mfu(summary.get("tokens_per_s"), fpt, world, peak))
    if parallel.pipeline is not None:  # a collective: every rank calls it
        summary.update(_pipeline_summary(parallel.pipeline, history, args.warmup, device))
    if mode == "ddp":
        summary["comm_probe_s"] = _time_gradient_all_reduce(params, device)
    recorder.finish(**summary)
    if env.is_main and history:
        print(f"[train_llm] done: loss {first_loss:.4f} -> {last_loss:.4f}, "
              f"tokens/s {summary.get('tokens_per_s') or 0:,.0f}, mfu {summary.get('mfu')}", flush=True)
    elif env.is_main:
        print(f"[train_llm] nothing to do: the checkpoint is at step {start_step} >= --steps {args.steps}", flush=True)
    return 0


def _local_param_bytes(modules) -> int:
    """Bytes of parameters this rank really holds (a DTensor counts its local shard only)."""
    total = 0
    for module in modules:
        for p in module.parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
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


def _time_gradient_all_reduce(params, device, repeats=3) -> float:
    """Time of one all-reduce of every gradient, alone: DDP's communication if none of it overlapped."""
    flat = torch.zeros(sum(p.numel() for p in params), device=device)
    best = float("inf")
    for _ in range(repeats):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        dist.all_reduce(flat)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


if __name__ == "__main__":
    # Leave without the interpreter's teardown. The process group outlives destroy_process_group()
    # (the device mesh and FSDP still reference it), so its gloo worker threads are alive while Python
    # finalises; one of them dropping the last reference to a finished collective's tensors then needs
    # the GIL, Python ends that thread with a forced unwind through a noexcept destructor, and the
    # process dies of std::terminate ("terminate called without an active exception", SIGABRT) after
    # a run that had completed. Everything is written and flushed by now.
    exit_now(main())
