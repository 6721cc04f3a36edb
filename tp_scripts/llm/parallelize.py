"""From the plain model to the parallel one: one small function per --mode.

    mesh = make_mesh(mode, degrees, device)
    parallel = parallelize(model, mode, mesh, args, device)

`parallel` tells the training loop everything that differs between modes: the modules the
optimizer updates, which slice of the global batch this rank reads, over which group the logged
loss is averaged, what the gradient norm and the checkpoint must know. The order of the wrappers
is torchtitan's: tensor parallel -> activation checkpointing -> compile -> FSDP.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from parallel_cp import ContextParallel, context_parallel_region
from parallel_ddp import parallelize_ddp
from parallel_fsdp import apply_activation_checkpointing, apply_compile, parallelize_fsdp
from parallel_pp import Pipeline, merged_view
from parallel_tp_dtensor import parallelize_tp
from parallel_tp_scratch import parallelize_tp_scratch
from timing import SectionTimer

# modes whose weights are sharded by FSDP: they can be built on the meta device
FSDP_MODES = ("fsdp", "fsdp-tp", "cp")


def _whole(inputs, targets):
    return (inputs,), {}, targets


@dataclass
class Parallel:
    modules: list                          # what the optimizer and the gradient norm see
    checkpoint_module: torch.nn.Module     # what the checkpoint saves (full-model parameter names)
    data_rank: int = 0                     # this rank reads part data_rank of data_size of the global batch
    data_size: int = 1
    loss_group: object = None              # the logged loss is averaged over this group
    tp_group: object = None                # grad norm: parameters split by hand over it (tp-scratch)
    pp_group: object = None                # grad norm: stages hold disjoint parameters
    split_mesh: DeviceMesh | None = None   # checkpoint: the mesh tp_shard_dim parameters are split over
    pipeline: Pipeline | None = None
    comm: SectionTimer | None = None       # time in the collectives this code issues itself (tp-scratch)
    fsdp_casts: bool = False               # FSDP computes in --dtype itself (no autocast then)
    prepare: Callable = _whole             # (inputs, targets) -> (model args, model kwargs, targets)
    context: Callable = field(default=lambda inputs, targets: nullcontext())


def make_mesh(mode: str, degrees: dict, device) -> DeviceMesh | None:
    if mode in ("single", "ddp"):
        return None
    if mode == "fsdp-tp":
        return init_device_mesh(device.type, (degrees["dp"], degrees["tp"]), mesh_dim_names=("dp", "tp"))
    name = {"fsdp": "dp", "tp-scratch": "tp", "tp": "tp", "pp": "pp", "cp": "cp"}[mode]
    return init_device_mesh(device.type, (degrees[name],), mesh_dim_names=(name,))


def parallelize(model, mode: str, mesh: DeviceMesh | None, args, device) -> Parallel:
    return MODES[mode](model, mesh, args, device)


# ---- helpers shared by the modes ----

def _speedups(module, args):
    if args.activation_checkpointing:
        apply_activation_checkpointing(module)
    if args.compile:
        apply_compile(module)


def _shard(model, dp_mesh, args, device):
    parallelize_fsdp(model, dp_mesh, param_dtype=args.dtype, reduce_dtype=args.reduce_dtype,
                     cpu_offload=args.cpu_offload, reshard_after_forward=not args.no_reshard_after_forward)
    if args.meta_init:  # allocate this rank's shards only, then initialise them
        model.to_empty(device="cpu" if args.cpu_offload else device)
        model.init_weights(buffer_device=device)


def _group_rank(mesh, dim=None):
    group = mesh.get_group(dim) if dim is not None else mesh.get_group()
    return group, dist.get_rank(group), dist.get_world_size(group)


# ---- one function per mode ----

def single(model, mesh, args, device):
    _speedups(model, args)
    return Parallel(modules=[model], checkpoint_module=model)


def ddp(model, mesh, args, device):
    _speedups(model, args)
    wrapped = parallelize_ddp(model, device)
    return Parallel(modules=[wrapped], checkpoint_module=wrapped, data_rank=dist.get_rank(),
                    data_size=dist.get_world_size(), loss_group=dist.group.WORLD)


def fsdp(model, mesh, args, device):
    _speedups(model, args)
    _shard(model, mesh, args, device)
    group, rank, size = _group_rank(mesh)
    return Parallel(modules=[model], checkpoint_module=model, data_rank=rank, data_size=size,
                    loss_group=group, fsdp_casts=True)


def tp_scratch(model, mesh, args, device):
    comm = SectionTimer(device)
    parallelize_tp_scratch(model, mesh.get_group(), timer=comm)
    _speedups(model, args)
    # every rank computes the same loss on the same batch: nothing to average
    return Parallel(modules=[model], checkpoint_module=model, tp_group=mesh.get_group(), split_mesh=mesh,
                    comm=comm)


def tp(model, mesh, args, device):
    parallelize_tp(model, mesh, sequence_parallel=args.sequence_parallel)
    _speedups(model, args)
    return Parallel(modules=[model], checkpoint_module=model)


def fsdp_tp(model, mesh, args, device):
    parallelize_tp(model, mesh["tp"], sequence_parallel=args.sequence_parallel)
    _speedups(model, args)
    _shard(model, mesh["dp"], args, device)
    group, rank, size = _group_rank(mesh, "dp")
    return Parallel(modules=[model], checkpoint_module=model, data_rank=rank, data_size=size,
                    loss_group=group, fsdp_casts=True)


def pp(model, mesh, args, device):
    group, rank, size = _group_rank(mesh)
    virtual = args.pp_virtual if args.pp_schedule == "interleaved" else 1
    microbatches = 1 if args.pp_schedule == "naive" else args.microbatches
    pipeline = Pipeline(model, args.pp_schedule, microbatches, rank, size, virtual, device, group)
    for module in pipeline.modules:
        _speedups(module, args)
    return Parallel(modules=pipeline.modules, checkpoint_module=merged_view(pipeline.modules), pp_group=group,
                    pipeline=pipeline)


def cp(model, mesh, args, device):
    """Every CP rank reads the same batch (data_rank 0 of 1) and keeps its part of the sequence."""
    group = mesh.get_group()
    parallel = Parallel(modules=[model], checkpoint_module=model, loss_group=group, fsdp_casts=True)
    if args.cp_attention == "allgather":
        parallel.prepare = ContextParallel(model, group, args.seq_len, device).prepare
    else:  # PyTorch's ring attention shards the batch in place inside its context
        parallel.context = lambda inputs, targets: context_parallel_region(model, mesh, inputs, targets)
    _speedups(model, args)
    _shard(model, mesh, args, device)
    return parallel


MODES = {"single": single, "ddp": ddp, "fsdp": fsdp, "tp-scratch": tp_scratch, "tp": tp, "fsdp-tp": fsdp_tp,
         "pp": pp, "cp": cp}
