"""The global gradient norm, whatever the parallelism: the number to compare with a single process.

Each parameter's squared norm is summed once: a DTensor knows how it is split (full_tensor()
finishes the sum across its mesh); a from-scratch tensor-parallel shard is marked `tp_sharded`
and summed over the tensor-parallel group; pipeline stages hold disjoint parameters, summed over
the pipeline group (a tied weight's second copy, on the last stage, is marked `tied_copy` and left out).
"""
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def global_grad_norm(modules, device, tp_group=None, pp_group=None) -> float:
    whole, tp_sharded = torch.zeros((), device=device), torch.zeros((), device=device)
    for module in modules:
        for param in module.parameters():
            if param.grad is None or getattr(param, "tied_copy", False):
                continue
            squared = param.grad.float().pow(2).sum()
            if isinstance(squared, DTensor):
                squared = squared.full_tensor()
            if getattr(param, "tp_sharded", False):
                tp_sharded += squared
            else:
                whole += squared
    if tp_group is not None:
        dist.all_reduce(tp_sharded, group=tp_group)
    total = whole + tp_sharded
    if pp_group is not None:
        dist.all_reduce(total, group=pp_group)
    return total.sqrt().item()
