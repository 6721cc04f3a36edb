"""Read the same images from each storage format through a DataLoader, and time it: images/s and MB/s.

    python read_bench.py --data data/generated/tiny-formats --formats folder,webdataset,raw --workers 0,2,4

The job of the storage TP (Day 3). --data is a folder made by data/convert_formats.py (its manifest names the
JPEG folder it came from). For each format and worker count, a DataLoader reads --batches batches of the
canonical sample (decoded and resized to the manifest's S x S, uint8: no augmentation, no normalisation, so
only reading and decoding is timed):

    folder      open each JPEG file, decode it, resize it                 (random order, like training)
    webdataset  read tar shards from start to end, decode each JPEG, resize (shards in random order,
                each worker its own shards: webdataset_stream.py)
    raw         copy S x S x 3 bytes out of a memory-mapped array          (random order)

The first batch (starting the workers, opening files) is timed apart from the rest. Each format x workers is
measured --repeats times, the rounds interleaved (every measurement once, then again), so that a drift of the
machine hits all of them alike and each speed gets an interval from its repeats (dlokit.analysis.read_table). `mb_per_s` counts the
bytes each format stores for the images read: the JPEG file, the sample's share of its tar shard (headers
included), or the S x S x 3 raw pixels. By default each format's files are evicted from the page cache before
its measurement (posix_fadvise DONTNEED: a cold read, where the file system honours it), so the bytes come
from the disk; --warm-cache keeps them. One `read_result` line per format x workers in metrics.jsonl, the
table in summary.json `results` (docs/run-records.md).
"""
import argparse
import itertools
import os
import sys
import time
from functools import partial
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

from dlokit.in_job import rank as job
from dlokit.in_job.peers import leave_now
from dlokit.in_job.runrecord import RunRecorder

from common.storage_formats import (DataSetError, RawImages, check_converted, fixed_size, fixed_size_folder, read_manifest,
                             source_folder)
from common.webdataset_stream import shard_pipeline

FORMATS = ("folder", "webdataset", "raw")


def main(argv=None) -> int:
    args = parse_args(argv)
    env = job.detect()
    manifest = read_manifest(args.data)
    record = RunRecorder({**vars(args), "image_size": manifest["image_size"], "source": manifest["source"],
                          "stored_bytes": stored_bytes(args.data, manifest, args.split)},
                         rank=env.rank, world_size=env.world_size, runs_dir=args.runs_dir, script="read_bench.py")
    print(f"run {record.run_id} | {args.data} ({args.split}, {manifest['image_size']} px) | batch {args.batch_size} "
          f"x {args.batches} | {'warm' if args.warm_cache else 'cold'} page cache", flush=True)
    results = []
    for repeat, (data_format, workers) in itertools.product(range(args.repeats),
                                                            itertools.product(args.formats, args.workers)):
        if not args.warm_cache:
            evict_from_page_cache(format_files(args.data, manifest, data_format, args.split))
        line = {"format": data_format, "num_workers": workers, "repeat": repeat, "batch_size": args.batch_size,
                "cache": "warm" if args.warm_cache else "cold", **read(args, manifest, data_format, workers)}
        record.log("read_result", **line)
        results.append(line)
        print(f"{data_format:10s} {workers:2d} workers | round {repeat + 1} | {line['images_per_s']:9.1f} img/s | "
              f"{line['mb_per_s']:8.2f} MB/s | first batch {line['t_first_batch']:.3f} s | {line['images']} images",
              flush=True)
    record.finish(results=results)
    return 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="read_bench.py", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                description="Images/s and MB/s of each storage format and DataLoader worker count.")
    p.add_argument("--data", default=os.environ.get("DLOKIT_DATA"), help="a folder made by data/convert_formats.py")
    p.add_argument("--formats", default="folder,webdataset,raw", help="comma list of folder, webdataset, raw")
    p.add_argument("--workers", default="0,2", help="comma list of DataLoader worker counts")
    p.add_argument("--batch-size", type=int, default=64, help="images per batch")
    p.add_argument("--batches", type=int, default=20, help="batches read per measurement (fewer if the split ends)")
    p.add_argument("--split", choices=("train", "val"), default="train", help="which split to read")
    p.add_argument("--repeats", type=int, default=3, help="measurements of each format x workers, interleaved")
    p.add_argument("--warm-cache", action="store_true", help="do not evict the files from the page cache first")
    p.add_argument("--seed", type=int, default=0, help="reading order")
    p.add_argument("--runs-dir", default=None, help="where run records go [default: $DLOKIT_RUNS_DIR or ./runs]")
    args = p.parse_args(argv)
    args.formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if not args.formats or any(f not in FORMATS for f in args.formats):
        p.error(f"--formats: choose among {', '.join(FORMATS)} (comma-separated)")
    try:
        args.workers = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        p.error(f"--workers {args.workers}: whole numbers, comma-separated")
    if not args.workers or min(args.workers) < 0:
        p.error("--workers: one or more counts, none negative")
    if args.batch_size < 1 or args.batches < 1 or args.repeats < 1:
        p.error("--batch-size, --batches and --repeats must be at least 1")
    if args.data is None:
        p.error("no data: pass --data, a folder made by data/convert_formats.py")
    try:
        manifest = read_manifest(args.data)
        if args.split not in manifest["splits"]:
            p.error(f"--split {args.split}: {args.data} has no such split")
        for data_format in args.formats:
            check_converted(args.data, data_format)
    except DataSetError as error:
        p.exit(2, f"{p.prog}: error: {error}\n")
    return args


# ---- one measurement ---------------------------------------------------------------------------------------

class WithBytes(Dataset):
    """(pixels, label, bytes stored for this sample) of a map-style data set."""

    def __init__(self, dataset, sample_bytes):
        self.dataset, self.sample_bytes = dataset, sample_bytes

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        return (*self.dataset[index], self.sample_bytes(index))


def file_size(dataset, index: int) -> int:
    return os.path.getsize(dataset.samples[index][0])


def constant(value: int, index: int) -> int:
    return value


def shard_share(bytes_per_sample: dict, url: str) -> float:
    return bytes_per_sample[url]


def loader_for(args, manifest: dict, data_format: str, workers: int) -> DataLoader:
    size, root = manifest["image_size"], Path(args.data)
    if data_format == "webdataset":
        shards = manifest["splits"][args.split]["shards"]
        share = {str(root / s["file"]): s["bytes"] / s["count"] for s in shards}
        pipeline = shard_pipeline(list(share), partial(fixed_size, size=size), rank=0, world_size=1, seed=args.seed,
                                  batch_size=args.batch_size, extra=partial(shard_share, share))
        return DataLoader(pipeline, batch_size=None, num_workers=workers)
    if data_format == "folder":
        images = fixed_size_folder(source_folder(root, manifest), args.split, size)
        dataset = WithBytes(images, partial(file_size, images))
    else:
        images = RawImages(root, args.split)
        dataset = WithBytes(images, partial(constant, images.sample_bytes))
    order = RandomSampler(dataset, generator=torch.Generator().manual_seed(args.seed))
    return DataLoader(dataset, batch_size=args.batch_size, sampler=order, num_workers=workers)


def read(args, manifest: dict, data_format: str, workers: int) -> dict:
    """Time --batches batches: the first apart (worker start-up), the rest as the steady pace."""
    loader = loader_for(args, manifest, data_format, workers)
    started = time.perf_counter()
    batches = iter(loader)
    counts = []  # (images, bytes, pixel sum) per batch
    first = None
    for pixels, labels, sample_bytes in itertools.islice(batches, args.batches):
        counts.append((len(labels), float(sample_bytes.sum()), int(pixels.sum(dtype=torch.int64))))
        first = first or time.perf_counter() - started
    seconds = time.perf_counter() - started
    del batches  # ends the workers before the next measurement
    images, read_bytes = sum(c[0] for c in counts), sum(c[1] for c in counts)
    steady_images, steady_bytes = images - counts[0][0], read_bytes - counts[0][1]
    steady_s = seconds - first
    steady = len(counts) > 1 and steady_s > 0
    return {"batches": len(counts), "images": images, "bytes_read": read_bytes, "t_first_batch": first,
            "t_total": seconds, "images_per_s": steady_images / steady_s if steady else images / seconds,
            "mb_per_s": (steady_bytes if steady else read_bytes) / (steady_s if steady else seconds) / 1e6,
            "images_per_s_with_startup": images / seconds, "pixel_sum": sum(c[2] for c in counts)}


# ---- files and the page cache ------------------------------------------------------------------------------

def format_files(root, manifest: dict, data_format: str, split: str) -> list[Path]:
    root = Path(root)
    info = manifest["splits"][split]
    if data_format == "webdataset":
        return [root / s["file"] for s in info["shards"]]
    if data_format == "raw":
        return [root / info["raw"]["images"], root / info["raw"]["labels"]]
    return [Path(path) for path, _ in fixed_size_folder(source_folder(root, manifest), split, 8).samples]


def stored_bytes(root, manifest: dict, split: str) -> dict:
    """What each format takes on disk for the split."""
    info = manifest["splits"][split]
    return {"folder": info["folder_bytes"], "webdataset": sum(s["bytes"] for s in info["shards"]),
            "raw": info["raw"]["bytes"]}


def evict_from_page_cache(paths) -> None:
    """Ask the kernel to forget the cached pages of these files, so that the next read goes to the disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


if __name__ == "__main__":
    try:
        code = main()
    except DataSetError as error:
        print(f"read_bench.py: error: {error}", file=sys.stderr)
        code = 1
    leave_now(code)  # without the interpreter's teardown (a second of CPU): see dlokit.in_job.peers.leave_now
