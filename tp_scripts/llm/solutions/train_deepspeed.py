"""Train the Day 4 model with DeepSpeed: deepspeed.initialize, a JSON config, ZeRO stage 0, 1, 2 or 3.

    srun --ntasks=2 python train_deepspeed.py --zero-stage 2 --config tiny --data text --steps 6
    srun --ntasks=2 python train_deepspeed.py --zero-stage 3 --offload-optimizer     # AdamW's states on the host

The model, the data, the seed, the step lines and the run record are train_llm.py's (llm_kit/), so each step's loss
compares with train_llm.py's single process, and what each rank holds with FSDP2's and ZeRO-1's. train_llm.py's
options (--config, --data, --batch-size, --seq-len, --steps, --lr, --dtype, ...) mean the same here. No `deepspeed`
launcher: the job's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (srun, this kit's launcher, torchrun)
are what the process group needs; it is joined as train_llm.py joins it (gloo on CPU, NCCL on GPUs) and
deepspeed.init_distributed adopts it. The config DeepSpeed read is written beside the run record (ds_config.json).
Your TODO (TP4.8): the ZeRO stage of ds_config, and the engine's backward and step in train_step.
Exit codes: train_llm.py's.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from contextlib import nullcontext
from types import SimpleNamespace

import torch
import torch.distributed as dist

from dlokit.in_job import rank as dlorank
from dlokit.in_job.jobenv import EXIT_BAD_OPTIONS
from dlokit.in_job.measure import StepClock, tf32_enabled
from dlokit.in_job.peers import Peers, leave_now
from dlokit.in_job.runrecord import RunRecorder, shared_run_id

from llm_kit.data import TokenBatches
from llm_kit.memory_meter import DeepSpeedMemory
from llm_kit.llm_options import parse_args as train_llm_options, setup_device
from llm_kit.meter import Meter
from llm_kit.model import Llama, count_params, flops_per_token, get_config, loss_fn
from llm_kit.ranks_done import leave_on_error, ranks_done

BUCKET_SHARE = 32  # DeepSpeed's reduce bucket: 5e8 elements by default, a 14th of a 7 B model; here a 32nd of ours


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="train_deepspeed.py", description=__doc__.splitlines()[0],
                                epilog="Every other option is train_llm.py's (python train_llm.py --help).")
    p.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=2,
                   help="0: DDP; 1: optimizer states sharded; 2: + gradients; 3: + weights")
    p.add_argument("--offload-optimizer", action="store_true",
                   help='"offload_optimizer": {"device": "cpu"}: the optimizer states and their step on the host')
    p.add_argument("--one-process", action="store_true",
                   help="run on one process, where ZeRO has nothing to shard: a check of DeepSpeed on one device")
    ours, rest = p.parse_known_args(argv)
    args = train_llm_options(rest)
    if args.mode != "single":
        p.error("--mode is train_llm.py's; DeepSpeed's layout is --zero-stage")
    return argparse.Namespace(**{**vars(args), **vars(ours), "mode": "deepspeed"})


def ds_config(args, world: int, n_params: int) -> dict:
    """The JSON DeepSpeed reads. The optimizer is torch's AdamW, train_llm.py's, with its hyper-parameters (DeepSpeed's
    own FusedAdam and DeepSpeedCPUAdam are compiled ops, left out of this install: DS_BUILD_OPS=0)."""
    config = {
        "train_batch_size": args.batch_size,  # the global batch: micro-batch x ranks x accumulation steps
        "train_micro_batch_size_per_gpu": args.batch_size // world,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,  # DeepSpeed clips at 1.0 unless told; train_llm.py does not clip
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": args.weight_decay, "torch_adam": True}},
        # --dtype bf16: fp32 weights, products in bf16 under autocast, as train_llm.py's layouts compute
        "torch_autocast": {"enabled": args.dtype == "bf16", "dtype": "bfloat16"},
        "steps_per_print": 10**9,
    }
    bucket = max(1, n_params // BUCKET_SHARE)
    # >>> SOLUTION TP4.8: "zero_optimization": the ZeRO stage (--zero-stage), its buckets, ZeRO-3 sharding every weight
    config["zero_optimization"] = {
        "stage": args.zero_stage,
        "reduce_bucket_size": bucket,       # gradients reduced in buckets of this many elements
        "allgather_bucket_size": bucket,
        "stage3_param_persistence_threshold": 0,  # ZeRO-3: shard every weight (below 1e5 elements one would stay whole)
    }
    # --- STUDENT
    # config["zero_optimization"] = {"stage": 0}
    # <<< SOLUTION
    if args.offload_optimizer:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    return config


def main(argv=None) -> int:
    args = parse_args(argv)
    env = dlorank.detect()
    if env.world_size < 2 and not args.one_process:
        print("train_deepspeed.py: error: ZeRO shards over several processes (srun --ntasks=2, or the kit's "
              "n_gpu=2); the single process to compare with is train_llm.py --mode single (--one-process: run "
              "anyway, sharding nothing)", file=sys.stderr, flush=True)
        return EXIT_BAD_OPTIONS
    try:
        config = get_config(args.config, max_seq_len=args.seq_len)
    except ValueError as error:
        print(f"train_deepspeed.py: error: {error}", file=sys.stderr, flush=True)
        return EXIT_BAD_OPTIONS
    if args.batch_size % env.world_size:
        print(f"train_deepspeed.py: error: --batch-size {args.batch_size} does not split over {env.world_size} ranks",
              file=sys.stderr, flush=True)
        return EXIT_BAD_OPTIONS
    device = setup_device(args)  # train_llm.py's: the process group, --tf32
    if not dist.is_initialized():  # --one-process: DeepSpeed still wants a process group, here of one
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(args.seed)  # before the model: train_llm.py's initial weights
    recorder = start_record(args, config, env, device)
    reason = cannot_run_here(device)
    if reason:
        if env.is_main:
            print(f"[train_deepspeed] SKIPPED: {reason}", flush=True)
        recorder.log("event", event="skipped", reason=reason)
        recorder.finish(status="skipped", reason=reason)
        dlorank.destroy_process_group()
        return 0
    import deepspeed

    # DeepSpeed compiles a shared-memory all-reduce for CPU inference at its first start (35-53 s here, and again
    # whenever another environment rebuilt it in the same cache); training over gloo or NCCL never calls it
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend=dist.get_backend())  # adopts the process group joined above
    peers = Peers(env.rank, env.world_size, device, script="train_deepspeed.py",
                  record=lambda status, reason: recorder.finish(status=status, error=reason)).start_watching()
    try:
        train(args, config, env, device, recorder, deepspeed)
        dist.barrier()
    except Exception as error:  # train_llm.py's way out: out of memory (exit 3), stopped by another rank, or failed
        leave_on_error(error, recorder, peers, script="train_deepspeed", what=f" at ZeRO stage {args.zero_stage}")
    peers.stop_watching()
    return ranks_done()


def cannot_run_here(device) -> str | None:
    """Why DeepSpeed cannot start here, or None. On a CPU, DeepSpeed's communication backend compiles a shared-memory
    all-reduce (once per machine, ~30 s, kept in ~/.cache/torch_extensions) with the C++ compiler torch uses."""
    try:
        import deepspeed  # noqa: F401
    except ImportError as error:
        return f"DeepSpeed is not installed in this environment ({error}): bash scripts/setup.sh installs it"
    compiler = os.environ.get("CXX", "c++")
    if device.type == "cpu" and shutil.which(compiler) is None:
        return f"on a CPU, DeepSpeed compiles its communication op with a C++ compiler, and {compiler!r} is not here"
    return None


def start_record(args, config, env, device) -> RunRecorder:
    n_params = count_params(config)
    degrees = {"dp": env.world_size, "tp": 1, "pp": 1, "cp": 1}  # ZeRO over every rank; no model parallelism
    record = {**vars(args), **degrees, "world_size": env.world_size, "data_parallel": "deepspeed",
              "n_params": n_params, "flops_per_token": flops_per_token(config, args.seq_len), "model": config.__dict__,
              "process_group_backend": dist.get_backend(), "tf32_applied": tf32_enabled(ops=("matmul",)),
              "ds_config": ds_config(args, env.world_size, n_params)}
    if env.is_main:
        print(f"[train_deepspeed] ZeRO-{args.zero_stage}{' + optimizer offload' if args.offload_optimizer else ''} "
              f"config={args.config} ({n_params / 1e6:.2f} M params) on {env.world_size} ranks", flush=True)
    return RunRecorder(record, rank=env.rank, world_size=env.world_size, run_id=shared_run_id(),
                       runs_dir=args.runs_dir, script="train_deepspeed.py", device=device)


def train(args, config, env, device, recorder, deepspeed):
    model = Llama(config).to(device)
    settings = ds_config(args, env.world_size, count_params(config))
    (recorder.folder / "ds_config.json").write_text(json.dumps(settings, indent=2))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=settings)
    run = SimpleNamespace(  # what llm_kit/meter.py reads, as train_llm.py's Run
        args=args, config=config, device=device, recorder=recorder, is_main=env.is_main, rank=env.rank,
        engine=engine, optimizer=engine.optimizer, clock=StepClock(device, breakdown_every=1), history=[], extra_summary={},
        data=TokenBatches(args.data, config.vocab_size, args.batch_size, args.seq_len, seed=args.seed),
        dims=SimpleNamespace(data_parallel=f"deepspeed-zero{args.zero_stage}"),
        parallel=SimpleNamespace(modules=[engine.module], comm=None, pipeline=None, fsdp_reduce_op=None))
    meter = Meter(run)
    for step in range(args.steps):
        loss, timing = train_step(run, step, measure=step == 0)
        meter.log_step(step, loss, None, timing)
    meter.finish(0)


def train_step(run, step: int, measure: bool):
    """One optimizer step on the global batch `step`: this rank's part of it, through the engine."""
    engine, clock = run.engine, run.clock  # every step split, as train_llm.py's
    clock.start(step)
    inputs, targets = run.data.local_batch(step, dist.get_rank(), dist.get_world_size())
    clock.split("data")
    inputs, targets = inputs.to(run.device, non_blocking=True), targets.to(run.device, non_blocking=True)
    clock.split("h2d")
    memory = DeepSpeedMemory(engine, run.device) if measure else None
    with memory.forward() if memory else nullcontext():
        loss = loss_fn(engine(inputs), targets)
    clock.split("forward")
    # >>> SOLUTION TP4.8: the engine's backward (it reduces the gradients as the stage says) and its step
    engine.backward(loss)
    clock.split("backward")
    engine.step()  # the optimizer's step on this rank's partition, the weights gathered back, the gradients zeroed
    # --- STUDENT
    # clock.split("backward")  # (DeepSpeed refuses loss.backward() at stage 0: the engine's backward it is)
    # <<< SOLUTION
    clock.split("optimizer")
    clock.stop()
    if memory:
        memory.after_step()
        run.extra_summary.update(memory_bytes=memory.bytes(), zero_stage=run.args.zero_stage)
    loss = loss.detach()
    dist.all_reduce(loss, op=dist.ReduceOp.AVG)  # the global batch's mean, as train_llm.py logs it
    return loss.item(), clock.finished()


if __name__ == "__main__":
    leave_now(main())
