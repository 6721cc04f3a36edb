"""Data parallelism, the baseline: every rank holds the whole model, gradients are all-reduced."""
from torch.nn.parallel import DistributedDataParallel


def parallelize_ddp(model, device):
    # DDP buckets the gradients and starts each bucket's all-reduce while backward is still running.
    # gradient_as_bucket_view: gradients live inside the communication buckets instead of beside
    # them, which saves one gradient-sized copy of memory.
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   gradient_as_bucket_view=True)
