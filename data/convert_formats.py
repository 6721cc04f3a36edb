"""Convert an ImageNet-layout JPEG folder into webdataset tar shards and raw memory-mapped uint8 arrays.

    python data/convert_formats.py --src data/generated/tiny --out data/generated/tiny-formats --image-size 64
    python data/convert_formats.py --verify data/generated/tiny-formats

writes, for train/ and val/ (when there is one):

    <out>/webdataset/<split>-000000.tar ...   the JPEG files' own bytes (not re-encoded) and the label, in
                                               shards of --samples-per-shard images; decoded when read
    <out>/raw/<split>_images.npy               N x S x S x 3 uint8: each JPEG decoded once, here, and resized to
    <out>/raw/<split>_labels.npy               S x S (bilinear, aspect ratio not kept); read with
                                               np.load(mmap_mode="r"), nothing left to decode
    <out>/manifest.json                        counts, classes, image size, source folder, bytes, checksums

The manifest is written last: a folder without one is an unfinished conversion. Samples keep the source's
order (torchvision ImageFolder's: classes, then files, sorted). --verify reads every sample of the three
formats (the JPEG folder, the shards, the arrays), decodes and resizes it the same way, and compares the
checksums with the manifest's: exit code 0 when all agree, 1 otherwise. Bad input: one line, exit code 2.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import webdataset as wds
from torchvision import datasets

# the readers the training uses: the classifier's shared package, tp_scripts/common
from common.storage_formats import (MANIFEST, RAW_FOLDER, RESIZE, SHARD_FOLDER, SPLITS, Checksum, DataSetError, RawImages,
                                    decode, fixed_size, fixed_size_folder, read_manifest, source_folder)
from common.webdataset_stream import shard_pipeline

FORMATS = ("folder", "webdataset", "raw")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--src", help="ImageNet-layout JPEG folder (train/<class>/*.JPEG, val/...)")
    parser.add_argument("--out", help="folder to write webdataset/, raw/ and manifest.json into")
    parser.add_argument("--image-size", type=int, default=64, help="side S of the raw arrays' S x S images")
    parser.add_argument("--samples-per-shard", type=int, default=100,
                        help="images per tar shard: several ranks x workers need at least one shard each")
    parser.add_argument("--force", action="store_true", help="replace the formats already in --out")
    parser.add_argument("--verify", metavar="ROOT", help="check that the three formats of ROOT hold the same samples")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    args = parser.parse_args(argv)
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    try:
        if not args.verify and not (args.src and args.out):
            parser.error("give --src and --out, --verify ROOT, or both (convert, then verify: one start-up)")
        if args.src or args.out:
            if not args.src or not args.out:
                parser.error("give --src and --out together")
            if args.image_size < 8 or args.samples_per_shard < 1:
                parser.error("--image-size must be at least 8 and --samples-per-shard at least 1")
            convert(Path(args.src), Path(args.out), args.image_size, args.samples_per_shard, args.force, say)
        if args.verify:
            return 0 if report(verify(args.verify), say) else 1
    except DataSetError as error:
        print(f"convert_formats.py: error: {error}", file=sys.stderr)
        return 2
    return 0


# ---- conversion ---------------------------------------------------------------------------------------------

def convert(src: Path, out: Path, size: int, per_shard: int, force: bool, say) -> dict:
    splits = source_splits(src)
    prepare_output(out, force)
    started = time.perf_counter()
    manifest = {"format_version": 1, "source": str(src.resolve()), "source_relative": os.path.relpath(src, out),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "image_size": size, "resize": RESIZE,
                "samples_per_shard": per_shard, "classes": splits["train"].classes, "splits": {}}
    for split, folder in splits.items():
        manifest["splits"][split] = convert_split(folder, out, split, size, per_shard, say)
    write_json(out / MANIFEST, manifest)
    say(f"done in {time.perf_counter() - started:.1f} s: {out / MANIFEST}")
    return manifest


def source_splits(src: Path) -> dict:
    """{split: ImageFolder} of the source, refusing what is not an ImageNet layout."""
    if not (src / "train").is_dir():
        raise DataSetError(f"{src} has no train/ folder: expected {src}/train/<class>/<image>.JPEG "
                           "(make one with data/make_synthetic_imagenet.py)")
    splits = {}
    for split in SPLITS:
        if (src / split).is_dir():
            try:
                splits[split] = datasets.ImageFolder(src / split)
            except (FileNotFoundError, RuntimeError) as error:
                raise DataSetError(f"{src / split}: {error}") from None
    if "val" in splits and splits["val"].classes != splits["train"].classes:
        raise DataSetError(f"{src}/val and {src}/train do not have the same class folders")
    return splits


def prepare_output(out: Path, force: bool) -> None:
    """An empty (or new) folder; with --force, the formats of an earlier conversion are removed first."""
    if out.exists() and not out.is_dir():
        raise DataSetError(f"--out {out} is a file")
    ours = [out / SHARD_FOLDER, out / RAW_FOLDER, out / MANIFEST]
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise DataSetError(f"--out {out} is not empty: pass --force to replace the formats in it")
        for path in ours:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
    (out / SHARD_FOLDER).mkdir(parents=True, exist_ok=True)
    (out / RAW_FOLDER).mkdir(exist_ok=True)


def convert_split(folder: datasets.ImageFolder, out: Path, split: str, size: int, per_shard: int, say) -> dict:
    """One pass over the split's files: each JPEG's bytes into a shard, its decoded pixels into the array."""
    count = len(folder.samples)
    images_file, labels_file = f"{RAW_FOLDER}/{split}_images.npy", f"{RAW_FOLDER}/{split}_labels.npy"
    images = np.lib.format.open_memmap(out / images_file, mode="w+", dtype=np.uint8, shape=(count, size, size, 3))
    labels = np.array(folder.targets, dtype=np.int64)
    checksum, jpeg_bytes = Checksum(), 0
    pattern = str(out / SHARD_FOLDER / f"{split}-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=per_shard, maxsize=float("inf"), verbose=0) as shards:
        for index, (path, label) in enumerate(folder.samples):
            data = Path(path).read_bytes()
            jpeg_bytes += len(data)
            pixels = fixed_size(decode(data), size)
            images[index] = pixels
            checksum.add(pixels, label)
            shards.write({"__key__": f"{index:08d}", Path(path).suffix.lower().lstrip("."): data,
                          "cls": str(label).encode()})
            if (index + 1) % 1000 == 0:
                say(f"{split}: {index + 1}/{count} images")
    images.flush()
    del images
    np.save(out / labels_file, labels)
    shard_files = [f"{SHARD_FOLDER}/{split}-{k:06d}.tar" for k in range((count + per_shard - 1) // per_shard)]
    say(f"{split}: {count} images -> {len(shard_files)} shard(s), {images_file}")
    return {"count": count, "checksum": checksum.result(), "folder_bytes": jpeg_bytes,
            "shards": [{"file": name, "count": min(per_shard, count - k * per_shard),
                        "bytes": (out / name).stat().st_size} for k, name in enumerate(shard_files)],
            "raw": {"images": images_file, "labels": labels_file, "shape": [count, size, size, 3],
                    "label_dtype": "int64", "bytes": (out / images_file).stat().st_size + (out / labels_file).stat().st_size}}


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


# ---- verification -------------------------------------------------------------------------------------------

def canonical_samples(root: Path, manifest: dict, data_format: str, split: str):
    """(S x S x 3 uint8, label) of every sample of one split in one format, in the stored order, one process."""
    size = manifest["image_size"]
    if data_format == "folder":
        return iter(fixed_size_folder(source_folder(root, manifest), split, size))
    if data_format == "raw":
        return iter(RawImages(root, split))
    urls = [str(root / shard["file"]) for shard in manifest["splits"][split]["shards"]]
    return iter(shard_pipeline(urls, lambda image: fixed_size(image, size), rank=0, world_size=1, seed=None,
                               batch_size=None))


def checksums(root: str | Path, data_format: str, split: str = "train") -> dict:
    """The checksum of one split as read from one format."""
    root = Path(root)
    manifest = read_manifest(root)
    checksum = Checksum()
    for pixels, label in canonical_samples(root, manifest, data_format, split):
        checksum.add(pixels, label)
    return checksum.result()


def verify(root: str | Path) -> dict:
    """{split: {"manifest": checksum, format: checksum, ...}} for every split and format."""
    manifest = read_manifest(root)
    return {split: {"manifest": info["checksum"], **{fmt: checksums(root, fmt, split) for fmt in FORMATS}}
            for split, info in manifest["splits"].items()}


def report(found: dict, say) -> bool:
    same = True
    for split, sums in found.items():
        expected = sums["manifest"]
        for fmt in FORMATS:
            agrees = sums[fmt] == expected
            same &= agrees
            say(f"{split:5s} {fmt:10s} {sums[fmt]['samples']:7d} samples  pixel sum {sums[fmt]['pixel_sum']:>14d}  "
                f"sha256 {sums[fmt]['sha256'][:16]}  {'same' if agrees else 'DIFFERENT'}")
    say("the three formats hold the same samples" if same else "the formats differ")
    return same


if __name__ == "__main__":
    sys.exit(main())
