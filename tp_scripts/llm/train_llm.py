"""Train the Llama-style model under one parallelism, chosen by --mode; write a run record.

    python train_llm.py --config tiny --data text --steps 50                         # one process
    torchrun --nproc_per_node=2 train_llm.py --mode ddp
    torchrun --nproc_per_node=2 train_llm.py --mode fsdp --dtype bf16 --activation-checkpointing
    torchrun --nproc_per_node=2 train_llm.py --mode pp --pp-schedule 1f1b --microbatches 4
    torchrun --nproc_per_node=2 train_llm.py --mode tp-scratch        # or tp (DTensor), --sequence-parallel
    torchrun --nproc_per_node=4 train_llm.py --mode fsdp-tp --tp 2    # 2-D mesh: 2 (FSDP) x 2 (TP)
    srun --ntasks=2 python train_llm.py --mode fsdp                  # rank from SLURM_PROCID

Modes: single, ddp, fsdp, pp, tp-scratch, tp, fsdp-tp, cp. Exit codes: 0 done (or cleanly
skipped), 2 bad arguments, 3 out of memory (recorded as status "oom").
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist

from dlokit import rank as dlorank
from dlokit.measure import EnergyMeter, StepTimer, peak_gpu_memory_mb, peak_rss_mb
from dlokit.runrecord import RunRecorder, shared_run_id

from checkpoint import load_checkpoint, save_checkpoint
from data import TokenBatches
from grad_norm import global_grad_norm
from mfu import mfu, peak_flops
from model import Llama, count_params, flops_per_token, get_config, loss_fn

MODES = ("single", "ddp", "fsdp", "pp", "tp-scratch", "tp", "fsdp-tp", "cp")


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
    p.add_argument("--reduce-dtype", choices=("fp32", "bf16"), default="fp32", help="FSDP gradient reduction dtype")
    p.add_argument("--cpu-offload", action="store_true", help="FSDP: keep sharded params/grads/optimizer on the host")
    p.add_argument("--no-reshard-after-forward", action="store_true", help="FSDP: keep gathered weights for backward")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--compile", action="store_true", help="torch.compile each block")
    p.add_argument("--meta-init", action="store_true",
                   help="build on the meta device and allocate after sharding (big configs under FSDP)")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel degree of fsdp-tp")
    p.add_argument("--sequence-parallel", action="store_true", help="tp/fsdp-tp: split norms' activations by sequence")
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
        if args.checkpoint_dir:
            raise ArgumentsError("checkpointing is not wired for --mode pp in this script")
    if cp > 1 and args.seq_len % (2 * cp):
        raise ArgumentsError(f"--seq-len {args.seq_len} must divide by 2 x cp = {2 * cp} (load-balanced ring attention)")
    if args.batch_size % dp:
        raise ArgumentsError(f"--batch-size {args.batch_size} is not divisible by the data-parallel degree {dp}")
    if args.resume and not args.checkpoint_dir:
        raise ArgumentsError("--resume needs --checkpoint-dir")
    return {"dp": dp, "tp": tp, "pp": pp, "cp": cp}


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

    device = dlorank.init_process_group()
    run_id = shared_run_id()
    torch.manual_seed(args.seed)
    n_params = count_params(config)
    config_record = {**vars(args), **degrees, "world_size": env.world_size, "n_params": n_params,
                     "flops_per_token": flops_per_token(config, args.seq_len), "model": config.__dict__}
    recorder = RunRecorder(config_record, rank=env.rank, world_size=env.world_size, run_id=run_id,
                           runs_dir=args.runs_dir, script="train_llm.py", device=device)
    if env.is_main:
        print(f"[train_llm] mode={args.mode} config={args.config} ({n_params / 1e6:.2f} M params) "
              f"degrees={degrees} run={run_id}", flush=True)
    try:
        status = train(args, config, degrees, env, device, recorder)
    except torch.OutOfMemoryError as error:
        message = str(error).splitlines()[0]
        print(f"[train_llm] rank {env.rank}: OUT OF MEMORY in mode {args.mode} with config {args.config}: "
              f"{message}", file=sys.stderr, flush=True)
        recorder.log("event", event="oom", error=message)
        recorder.finish(status="oom", error=message, gpu_mem_peak_mb=peak_gpu_memory_mb(device),
                        host_rss_peak_mb=peak_rss_mb())
        return 3
    except BaseException as error:
        recorder.finish(status="failed", error=f"{type(error).__name__}: {error}")
        raise
    dlorank.destroy_process_group()
    return status


def train(args, config, degrees, env, device, recorder) -> int:
    from torch.distributed.device_mesh import init_device_mesh

    mode = args.mode
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    mesh = None
    if mode in ("fsdp", "tp", "tp-scratch", "pp", "cp"):
        mesh = init_device_mesh(device.type, (env.world_size,), mesh_dim_names=({"fsdp": "dp", "tp-scratch": "tp"}.get(mode, mode),))
    elif mode == "fsdp-tp":
        mesh = init_device_mesh(device.type, (degrees["dp"], degrees["tp"]), mesh_dim_names=("dp", "tp"))

    if mode == "cp":
        from parallel_cp import probe_context_parallel
        works, reason = probe_context_parallel(mesh, device)
        if not works:
            if env.is_main:
                print(f"[train_llm] SKIPPED context parallelism: {reason}", flush=True)
            recorder.log("event", event="skipped", reason=reason)
            recorder.finish(status="skipped", reason=reason)
            return 0

    # ---- the model, then the parallelism applied from outside ----
    meta = args.meta_init and mode in ("fsdp", "fsdp-tp", "cp")
    model = build_model(config, device, meta)
    modules = [model]        # what the optimizer and the grad norm see
    tp_group = pp_group = None
    dp_group = None           # over which the logged loss is averaged
    pipeline = None

    def speedups(module):
        from parallel_fsdp import apply_activation_checkpointing, apply_compile
        if args.activation_checkpointing:
            apply_activation_checkpointing(module)
        if args.compile:
            apply_compile(module)

    if mode == "tp-scratch":
        from parallel_tp_scratch import parallelize_tp_scratch
        tp_group = mesh.get_group()
        parallelize_tp_scratch(model, tp_group)
    if mode in ("tp", "fsdp-tp"):
        from parallel_tp_dtensor import parallelize_tp
        parallelize_tp(model, mesh["tp"], sequence_parallel=args.sequence_parallel)
    if mode != "pp":
        speedups(model)
    if mode == "ddp":
        from parallel_ddp import parallelize_ddp
        model = parallelize_ddp(model, device)
        modules, dp_group = [model], dist.group.WORLD
    if mode in ("fsdp", "fsdp-tp", "cp"):
        from parallel_fsdp import parallelize_fsdp
        dp_mesh = mesh["cp" if mode == "cp" else "dp"]
        parallelize_fsdp(model, dp_mesh, param_dtype=args.dtype, reduce_dtype=args.reduce_dtype,
                         cpu_offload=args.cpu_offload, reshard_after_forward=not args.no_reshard_after_forward)
        dp_group = dp_mesh.get_group()
    if meta:
        model.to_empty(device="cpu" if args.cpu_offload else device)
        model.init_weights(buffer_device=device)
    if mode == "pp":
        from parallel_pp import build_pipeline
        pp_group = mesh.get_group()
        virtual = args.pp_virtual if args.pp_schedule == "interleaved" else 1
        microbatches = 1 if args.pp_schedule == "naive" else args.microbatches
        schedule, modules, stage_ids = build_pipeline(model, args.pp_schedule, microbatches, env.rank,
                                                      env.world_size, virtual, device, pp_group)
        for module in modules:
            speedups(module)
        pipeline = (schedule, stage_ids, env.world_size * virtual, microbatches)
        del model

    params = [p for m in modules for p in m.parameters()]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.95))
    start_step = 0
    if args.resume and (Path(args.checkpoint_dir) / ".metadata").exists():
        start_step = load_checkpoint(args.checkpoint_dir, modules[0], optimizer)
        recorder.log("event", event="resumed", step=start_step, checkpoint_dir=args.checkpoint_dir)

    # FSDP handles the dtype itself; the other modes compute under autocast.
    autocast = (torch.autocast(device.type, dtype=dtype)
                if dtype != torch.float32 and mode not in ("fsdp", "fsdp-tp", "cp") else nullcontext())
    dp_rank = dist.get_rank(dp_group) if dp_group is not None else 0
    data = TokenBatches(args.data, config.vocab_size, args.batch_size, args.seq_len, seed=args.seed)
    tokens_per_step = args.batch_size * args.seq_len
    fpt = flops_per_token(config, args.seq_len)
    timer, energy = StepTimer(device), EnergyMeter(device)
    history, first_loss, last_loss = [], None, None
    cp_mesh = mesh if mode == "cp" else None

    for step in range(start_step, args.steps):
        comm_before = _tp_comm_seconds()
        timer.start()
        inputs, targets = data.local_batch(step, dp_rank, degrees["dp"])
        timer.split("data")
        inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        timer.split("h2d")
        if pipeline is not None:
            from parallel_pp import pipeline_step
            schedule, stage_ids, num_stages, _ = pipeline
            with autocast:
                loss = pipeline_step(schedule, stage_ids, num_stages, inputs, targets)
            timer.split("fwd_bwd")
            loss = _share_from_last_stage(loss, num_stages - 1 in stage_ids, device, pp_group)
        else:
            with _cp_region(modules[0], cp_mesh, inputs, targets), autocast:
                loss = loss_fn(modules[0](inputs), targets)
                timer.split("forward")
                loss.backward()
            timer.split("backward")
            loss = loss.detach()
        norm = global_grad_norm(modules, device, tp_group, pp_group) if args.grad_norm else None
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        timer.split("optimizer")

        if dp_group is not None:
            dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=dp_group)
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
            "mfu": mfu(tokens_per_step / t_total, fpt, dist.get_world_size() if dist.is_initialized() else 1, device),
            "comm_s": (_tp_comm_seconds() - comm_before) if mode == "tp-scratch" else None,
            "grad_norm": norm, "gpu_mem_mb": peak_gpu_memory_mb(device),
        }
        energy.sample_power()
        recorder.log("step", **fields)
        history.append(fields)
        if env.is_main:
            extra = f" grad_norm {norm:.4f}" if norm is not None else ""
            print(f"step {step + 1:4d} loss {loss_value:.4f}{extra} tokens/s {fields['tokens_per_s']:,.0f}", flush=True)
        if not math.isfinite(loss_value):
            raise FloatingPointError(f"loss is {loss_value} at step {step + 1}")

    if args.checkpoint_dir:
        save_checkpoint(args.checkpoint_dir, modules[0], optimizer, args.steps)
        recorder.log("event", event="checkpoint_saved", step=args.steps, checkpoint_dir=args.checkpoint_dir)

    summary = _summarise(history, args.warmup, fpt, device)
    summary.update(first_loss=first_loss, last_loss=last_loss, n_params=count_params(config),
                   params_bytes_this_rank=_local_param_bytes(modules), energy_j=energy.energy_j(),
                   peak_power_w=energy.peak_power_w, gpu_mem_peak_mb=peak_gpu_memory_mb(device),
                   host_rss_peak_mb=peak_rss_mb(), peak_flops=peak_flops(device))
    if pipeline is not None:
        summary.update(_measure_bubble(pipeline, modules, data, degrees, summary.get("t_fwd_bwd"), device))
    if mode == "ddp":
        summary["comm_probe_s"] = _time_gradient_all_reduce(params, device)
    recorder.finish(**summary)
    if env.is_main:
        print(f"[train_llm] done: loss {first_loss:.4f} -> {last_loss:.4f}, "
              f"tokens/s {summary.get('tokens_per_s') or 0:,.0f}, mfu {summary.get('mfu')}", flush=True)
    return 0


def _tp_comm_seconds() -> float:
    module = sys.modules.get("parallel_tp_scratch")
    return module.COMM_SECONDS[0] if module else 0.0


def _cp_region(model, cp_mesh, inputs, targets):
    if cp_mesh is None:
        return nullcontext()
    from parallel_cp import context_parallel_region
    return context_parallel_region(model, cp_mesh, inputs, targets)


def _share_from_last_stage(loss, is_last, device, pp_group):
    """The loss exists on the last stage only; give every rank the same number to log."""
    value = loss.float() if is_last else torch.zeros((), device=device)
    dist.all_reduce(value, group=pp_group)
    return value


def _local_param_bytes(modules) -> int:
    """Bytes of parameters this rank really holds (a DTensor counts its local shard only)."""
    from torch.distributed.tensor import DTensor
    total = 0
    for module in modules:
        for p in module.parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            total += local.numel() * local.element_size()
    return total


def _summarise(history, warmup, fpt, device) -> dict:
    measured = history[warmup:] or history
    if not measured:
        return {"steps": 0}
    mean = lambda key: (sum(h[key] for h in measured) / len(measured)) if measured[0].get(key) is not None else None
    world = dist.get_world_size() if dist.is_initialized() else 1
    tokens_per_s = mean("tokens_per_s")
    return {
        "steps": history[-1]["step"], "epochs": 0, "first_step_load_s": history[0]["t_data"],
        **{key: mean(key) for key in ("t_data", "t_h2d", "t_forward", "t_backward", "t_fwd_bwd", "t_optimizer",
                                      "t_step", "throughput_train", "throughput_compute", "comm_s")},
        "tokens_per_s": tokens_per_s, "mfu": mfu(tokens_per_s, fpt, world, device), "flops_per_token": fpt,
    }


def _measure_bubble(pipeline, modules, data, degrees, t_step, device) -> dict:
    from parallel_pp import microbatch_compute_seconds
    schedule, stage_ids, num_stages, microbatches = pipeline
    inputs, targets = data.local_batch(0, 0, 1)
    busy = microbatches * microbatch_compute_seconds(modules, stage_ids, num_stages, inputs.to(device),
                                                     targets.to(device), microbatches)
    slowest = torch.tensor(busy, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # the pipeline runs at its slowest stage's pace
    virtual = num_stages // degrees["pp"]
    return {
        "pp_microbatches": microbatches, "pp_virtual_stages": virtual,
        "pp_busy_s": slowest.item(),
        # measured idle time over busy time, to compare with the textbook (p - 1) / (v m)
        "pp_bubble_measured": (t_step / slowest.item() - 1) if t_step else None,
        "pp_bubble_theory": (degrees["pp"] - 1) / (virtual * microbatches),
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
    sys.exit(main())
