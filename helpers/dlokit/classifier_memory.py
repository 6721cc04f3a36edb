"""How much GPU memory does train_classifier.py need per rank? Measured on the CPU, planned for the GPU.

    need = estimate("resnet50", image_size=224, batch_size=256, amp="bf16", optimizer="sgd", ranks=4)
    need.total_gib, need.as_dict()

The activations are measured, not modelled: one forward pass of the torchvision model at the target image size, on
the CPU, at 2 and at 4 images, counting what autograd saves for backward (saved_tensors_hooks, each storage once,
weights left out: as common/tensor_memory.py counts them in a job). The difference is what one image adds; what is
left at 2 images does not grow with the batch (autocast's low-precision copies of the weights). The rest is counted
per parameter (Ψ): weights 4Ψ and gradients 4Ψ (autocast keeps them fp32), the optimizer's states (OPTIMIZER_STATES),
on CUDA AdamW's foreach temporaries 4Ψ (as Day 4's memory model), with several ranks DDP's gradient buckets 4Ψ (a
copy of the gradients: train_classifier.py leaves gradient_as_bucket_view off by default). Their sum is an upper
bound (backward frees the activations as the gradients appear): measured on the CPU, a step's peak was 1-15 % below
it (tests/test_classifier_memory.py). The CUDA context, NCCL's buffers, cuDNN's workspaces and the allocator's
fragmentation are the card's MARGIN (layout_planner.usable_gib).
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

GIB = 1024**3
# fp32 states per weight, in bytes: torch's SGD (momentum 0.9) and AdamW, timm's LAMB (m, v), LARS (momentum), Lion (m)
OPTIMIZER_STATES = {"sgd": 4, "adamw": 8, "lamb": 8, "lars": 4, "lion": 4}
FOREACH_TEMPORARIES = {"adamw": 4}  # on CUDA, bytes per weight (dlokit.memory_model's accounting)


@dataclass(frozen=True)
class Activations:
    per_image: int     # bytes autograd saves per image
    fixed: int         # bytes saved whatever the batch (autocast's weight copies)
    params: int        # parameters of the model


@functools.lru_cache(maxsize=None)
def activations(model: str, image_size: int, amp: str = "none", classes: int = 10) -> Activations:
    """What autograd saves in one training forward pass of `model` at `image_size`, measured on the CPU (CPU autocast
    computes in bf16: 2 bytes, as fp16 and bf16 on a GPU)."""
    import torch
    import torchvision

    torch.manual_seed(0)
    network = torchvision.models.get_model(model, num_classes=classes).train()
    weights = {t.untyped_storage().data_ptr() for t in [*network.parameters(), *network.buffers()]}
    saved = {}
    for batch in (2, 4):
        storages = {}  # each storage once: ReLU's in-place output is saved by it and by the next layer

        def pack(tensor, storages=storages):
            storage = tensor.untyped_storage()
            if storage.data_ptr() and storage.data_ptr() not in weights:
                storages[storage.data_ptr()] = storage.nbytes()
            return tensor
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), \
                torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp in ("fp16", "bf16")):
            output = network(torch.randn(batch, 3, image_size, image_size))  # its graph keeps them alive: no address reused
        saved[batch] = sum(storages.values())
        del output
    per_image = (saved[4] - saved[2]) // 2
    return Activations(per_image=per_image, fixed=max(0, saved[2] - 2 * per_image),
                       params=sum(p.numel() for p in network.parameters()))


@dataclass
class ClassifierMemory:
    """Bytes per rank, by what holds them."""
    weights: float
    gradients: float
    optimizer: float
    foreach: float
    ddp_buckets: float
    amp_copies: float
    activations: float

    @property
    def total(self) -> float:
        return sum(self.as_dict().values())

    @property
    def total_gib(self) -> float:
        return self.total / GIB

    def as_dict(self) -> dict:
        return asdict(self)


def estimate(model: str, *, image_size: int, batch_size: int, amp: str = "none", optimizer: str = "sgd",
             ranks: int = 1, cuda: bool = True, classes: int = 10) -> ClassifierMemory:
    """What one rank of train_classifier.py holds at its peak, `batch_size` images per rank."""
    a = activations(model, image_size, amp, classes)
    return ClassifierMemory(
        weights=4 * a.params, gradients=4 * a.params, optimizer=OPTIMIZER_STATES[optimizer] * a.params,
        foreach=FOREACH_TEMPORARIES.get(optimizer, 0) * a.params if cuda else 0,
        ddp_buckets=4 * a.params if ranks > 1 else 0, amp_copies=a.fixed, activations=a.per_image * batch_size)
