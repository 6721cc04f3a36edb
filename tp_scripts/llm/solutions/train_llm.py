"""Train the Llama-style model under the parallel layout --mode names; write a run record.

    python train_llm.py --config tiny --data text --steps 50                         # one process
    torchrun --nproc_per_node=2 train_llm.py --mode ddp                              # or zero1, fsdp
    torchrun --nproc_per_node=2 train_llm.py --mode fsdp --dtype bf16 --activation-checkpointing
    torchrun --nproc_per_node=2 train_llm.py --mode ddp --grad-accum 4                # 4 micro-batches a step
    torchrun --nproc_per_node=4 train_llm.py --mode hsdp --dp-replicate 2            # 2 replicas x 2 shards
    torchrun --nproc_per_node=2 train_llm.py --mode pp --pp-schedule 1f1b --microbatches 4
    torchrun --nproc_per_node=2 train_llm.py --mode tp-scratch        # or tp (DTensor), --sequence-parallel
    torchrun --nproc_per_node=4 train_llm.py --mode fsdp-tp --tp 2    # 2-D mesh: 2 (FSDP) x 2 (TP)
    torchrun --nproc_per_node=2 train_llm.py --mode cp                # the sequence split over 2 ranks
    srun --ntasks=2 python train_llm.py --mode fsdp                  # rank from SLURM_PROCID

The Day 4 script. `--mode` names a set of parallel degrees
(pp, dp_replicate, dp_shard, cp, tp: parallel_dims.py); parallelize.py applies them to the plain
model (model.py) on one device mesh, in torchtitan's order. main() lists what happens, train() the
steps of a run, train_step() one optimizer step. Beside this script: your zero1_optimizer.py (TP4.1) and
parallel_*.py; in llm_kit/: llm_options.py (every option, checked against the world size before any process group
starts), meter.py (each step's metrics line and the run's summary), the model, the data, checkpoints, each
parallelism's module, memory_meter.py (what each rank holds, from its tensors) and collectives.py (which collectives a
step issues). Every mode can save a checkpoint
(--checkpoint-dir) and resume from one saved by any other (--resume): DCP reshards.
Exit codes: 0 done (or cleanly skipped), 1 failed, 2 bad arguments, 3 out of memory on this rank
(recorded as status "oom"), 4 stopped because another rank failed (status "aborted", with its cause).
"""
from __future__ import annotations

import sys
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from dlokit.in_job import rank as dlorank
from dlokit.in_job.jobenv import EXIT_BAD_OPTIONS
from dlokit.in_job.measure import StepClock, tf32_enabled
from dlokit.in_job.peers import Peers, leave_now
from dlokit.in_job.runrecord import RunRecorder, shared_run_id

# The shared modules: the package llm_kit (tp_scripts/llm/llm_kit, installed with the kit: found from solutions/ too).
from llm_kit.checkpoint import load_checkpoint, save_checkpoint
from llm_kit.collectives import CollectiveLog
from llm_kit.data import TokenBatches
from llm_kit.device_memory import limit_memory
from llm_kit.grad_norm import global_grad_norm
from llm_kit.llm_options import MODES, ArgumentsError, parse_args, plan_degrees, process_group_backend, setup_device  # noqa: F401 (MODES, process_group_backend: tests)
from llm_kit.memory_meter import MemoryMeter, bytes_once, parameters
from llm_kit.meter import Meter
from llm_kit.model import Llama, count_params, flops_per_token, get_config, loss_fn
from llm_kit.parallel_dims import ParallelDims
from llm_kit.parallelize import YourModules, parallelize
from llm_kit.ranks_done import leave_on_error, ranks_done

# Your files beside this script (TP4.1, TP4.2, TP4.4, TP4.5): the optimizer, and the layouts handed to parallelize (the
# shared package never imports them). This loop has nothing to edit: the build copies it beside them.
# dlokit.material: copy
import parallel_cp
import parallel_fsdp
import parallel_tp_scratch
from zero1_optimizer import build_optimizer, checkpointed

YOURS = YourModules(fsdp=parallel_fsdp, tp_scratch=parallel_tp_scratch, cp=parallel_cp)


def main(argv=None) -> int:
    args = parse_args(argv)
    env = dlorank.detect()
    try:
        config = get_config(args.config, max_seq_len=args.seq_len)
        dims = plan_degrees(args, config, env.world_size)
    except (ValueError, ArgumentsError) as error:
        print(f"train_llm.py: error: {error}", file=sys.stderr, flush=True)
        return EXIT_BAD_OPTIONS
    device = setup_device(args)
    torch.manual_seed(args.seed)
    recorder = start_record(args, config, dims.degrees(), env, device)

    def record_stop(status, reason):  # another rank stopped (or the job is stuck): this rank's record says why
        recorder.finish(status=status, error=reason)

    peers = Peers(env.rank, env.world_size, device, record=record_stop, script="train_llm.py").start_watching()
    try:
        status = train(args, config, dims, env, device, recorder)
        if dist.is_initialized():
            dist.barrier()  # every rank is done; a failure before this point is still watched
    except Exception as error:  # out of memory (exit 3), stopped by another rank, or failed: recorded, then left
        leave_on_error(error, recorder, peers, script="train_llm",
                       what=f" in mode {args.mode} with config {args.config}")
    peers.stop_watching()
    return ranks_done(status)  # every watcher has stopped before any rank leaves


def start_record(args, config, degrees, env, device) -> RunRecorder:
    run_id = shared_run_id()
    n_params = count_params(config)
    config_record = {**vars(args), **degrees, "world_size": env.world_size, "n_params": n_params,
                     "flops_per_token": flops_per_token(config, args.seq_len), "model": config.__dict__,
                     "process_group_backend": dist.get_backend() if dist.is_initialized() else None,
                     "tf32_applied": tf32_enabled(ops=("matmul",))}  # what this process computes with, not only asked
    if env.is_main:
        print(f"[train_llm] mode={args.mode} config={args.config} ({n_params / 1e6:.2f} M params) "
              f"degrees={degrees} run={run_id}", flush=True)
    return RunRecorder(config_record, rank=env.rank, world_size=env.world_size, run_id=run_id,
                       runs_dir=args.runs_dir, script="train_llm.py", device=device)


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
    clock: StepClock = None
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
    run.parallel = parallelize(model, dims, mesh, args, device, YOURS, cp_attention=cp_attention)
    # the weights this rank holds once laid out, in the record before any step can run out of memory
    recorder.amend(observed={"params_bytes": bytes_once(parameters(run.parallel.modules))})
    run.optimizer = build_optimizer(args, run.parallel.modules, dims, run.parallel.dp_group)
    start_step = resume(run) if args.resume else 0
    run.data = TokenBatches(args.data, config.vocab_size, args.batch_size, args.seq_len, seed=args.seed)
    # FSDP computes in --dtype itself (param_dtype); the other modes compute under autocast.
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    run.autocast = (torch.autocast(device.type, dtype=dtype)
                    if dtype != torch.float32 and not run.parallel.fsdp_casts else nullcontext())
    # every step a breakdown step (synchronised at each phase on a GPU): the metrics line splits every step, and the
    # section timers (tp-scratch's all-reduces, the pipeline's timeline) are read once the step has synchronised
    run.clock = StepClock(device, breakdown_every=1)
    meter = Meter(run)
    for step in range(start_step, args.steps):
        loss, norm, timing = train_step(run, step, measure=step == start_step)
        meter.log_step(step, loss, norm, timing)
        if args.checkpoint_dir and step + 1 == (args.checkpoint_step or args.steps):
            save(run, step + 1)
    meter.finish(start_step)
    return 0


def save(run, steps_done: int) -> None:
    save_checkpoint(run.args.checkpoint_dir, run.parallel.checkpoint_module, checkpointed(run.optimizer), steps_done,
                    run.parallel.split_mesh)
    run.recorder.log("event", event="checkpoint_saved", step=steps_done, checkpoint_dir=run.args.checkpoint_dir)


def choose_context_parallel_attention(run, mesh) -> str | None:
    """The attention --cp-attention gets here (recorded with why); None: it cannot run here (PyTorch's
    ring attention has no CPU kernel), and the run is recorded as skipped, with the reason."""
    attention, reason = parallel_cp.choose_cp_attention(run.args.cp_attention, mesh["cp"], run.device)
    if attention is None:
        if run.is_main:
            print(f"[train_llm] SKIPPED context parallelism: {reason}", flush=True)
        run.recorder.log("event", event="skipped", reason=reason)
        run.recorder.finish(status="skipped", reason=reason)
    run.extra_summary.update(cp_attention=attention, cp_attention_reason=reason)
    return attention


def resume(run) -> int:
    step = load_checkpoint(run.args.checkpoint_dir, run.parallel.checkpoint_module, checkpointed(run.optimizer),
                           run.parallel.split_mesh)
    run.recorder.log("event", event="resumed", step=step, checkpoint_dir=run.args.checkpoint_dir)
    return step


def train_step(run, step: int, measure: bool):
    """One optimizer step on the global batch `step`; on the measured step, what each rank holds and
    which collectives it issues are kept for the summary (run.extra_summary)."""
    parallel, clock = run.parallel, run.clock
    clock.start(step)
    inputs, targets = run.data.local_batch(step, parallel.data_rank, parallel.data_size)
    clock.split("data")
    inputs, targets = inputs.to(run.device, non_blocking=True), targets.to(run.device, non_blocking=True)
    clock.split("h2d")
    # under --compile each block is one graph: no hook inside it may note FSDP's gathered weights
    memory = (MemoryMeter(parallel.modules, run.optimizer, run.device, fsdp=run.dims.fsdp and not run.args.compile,
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
    clock.split("optimizer")
    clock.stop()
    if measure:
        run.extra_summary.update(memory_bytes=memory.bytes(),
                            collectives_per_step=collectives.summary() if isinstance(collectives, CollectiveLog) else None)
    for group in parallel.loss_groups:  # ranks that saw other tokens: the global-batch mean
        dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=group)
    return loss.item(), norm, clock.finished()


def forward_backward(run, inputs, targets):
    parallel, clock = run.parallel, run.clock
    if parallel.pipeline is not None:  # the schedule runs every micro-batch's forward and backward
        with run.autocast:
            loss = parallel.pipeline.step(inputs, targets)
        clock.split("fwd_bwd")
        return loss
    micro = run.args.grad_accum  # the rank's batch in `micro` forward-backwards, the gradients added up
    total = 0.0
    for index, (x, y) in enumerate(zip(inputs.chunk(micro), targets.chunk(micro))):
        with parallel.gradient_sync(index == micro - 1), parallel.context(x, y), run.autocast:
            model_args, model_kwargs, local_targets = parallel.prepare(x, y)
            loss = loss_fn(parallel.modules[0](*model_args, **model_kwargs), local_targets) / micro
            clock.split("forward")
            loss.backward()
        clock.split("backward")
        total = total + loss.detach()
    return total


if __name__ == "__main__":
    # Leave without the interpreter's teardown: see dlokit.in_job.peers.leave_now. Everything is written and
    # flushed by now.
    leave_now(main())
