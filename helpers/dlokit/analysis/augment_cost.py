"""TP2.4 in this process: what augmentation costs, per image in a loader's worker (crop, flip, RandAugment) and
per batch on the device (mixup, cutmix: whole batch at once against one image at a time), timed with
torch.utils.benchmark in blocks, so each cost carries its 95 % interval.

    images = augment_cost.sample_images(DATA, 64)
    per_image = augment_cost.per_image_costs(images, 32)   # ms per image of each pipeline
    mix = augment_cost.mix_costs(images, 32)               # ms per batch, each way
    augment_cost.cost_verdict(per_image, mix, on_gpu)      # RandAugment per image against batched mixup

Not imported by dlokit.analysis itself (it imports torchvision and dlokit.lessons)."""
from __future__ import annotations

import logging
import math
from pathlib import Path

import pandas as pd
import torch
import torchvision
from torchvision.transforms import v2 as T

from dlokit import lessons
from dlokit.analysis import stats
from dlokit.analysis.figures import new_figure

CLASSES = 10  # the generated data set's
RANDAUGMENT = "crop + flip + RandAugment"



def sample_images(data, count: int) -> list:
    """`count` training images of an ImageNet-layout folder, decoded, spread over the classes."""
    files = sorted((Path(data) / "train").rglob("*.JPEG"))
    return [torchvision.io.decode_jpeg(torchvision.io.read_file(str(f))) for f in files[::max(1, len(files) // count)][:count]]


def pipelines(image_size: int) -> dict:
    """The per-image pipelines of a loader's worker: crop and flip, then with RandAugment."""
    base = [T.RandomResizedCrop(image_size, antialias=True), T.RandomHorizontalFlip()]
    return {"crop + flip": T.Compose(base), RANDAUGMENT: T.Compose([*base, T.RandAugment(num_ops=2, magnitude=9)])}


def ms_samples(function, per: int = 1, blocks: int = 7, block_s: float = 0.02) -> list:
    """Milliseconds per call (divided by `per`: per image), one sample per block of calls: always `blocks` blocks
    (an interval needs several), each at least `block_s` long (a fast call is repeated within its block)."""
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # torch.utils.benchmark looks for CUDA
    from torch.utils import benchmark

    timer = benchmark.Timer(stmt="f()", globals={"f": function})
    calls = max(1, math.ceil(block_s / timer.timeit(1).median))  # the first call also warms up
    return [1000 * timer.timeit(calls).median / per for _ in range(blocks)]


def per_image_costs(images: list, image_size: int) -> pd.DataFrame:
    """Each pipeline's ms per image with its 95 % interval over the timed blocks (attrs["samples"]); prints how
    much more RandAugment costs."""
    samples = {name: ms_samples(lambda t=transform: [t(image) for image in images], per=len(images))
               for name, transform in pipelines(image_size).items()}
    estimates = {name: stats.estimate_of_samples([values]) for name, values in samples.items()}
    table = pd.DataFrame([{"pipeline": name, "ms per image": e.value, "low": e.low, "high": e.high}
                          for name, e in estimates.items()])
    table.attrs["samples"] = samples
    table.attrs["basis"] = (f"ms per image: the median of {len(samples[RANDAUGMENT])} timed blocks over {len(images)} "
                            "images in this notebook's process; low–high: its 95 % interval over the blocks")
    extra = stats.ratio_of_samples([samples["crop + flip"]], [samples[RANDAUGMENT]])
    print(f"RandAugment makes the per-image pipeline {extra.text()} as expensive (95 % interval over the timed blocks)")
    return table


def as_batch(images: list, image_size: int) -> torch.Tensor:
    """The images resized to one square size, as a float batch in [0, 1]."""
    resize = T.Compose([T.Resize((image_size, image_size), antialias=True), T.ToDtype(torch.float32, scale=True)])
    return torch.stack([resize(image) for image in images])


def mix_one_by_one(batch, labels, area: bool = False):
    """The per-sample way: each image blended with a random partner (or, `area`, a patch of it pasted: cutmix),
    one at a time, in a Python loop."""
    out, targets = torch.empty_like(batch), torch.zeros(len(batch), CLASSES)
    for i in range(len(batch)):
        j = int(torch.randint(len(batch), ()))
        lam = float(torch.distributions.Beta(1.0, 1.0).sample())
        if area:
            h, w = batch.shape[-2:]
            ch, cw = int(h * math.sqrt(1 - lam)), int(w * math.sqrt(1 - lam))
            y, x = int(torch.randint(h - ch + 1, ())), int(torch.randint(w - cw + 1, ()))
            out[i] = batch[i]
            out[i, :, y:y + ch, x:x + cw] = batch[j, :, y:y + ch, x:x + cw]
            lam = 1 - ch * cw / (h * w)
        else:
            out[i] = lam * batch[i] + (1 - lam) * batch[j]
        targets[i, labels[i]] += lam
        targets[i, labels[j]] += 1 - lam
    return out, targets


def mix_costs(images: list, image_size: int) -> pd.DataFrame:
    """ms per batch of mixup and cutmix, one image at a time against the whole batch (transforms.v2): a table of
    medians, the timed blocks in attrs["samples"]."""
    batch = as_batch(images, image_size)
    labels = torch.randint(0, CLASSES, (len(batch),))
    mixup, cutmix = T.MixUp(num_classes=CLASSES), T.CutMix(num_classes=CLASSES)
    samples = {
        ("mixup", "one image at a time"): ms_samples(lambda: mix_one_by_one(batch, labels)),
        ("cutmix", "one image at a time"): ms_samples(lambda: mix_one_by_one(batch, labels, area=True)),
        ("mixup", "whole batch (transforms.v2)"): ms_samples(lambda: mixup(batch, labels)),
        ("cutmix", "whole batch (transforms.v2)"): ms_samples(lambda: cutmix(batch, labels)),
    }
    table = pd.Series({k: stats.estimate_of_samples([v]).value for k, v in samples.items()}).unstack()
    table = table.rename_axis(f"ms per batch of {len(batch)}")
    table.attrs.update(samples=samples, batch=len(batch),
                       basis=f"ms per batch of {len(batch)}: the median of {len(samples[('mixup', 'one image at a time')])} "
                             "timed blocks in this notebook's process")
    return table


def cost_verdict(per_image: pd.DataFrame, mix: pd.DataFrame, on_gpu: bool):
    """The lesson: RandAugment's cost per image against batched mixup's cost per image, in this process."""
    batched = [t / mix.attrs["batch"] for t in mix.attrs["samples"][("mixup", "whole batch (transforms.v2)")]]
    return lessons.verdict_of("augment_cost", stats.ratio_of_samples([batched], [per_image.attrs["samples"][RANDAUGMENT]]),
                              on_gpu, "per-image RandAugment against batched mixup, per image, in this process")


def cost_plot(per_image: pd.DataFrame, mix: pd.DataFrame):
    """Per-image pipelines (ms per image, 95 % interval) beside mixup and cutmix each way (ms per batch)."""
    figure, axes = new_figure(1, 2, size=(11, 3.2))
    axes[0, 0].barh(per_image["pipeline"], per_image["ms per image"], color=["tab:gray", "tab:red"], capsize=3,
                    xerr=[per_image["ms per image"] - per_image["low"], per_image["high"] - per_image["ms per image"]])
    axes[0, 0].set(title="per-image augmentation (ms per image, 95 % interval)")
    mix.T.plot.bar(ax=axes[0, 1], rot=0, title=f"mixup / cutmix (ms per batch of {mix.attrs['batch']})")
    return figure


def examples_figure(images: list, image_size: int):
    """Six images under RandAugment, then three under mixup and three under cutmix."""
    batch, labels = as_batch(images[:6], image_size), torch.randint(0, CLASSES, (6,))
    mixed_up, _ = T.MixUp(num_classes=CLASSES)(batch, labels)
    cut, _ = T.CutMix(num_classes=CLASSES)(batch, labels)
    randaugment = pipelines(image_size)[RANDAUGMENT]
    figure, axes = new_figure(2, 6, size=(12, 4.3))
    for k in range(6):
        axes[0, k].imshow(randaugment(images[k]).permute(1, 2, 0))
        axes[0, k].set_title("RandAugment", fontsize=8)
        axes[1, k].imshow((mixed_up if k < 3 else cut)[k].permute(1, 2, 0).clamp(0, 1))
        axes[1, k].set_title("mixup" if k < 3 else "cutmix", fontsize=8)
    for ax in axes.flat:
        ax.axis("off")
    return figure
