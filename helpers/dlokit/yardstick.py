"""How fast this machine trains, in one number: the course's times from two machines compare only through it.

    python -m dlokit.yardstick        # a ResNet-18 training step, batch 32 at 32 px, on one CPU thread

The course's wall time moved by x1.8-2.2 between two 2-core machines with the same code (docs/benchmarks.md, 2026-11-28):
a course time means little without the speed of the machine that ran it. The step is the course's own workload
(Day 3's HPO trials train this model at this size on one core each); torch.utils.benchmark gives its median and
interquartile range.
"""
from __future__ import annotations

import json
import logging
import sys

BATCH, IMAGE_SIZE, CLASSES = 32, 32, 10


def measure(min_run_time: float = 3.0) -> dict:
    import torch
    import torchvision

    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # "No CUDA runtime is found": not used
    from torch.utils import benchmark

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = torchvision.models.resnet18(num_classes=CLASSES)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        images, labels = torch.randn(BATCH, 3, IMAGE_SIZE, IMAGE_SIZE), torch.randint(0, CLASSES, (BATCH,))

        def step():
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()

        step()  # the first step allocates the optimizer's state
        timing = benchmark.Timer("step()", globals={"step": step}).blocked_autorange(min_run_time=min_run_time)
    finally:
        torch.set_num_threads(threads)
    return {"workload": f"resnet18 training step, batch {BATCH} at {IMAGE_SIZE} px, SGD, one CPU thread",
            "median_ms": 1e3 * timing.median, "iqr_ms": 1e3 * timing.iqr, "runs": len(timing.times),
            "torch": torch.__version__}


def line(result: dict) -> str:
    return (f"machine yardstick: a {result['workload']} takes {result['median_ms']:.0f} ms "
            f"(IQR {result['iqr_ms']:.0f} ms, {result['runs']} runs)")


if __name__ == "__main__":
    result = measure()
    print(json.dumps(result) if "--json" in sys.argv else line(result))
