"""Training batches from webdataset tar shards (train_classifier.py --data-format webdataset, read_bench.py).

A shard is read from its first byte to its last: few large sequential reads instead of one small file per
image. The data set is then a stream, not an indexable collection, so the work is shared by splitting the
shard list, never the samples:

    shard list, reshuffled each epoch (the same order on every rank: --seed + epoch)
    -> split by rank   rank r of w takes shards r, r + w, ...          (what wds.split_by_node does)
    -> split by worker DataLoader worker k of n takes every n-th of those (wds.split_by_worker)
    -> samples: JPEG bytes and label, shuffled in a buffer, decoded and transformed in the worker, batched

Every sample is read at most once per epoch across ranks and workers. A worker's last batch is partial;
the main process joins those, so every batch is full. Ranks must take the same number of steps (DDP), so
each stops after the number of full batches the smallest share of shards holds (`batches_per_epoch`): the
rest of a larger share waits for another epoch, as with drop_last.

A module shared by the training scripts: it is not part of any TP.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import webdataset as wds
from torch.utils.data import DataLoader, IterableDataset, default_collate

from .storage_formats import DataSetError, decode, read_manifest

IMAGE_KEYS = "jpg;jpeg;png;ppm;bmp;pgm;tif;tiff;webp"  # whichever extension the source file had
SHUFFLE_BUFFER = 1000  # samples each worker mixes before handing one out


class ShardList(IterableDataset):
    """The shard files of a split: in the same order on every rank, reshuffled each epoch when `seed` is set.

    The epoch advances by itself after each pass, so DataLoader workers that live across epochs
    (persistent_workers) follow too; set_epoch sets it for a new pass (fresh workers get a fresh copy)."""

    def __init__(self, urls: list[str], seed: int | None):
        self.urls, self.seed, self.epoch = list(urls), seed, 0

    def __iter__(self):
        urls = list(self.urls)
        if self.seed is not None:
            random.Random(self.seed * 100_003 + self.epoch).shuffle(urls)
        self.epoch += 1
        return iter([{"url": url} for url in urls])


def split_by_rank(shards, rank: int, world_size: int):
    """wds.split_by_node's rule, with the rank handed in: wds.split_by_node guesses it from RANK/WORLD_SIZE or an
    initialised process group, which an srun task (no RANK) or a spawned DataLoader worker may not have."""
    return itertools.islice(shards, rank, None, world_size)


def decode_and(transform, data: bytes):
    return transform(decode(data))


def shard_pipeline(urls: list[str], transform, *, rank: int, world_size: int, seed: int | None,
                   batch_size: int | None, extra=None) -> wds.DataPipeline:
    """(transform(image), label[, extra(sample)]) samples, or batches of them, of this rank's shards.
    seed None: shards in order and samples not shuffled (validation, checksums)."""
    shards = ShardList(urls, seed)
    stages = [
        shards,
        partial(split_by_rank, rank=rank, world_size=world_size),
        wds.split_by_worker,
        wds.tarfile_to_samples(),
        *([wds.shuffle(SHUFFLE_BUFFER)] if seed is not None else []),
        wds.to_tuple(IMAGE_KEYS, "cls", "__url__"),
        wds.map(partial(make_sample, transform=transform, extra=extra)),
        *([wds.batched(batch_size, collation_fn=default_collate, partial=True)] if batch_size else []),
    ]
    pipeline = wds.DataPipeline(*stages)
    pipeline.shards, pipeline.transform = shards, transform  # set_epoch, and what observe_once looks for
    return pipeline


def make_sample(fields, transform, extra):
    data, label, url = fields
    sample = (decode_and(transform, data), int(label))
    return sample + (extra(url),) if extra else sample


@dataclass
class RankShards:
    """What this rank reads of the shards per epoch (where a map-style data set has a DistributedSampler)."""
    rank: int
    world_size: int
    shards: int
    samples: int

    def __len__(self) -> int:
        return self.samples


def full_batches(batches, size: int):
    """Each worker's stream ends with a partial batch: join those, so that every batch holds `size` samples."""
    pending = []
    for images, labels in batches:
        if len(labels) == size and not pending:
            yield images, labels
            continue
        pending.append((images, labels))
        if sum(len(p[1]) for p in pending) >= size:
            images, labels = torch.cat([p[0] for p in pending]), torch.cat([p[1] for p in pending])
            yield images[:size], labels[:size]
            pending = [(images[size:], labels[size:])] if len(labels) > size else []


class ShardStream:
    """This rank's training batches, in place of a DataLoader and its sampler: len() batches per epoch,
    set_epoch() reshuffles the shards, `skip` (samples) starts an epoch further in (resuming: as many batches
    are read and dropped; the shuffle buffer is not seeded, so they are not exactly those of the first run)."""

    def __init__(self, loader: DataLoader, batch_size: int, batches_per_epoch: int):
        self.loader, self.batch_size, self.batches_per_epoch = loader, batch_size, batches_per_epoch
        self.skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.loader.dataset.shards.epoch = epoch

    def __len__(self) -> int:
        return max(0, self.batches_per_epoch - self.skip // self.batch_size)

    def __iter__(self):
        batches = full_batches(iter(self.loader), self.batch_size)
        return itertools.islice(batches, self.skip // self.batch_size, self.batches_per_epoch)

    def __getattr__(self, name):  # num_workers, pin_memory, dataset...: the DataLoader's
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)


def shard_urls(root: str | Path, manifest: dict, split: str) -> list[tuple[str, int]]:
    return [(str(Path(root) / shard["file"]), shard["count"]) for shard in manifest["splits"][split]["shards"]]


def smallest_share(counts: list[int], world_size: int) -> int:
    """Samples in the smallest share of shards a rank can get, whatever the epoch's order: each rank takes
    len // world_size shards or one more, so at least the len // world_size smallest ones."""
    return sum(sorted(counts)[:len(counts) // world_size])


def shard_loaders(root: str | Path, train_transform, val_transform, *, batch_size: int, rank: int, world_size: int,
                  seed: int, loader_options: dict, validation: bool):
    """(training ShardStream, its RankShards, validation DataLoader or None, class names, training samples)."""
    manifest = read_manifest(root)
    train = shard_urls(root, manifest, "train")
    if len(train) < world_size:
        raise DataSetError(f"{root}: {len(train)} training shard(s) for {world_size} ranks: every rank needs one; "
                           "convert again with a smaller --samples-per-shard")
    share = smallest_share([count for _, count in train], world_size)
    pipeline = shard_pipeline([url for url, _ in train], train_transform, rank=rank, world_size=world_size,
                              seed=seed, batch_size=batch_size)
    stream = ShardStream(DataLoader(pipeline, batch_size=None, **loader_options), batch_size, share // batch_size)
    split = RankShards(rank, world_size, len(train[rank::world_size]), share // batch_size * batch_size)
    val_loader = None
    if validation and "val" in manifest["splits"]:  # every validation sample once, over all ranks and workers
        val = shard_pipeline([url for url, _ in shard_urls(root, manifest, "val")], val_transform, rank=rank,
                             world_size=world_size, seed=None, batch_size=batch_size)
        val_loader = DataLoader(val, batch_size=None, **loader_options)
    return stream, split, val_loader, manifest["classes"], manifest["splits"]["train"]["count"]
