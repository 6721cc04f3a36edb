"""From the plain model to the parallel one, from the parallel degrees, in torchtitan's order.

    dims = ParallelDims.for_mode(mode, world_size)     # parallel_dims.py
    mesh = dims.build_mesh(device.type)                # one mesh: pp, dp_replicate, dp_shard, cp, tp
    parallel = parallelize(model, dims, mesh, args, device, yours)   # yours: the students' modules, handed over

    1. pipeline     this rank's stages of the model (pp)                    parallel_pp.py
    then on each stage (or the whole model):
    2. tensor       every block's linears split over tp (DTensor plan, or the from-scratch layers)
    3. context      attention over the whole sequence from this rank's part (cp)   parallel_cp.py
    4. activation checkpointing, 5. compile (block by block)                parallel_fsdp.py
    6. data parallel: FSDP2 over dp_shard (or the cp ranks), HSDP with dp_replicate in front (parallel_fsdp.py);
       else DDP over dp_replicate (ZeRO-1 keeps DDP and shards the optimizer: train_llm.py)
Checkpointing and compiling wrap the blocks TP has already split; FSDP wraps last, so that it
shards what the others made (DTensor weights included) and all-gathers around compiled blocks.

`parallel` tells the training loop everything that differs: the modules the optimizer updates,
which slice of the global batch this rank reads, over which groups the logged loss is averaged,
what the gradient norm and the checkpoint must know.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from .parallel_ddp import parallelize_ddp
from .parallel_dims import ParallelDims
from .parallel_tp_dtensor import parallelize_tp
from .timing import SectionTimer


@dataclass(frozen=True)
class YourModules:
    """The students' files, imported by the script beside them and handed over: this package imports none of them."""
    fsdp: ModuleType        # parallel_fsdp.py (TP4.2): FSDP2, activation checkpointing, compile block by block
    tp_scratch: ModuleType  # parallel_tp_scratch.py (TP4.4): tensor parallelism written by hand
    cp: ModuleType          # parallel_cp.py (TP4.5): context parallelism


def _whole(inputs, targets):
    return (inputs,), {}, targets


@dataclass
class Parallel:
    modules: list                          # what the optimizer and the gradient norm see
    checkpoint_module: torch.nn.Module     # what the checkpoint saves (full-model parameter names)
    data_rank: int = 0                     # this rank reads part data_rank of data_size of the global batch
    data_size: int = 1
    loss_groups: list = field(default_factory=list)  # the logged loss is averaged over each of them
    dp_group: object = None                # DDP's replicas (ZeRO-1 shards its optimizer over them)
    tp_group: object = None                # grad norm: parameters split by hand over it (tp-scratch)
    pp_group: object = None                # grad norm: stages hold disjoint parameters
    split_mesh: DeviceMesh | None = None   # checkpoint: the mesh tp_shard_dim parameters are split over
    pipeline: "Pipeline | None" = None  # parallel_pp.Pipeline
    comm: SectionTimer | None = None       # time in the collectives this code issues itself (tp-scratch)
    fsdp_casts: bool = False               # FSDP computes in --dtype itself (no autocast then)
    fsdp_reduce_op: str | None = None      # how FSDP averages gradients: "avg" or "sum" (then divides)
    prepare: Callable = _whole             # (inputs, targets) -> (model args, model kwargs, targets)
    context: Callable = field(default=lambda inputs, targets: nullcontext())
    gradient_sync: Callable = field(default=lambda enabled: nullcontext())  # --grad-accum: off but on the last


def parallelize(model, dims: ParallelDims, mesh: DeviceMesh | None, args, device, yours: YourModules,
                cp_attention=None) -> Parallel:
    """cp_attention: the context-parallel attention chosen for this platform (parallel_cp.choose_cp_attention)."""
    parallel = Parallel(modules=[model], checkpoint_module=model)
    if dims.has("pp"):
        apply_pipeline(parallel, model, mesh, args, device)
    for module in parallel.modules:
        if dims.has("tp"):
            apply_tensor_parallel(parallel, module, dims, mesh, args, device, yours.tp_scratch)
        if dims.has("cp"):
            apply_context_parallel(parallel, module, mesh, args, device, cp_attention, yours.cp)
        if args.activation_checkpointing:
            yours.fsdp.apply_activation_checkpointing(module)
        if args.compile:
            yours.fsdp.apply_compile(module)
    apply_data_parallel(parallel, dims, mesh, args, device, yours.fsdp)
    return parallel


def apply_pipeline(parallel, model, mesh, args, device):
    from .parallel_pp import Pipeline, merged_view  # torch.distributed.pipelining: a second to import, pp only

    group = mesh.get_group("pp")
    virtual = args.pp_virtual if args.pp_schedule == "interleaved" else 1
    microbatches = 1 if args.pp_schedule == "naive" else args.microbatches
    pipeline = Pipeline(model, args.pp_schedule, microbatches, dist.get_rank(group), dist.get_world_size(group),
                        virtual, device, group)
    parallel.pipeline, parallel.pp_group = pipeline, group
    parallel.modules, parallel.checkpoint_module = pipeline.modules, merged_view(pipeline.modules)


def apply_tensor_parallel(parallel, module, dims, mesh, args, device, parallel_tp_scratch):
    tp_mesh = mesh["tp"]
    if dims.tp_scratch:  # plain tensors holding 1/tp of each weight, all-reduces written by hand
        parallel.comm = SectionTimer(device)
        parallel_tp_scratch.parallelize_tp_scratch(module, tp_mesh.get_group(), timer=parallel.comm)
        parallel.tp_group, parallel.split_mesh = tp_mesh.get_group(), tp_mesh
    else:
        parallelize_tp(module, tp_mesh, sequence_parallel=args.sequence_parallel)


def apply_context_parallel(parallel, module, mesh, args, device, attention, parallel_cp):
    """Every CP rank reads the same batch and keeps its part of the sequence."""
    cp_mesh = mesh["cp"]
    if attention == "torch":  # PyTorch's ring attention shards the batch in place inside its context
        parallel.context = lambda inputs, targets: parallel_cp.context_parallel_region(module, cp_mesh, inputs, targets)
    else:  # from scratch: "ring" or "allgather"
        split = parallel_cp.ContextParallel(module, cp_mesh.get_group(), args.seq_len, device, attention)
        parallel.prepare = split.prepare


def apply_data_parallel(parallel, dims, mesh, args, device, parallel_fsdp):
    parallel.data_rank, parallel.data_size = dims.data_parallel_rank(mesh)
    parallel.loss_groups = dims.loss_groups(mesh)
    model = parallel.modules[0]
    if dims.fsdp:
        fsdp_mesh = dims.fsdp_mesh(mesh)
        sum_reduction = args.fsdp_reduce_op == "sum" or (args.fsdp_reduce_op == "auto"
                                                         and not parallel_fsdp.average_is_exact(fsdp_mesh, device))
        parallel_fsdp.parallelize_fsdp(model, fsdp_mesh, param_dtype=args.dtype, reduce_dtype=args.reduce_dtype,
                                       cpu_offload=args.cpu_offload,
                                       reshard_after_forward=not args.no_reshard_after_forward,
                                       sum_reduction=sum_reduction)
        if args.meta_init:  # allocate this rank's shards only, then initialise them
            model.to_empty(device="cpu" if args.cpu_offload else device)
            model.init_weights(buffer_device=device)
        parallel.fsdp_casts, parallel.fsdp_reduce_op = True, "sum" if sum_reduction else "avg"
        parallel.gradient_sync = lambda enabled: _fsdp_gradient_sync(model, enabled)
    elif dims.has("dp_replicate"):
        parallel.dp_group = mesh.get_group("dp_replicate")
        wrapped = parallelize_ddp(model, device, parallel.dp_group)
        parallel.modules, parallel.checkpoint_module = [wrapped], wrapped
        parallel.gradient_sync = lambda enabled: nullcontext() if enabled else wrapped.no_sync()


@contextmanager
def _fsdp_gradient_sync(model, enabled: bool):
    """Without sync FSDP2 keeps each block's whole gradients, adding up the micro-batches', and reduce-scatters them
    once, after the last: one reduce-scatter a step instead of one a micro-batch, for unsharded gradients meanwhile.
    (A model left unsharded, TP4.2's TODO untouched, has nothing to hold back.)"""
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(enabled)
    yield
