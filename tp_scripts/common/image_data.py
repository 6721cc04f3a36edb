"""Image data for train_classifier.py: an ImageNet-layout folder of JPEGs, or on-device random tensors.

A module shared by tp_scripts/train_classifier.py (yours) and tp_scripts/solutions/train_classifier.py:
what the TPs tune (DataLoader options, DistributedSampler, where augmentation runs) stays in the training
script; this module only finds and checks the files, builds the per-image transforms and knows how to
restart an epoch in the middle (for --resume).

A damaged image (a JPEG cut short, a file that is no image) stops the run with DataSetError
'<path> cannot be decoded (...)' when a batch first reads it (load_image): no image is skipped silently.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import Sampler
from torchvision import datasets
from torchvision.transforms import v2 as T

IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class DataSetError(ValueError):
    pass


def _class_folders(split: Path) -> list[Path]:
    return sorted(p for p in split.iterdir() if p.is_dir() and not p.name.startswith("."))


def _has_image(folder: Path) -> bool:
    return any(f.suffix.lower() in IMAGE_SUFFIXES for f in folder.iterdir())


def check_image_folder(root: str | Path) -> None:
    """Raise DataSetError, naming the path, unless root/train (and root/val if present) hold class folders of images."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataSetError(f"data set folder {root} does not exist")
    for split in ("train", "val"):
        folder = root / split
        if not folder.is_dir():
            if split == "val":
                continue  # no validation set: training still works, validation is skipped
            raise DataSetError(f"{root} has no train/ folder: expected {root}/train/<class>/<image>.JPEG "
                               "(the ImageNet layout)")
        classes = _class_folders(folder)
        if not classes:
            raise DataSetError(f"{folder} has no class folders: expected {folder}/<class>/<image>.JPEG")
        if not any(_has_image(c) for c in classes[:50]):
            raise DataSetError(f"no images found in the class folders of {folder} "
                               f"(looked for {', '.join(IMAGE_SUFFIXES)})")


def load_image(path: str) -> Image.Image:
    """ImageFolder's loader (PIL, RGB), which names the file it cannot decode. A damaged image stops the run
    rather than being skipped: an epoch would then train on fewer images than the folder holds, and say nothing."""
    try:
        with open(path, "rb") as file:
            return Image.open(file).convert("RGB")
    except OSError as error:  # PIL's "Truncated File Read", "image file is truncated", UnidentifiedImageError
        raise DataSetError(f"{path} cannot be decoded ({error}): the image is damaged or cut short; replace or "
                           "remove the file") from None


def train_transform(image_size: int, randaugment: bool = False):
    """Per image, wherever the DataLoader runs it (in its workers when --num-workers > 0)."""
    return T.Compose([
        T.RandomResizedCrop(image_size, scale=(0.35, 1.0), antialias=True),
        T.RandomHorizontalFlip(),
        *([T.RandAugment(num_ops=2, magnitude=9)] if randaugment else []),  # a few random operations per image
        T.ToImage(), T.ToDtype(torch.float32, scale=True),
        T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


def uses_randaugment(dataset) -> bool:
    """True when the data set's per-image transform includes RandAugment."""
    transform = getattr(dataset, "transform", None)
    return any(isinstance(step, T.RandAugment) for step in getattr(transform, "transforms", []))


def val_transform(image_size: int):
    return T.Compose([
        T.Resize(int(image_size * 1.14), antialias=True),  # the usual 224/256 ratio
        T.CenterCrop(image_size),
        T.ToImage(), T.ToDtype(torch.float32, scale=True),
        T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


def image_folders(root: str | Path, image_size: int, randaugment: bool = False):
    """(train_set, val_set or None, class names). Call check_image_folder first for friendly errors."""
    root = Path(root).expanduser()
    train_set = datasets.ImageFolder(root / "train", transform=train_transform(image_size, randaugment),
                                     loader=load_image)
    val_set = None
    if (root / "val").is_dir():
        val_set = datasets.ImageFolder(root / "val", transform=val_transform(image_size), loader=load_image)
        if val_set.classes != train_set.classes:
            raise DataSetError(f"{root}/val and {root}/train do not have the same class folders")
    return train_set, val_set, train_set.classes


class SyntheticBatches:
    """The same random batch, made once on the device, served `steps` times per epoch: no loading cost."""

    def __init__(self, batch_size: int, image_size: int, num_classes: int, steps: int, device, seed: int = 0):
        generator = torch.Generator(device="cpu").manual_seed(seed)
        self.images = torch.randn(batch_size, 3, image_size, image_size, generator=generator).to(device)
        self.labels = torch.randint(0, num_classes, (batch_size,), generator=generator).to(device)
        self.steps = steps
        self.skip = 0  # in samples, like ResumableSampler.skip

    def set_epoch(self, epoch: int) -> None:
        pass  # the same batch every step: nothing to reshuffle

    def __len__(self) -> int:
        return max(0, self.steps - self.skip // len(self.labels))

    def __iter__(self):
        return itertools.repeat((self.images, self.labels), len(self))


class ResumableSampler(Sampler):
    """Wraps a sampler so that an epoch can start after its first `skip` samples (resuming mid-epoch).

    Sampling happens in the main process even with workers, so changing `skip` between epochs works
    with persistent workers too.
    """

    def __init__(self, sampler):
        self.sampler = sampler
        self.skip = 0

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self):
        return itertools.islice(iter(self.sampler), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.sampler) - self.skip)


def worker_start(world_size: int, num_workers: int) -> dict:
    """How the DataLoader starts its worker processes: {} (fork, PyTorch's default) for one process, a forkserver
    for the ranks of a multi-process job.

    A rank of a job holds threads that are not Python's: the process group's (gloo, NCCL) call into Python now and
    then, to free the tensors of a finished collective, and do so by creating a Python thread state, under the
    interpreter's runtime lock. Python 3.11 before 3.11.10 keeps that lock in a child forked at that moment, and
    the child deadlocks before its first line (CPython issue gh-112275): the DataLoader waits for that worker
    forever. It hung Day 2's 2-rank training at its first validation, right after the epoch's all-reduce
    (2026-11-25; the stuck worker's stack: os.fork -> PyOS_AfterFork_Child -> _PyThreadState_DeleteExcept).
    A forkserver forks the workers from a process of its own, which has no such thread. It starts once per rank and
    imports torch and torchvision (a few seconds of one core, while the rank builds its model; on the local backend it
    is forked from the kit's warm-start server, where they are imported already: dlokit.in_job.warm_start); each worker then
    imports this script's small data modules itself (CPython 3.11's forkserver does not take the rank's sys.path).
    It ignores SIGUSR1/SIGUSR2, as its workers do: Slurm's `--signal` warning goes to every process of the step, and
    only the rank acts on it (--checkpoint-on-signal); a worker killed by it would fail the epoch."""
    if world_size <= 1 or num_workers <= 0:
        return {}
    import multiprocessing
    import signal
    from multiprocessing import forkserver

    from dlokit.in_job import warm_start

    context = multiprocessing.get_context("forkserver")
    # Never the job's __main__ (the default): a script without a __name__ guard would run again in the server.
    context.set_forkserver_preload(["torch", "torchvision"])
    warnings = (signal.SIGUSR1, signal.SIGUSR2)
    kept = {signum: signal.signal(signum, signal.SIG_IGN) for signum in warnings}  # an ignored signal stays so in exec
    try:
        with warm_start.forkserver_from_server():  # on the local backend, forked from a process with torch imported
            forkserver.ensure_running()  # started now, while the rank builds its model
    finally:
        for signum, handler in kept.items():
            signal.signal(signum, handler)
    return {"multiprocessing_context": context}
