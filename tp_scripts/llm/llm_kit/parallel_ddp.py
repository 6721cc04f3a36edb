"""Data parallelism, the baseline: every rank holds the whole model, gradients are all-reduced.

ZeRO stage 1 keeps this layout and shards only the optimizer states over the replicas: see
build_optimizer in zero1_optimizer.py (TP4.1: torch.distributed.optim.ZeroRedundancyOptimizer).
"""
from torch.nn.parallel import DistributedDataParallel


def parallelize_ddp(model, device, group=None):
    # DDP buckets the gradients and starts each bucket's all-reduce while backward is still running.
    # gradient_as_bucket_view: gradients live inside the communication buckets instead of beside
    # them, which saves one gradient-sized copy of memory.
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   process_group=group, gradient_as_bucket_view=True)
