"""The parts of train_classifier.py's Data that no TP asks you to write: the synthetic batches, the DataLoader
workers' start and time limit, the webdataset stream, the mixup/cutmix mixer.

A module shared by tp_scripts/train_classifier.py (yours) and tp_scripts/solutions/train_classifier.py:
not part of any TP.
"""
from __future__ import annotations

from torchvision.transforms import v2 as T

from .image_data import SyntheticBatches, train_transform, val_transform, worker_start
from .storage_formats import read_manifest
from .train_options import augmentations
from .training_state import Data
from .webdataset_stream import shard_loaders

LOADER_TIMEOUT_S = 120  # seconds a DataLoader worker may take for one batch before the run stops with that cause


def synthetic_data(args, rank: int, device) -> Data:
    """--data synthetic: one random batch made on the device, served again and again (the compute ceiling)."""
    batches = SyntheticBatches(args.batch_size, args.image_size, args.num_classes, args.synthetic_steps, device,
                               seed=args.seed + rank)
    return Data(batches, batches, None, None, args.num_classes, None, None, {}, False,
                build_mixer(args, args.num_classes))


def worker_options(world_size: int, loader_options: dict) -> dict:
    """With DataLoader workers: a worker that stops answering ends the run with that cause instead of hanging it,
    and the workers of a rank start from a forkserver (image_data.worker_start says why). Without: nothing."""
    workers = loader_options.get("num_workers")
    return dict(timeout=LOADER_TIMEOUT_S, **worker_start(world_size, workers)) if workers else {}


def shard_data(args, rank: int, world_size: int, randaugment: bool, loader_options: dict, workers: dict,
               non_blocking: bool) -> Data:
    """--data-format webdataset: shards split by rank, then by DataLoader worker (webdataset_stream.py)."""
    stream, split, val_loader, classes, train_size = shard_loaders(
        args.data, train_transform(args.image_size, randaugment), val_transform(args.image_size),
        batch_size=args.batch_size, rank=rank, world_size=world_size, seed=args.seed,
        loader_options={**workers, **loader_options}, validation=not args.test)
    val_size = read_manifest(args.data)["splits"].get("val", {}).get("count") if val_loader is not None else None
    return Data(stream, stream, split, val_loader, len(classes), train_size, val_size, loader_options, non_blocking,
                build_mixer(args, len(classes)))


def build_mixer(args, num_classes: int):
    """mixup / cutmix (--augment): they need a whole batch, so they run in the loop, on the device."""
    mixers = [T.MixUp(num_classes=num_classes) if name == "mixup" else T.CutMix(num_classes=num_classes)
              for name in augmentations(args.augment) if name in ("mixup", "cutmix")]
    if not mixers:
        return None
    return mixers[0] if len(mixers) == 1 else T.RandomChoice(mixers)  # both: one of the two per batch
