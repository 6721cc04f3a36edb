"""Three ways to store the same images, read by train_classifier.py (--data-format) and read_bench.py.

    folder      <source>/<split>/<class>/<image>.JPEG   one file per image, opened and decoded per image
    webdataset  <root>/webdataset/<split>-000000.tar    the same JPEG bytes packed in tar shards, read from start
                                                        to end; decoded per image in the DataLoader workers
    raw         <root>/raw/<split>_images.npy           N x S x S x 3 uint8, decoded and resized to S x S once,
                <root>/raw/<split>_labels.npy           at conversion; memory-mapped: nothing left to decode

data/convert_formats.py writes webdataset/, raw/ and <root>/manifest.json (counts, classes, image size,
source folder, checksums) from a JPEG folder. Every format can hand out the canonical sample: the image
decoded as torchvision's ImageFolder decodes it (PIL, RGB), resized to S x S by `fixed_size`, and its label,
in the same order; `Checksum` over those samples is the same for the three formats (tested).

A module shared by the training scripts and the data tools: it is not part of any TP.
webdataset_stream.py reads the shards for training (each rank, then each worker, its own shards).
"""
from __future__ import annotations

import hashlib
import io
import json
from functools import partial
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import datasets

from .image_data import DataSetError, image_folders, train_transform, val_transform

MANIFEST = "manifest.json"
SPLITS = ("train", "val")
SHARD_FOLDER, RAW_FOLDER = "webdataset", "raw"
RESIZE = "bilinear, to S x S (aspect ratio not kept)"  # what fixed_size does, written into the manifest


# ---- the canonical sample ----------------------------------------------------------------------------

def decode(data: bytes) -> Image.Image:
    """JPEG (or PNG...) bytes to an RGB image, as torchvision's ImageFolder loader does it."""
    image = Image.open(io.BytesIO(data))
    return image.convert("RGB")


def fixed_size(image: Image.Image, size: int) -> np.ndarray:
    """S x S x 3 uint8: how every image is resized for the raw arrays (and for the checksums)."""
    return np.array(image.resize((size, size), Image.BILINEAR), dtype=np.uint8)


class Checksum:
    """sha256 over (label, pixels) of each sample in order, plus the pixel and label sums (readable)."""

    def __init__(self):
        self.hash, self.samples, self.pixel_sum, self.label_sum = hashlib.sha256(), 0, 0, 0

    def add(self, pixels: np.ndarray, label: int) -> None:
        pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
        self.hash.update(int(label).to_bytes(8, "little", signed=True))
        self.hash.update(pixels.tobytes())
        self.samples += 1
        self.pixel_sum += int(pixels.sum(dtype=np.int64))
        self.label_sum += int(label)

    def result(self) -> dict:
        return {"samples": self.samples, "pixel_sum": self.pixel_sum, "label_sum": self.label_sum,
                "sha256": self.hash.hexdigest()}


# ---- the manifest --------------------------------------------------------------------------------------

def read_manifest(root: str | Path) -> dict:
    path = Path(root).expanduser() / MANIFEST
    if not path.is_file():
        raise DataSetError(f"{root} holds no {MANIFEST}: make the formats with: "
                           f"python data/convert_formats.py --src <JPEG folder> --out {root}")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise DataSetError(f"{path} cannot be read ({error})") from None
    if not isinstance(manifest, dict) or "train" not in manifest.get("splits", {}):
        raise DataSetError(f"{path} is not a manifest of data/convert_formats.py (no splits.train)")
    return manifest


def source_folder(root: str | Path, manifest: dict) -> Path:
    """The JPEG folder the formats were made from (the folder format): as written, or relative to root."""
    for candidate in (Path(manifest["source"]), Path(root) / manifest.get("source_relative", "")):
        if (candidate / "train").is_dir():
            return candidate
    raise DataSetError(f"the JPEG folder {manifest['source']} that {root} was converted from is gone")


def check_converted(root: str | Path, data_format: str, world_size: int = 1) -> dict:
    """The manifest, once the files of `data_format` it names are there (and, for shards, at least one
    training shard per rank); DataSetError otherwise."""
    manifest = read_manifest(root)
    root = Path(root).expanduser()
    shards = len(manifest["splits"]["train"]["shards"])
    if data_format == "webdataset" and shards < world_size:
        raise DataSetError(f"{root}: {shards} training shard(s) for {world_size} processes: each rank reads whole "
                           "shards and needs one at least; convert again with a smaller --samples-per-shard")
    for split, info in manifest["splits"].items():
        if data_format == "webdataset":
            files = [root / shard["file"] for shard in info["shards"]]
        elif data_format == "raw":
            files = [root / info["raw"]["images"], root / info["raw"]["labels"]]
        else:
            source_folder(root, manifest)
            return manifest
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise DataSetError(f"{root}: {data_format} files of {split} missing ({', '.join(missing[:3])}); "
                               "convert again with data/convert_formats.py --force")
    return manifest


# ---- map-style readers: folder and raw ---------------------------------------------------------------------

class RawImages(Dataset):
    """Decoded images from <root>/raw, memory-mapped: (image, label). The image is the S x S x 3 uint8 array
    when there is no transform, else transform(a 3 x S x S uint8 tensor)."""

    def __init__(self, root: str | Path, split: str, transform=None):
        manifest = read_manifest(root)
        info = manifest["splits"][split]["raw"]
        self.images_path, self.labels_path = Path(root) / info["images"], Path(root) / info["labels"]
        self.classes, self.transform = manifest["classes"], transform
        self.targets = np.load(self.labels_path).tolist()
        self._images = None  # opened in the process that reads (each DataLoader worker maps the file itself)
        self.sample_bytes = int(np.prod(info["shape"][1:])) + np.dtype(info["label_dtype"]).itemsize

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        if self._images is None:
            self._images = np.load(self.images_path, mmap_mode="r")
        pixels = np.array(self._images[index])  # a copy: the page-cache bytes are read here
        if self.transform is None:
            return pixels, self.targets[index]
        return self.transform(torch.from_numpy(pixels).permute(2, 0, 1)), self.targets[index]

    def __getstate__(self):  # workers get the paths, never a copy of the mapped array
        return {**self.__dict__, "_images": None}


def fixed_size_folder(root: str | Path, split: str, size: int) -> datasets.ImageFolder:
    """The JPEG folder as canonical samples: (S x S x 3 uint8 array, label), in ImageFolder's order."""
    return datasets.ImageFolder(Path(root) / split, loader=read_bytes, transform=partial(decoded_fixed_size, size=size))


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def decoded_fixed_size(data: bytes, size: int) -> np.ndarray:
    return fixed_size(decode(data), size)


def open_image_data(root: str | Path, data_format: str, image_size: int, randaugment: bool = False):
    """(train set, val set or None, class names) of the folder or raw format, with the training transforms."""
    if data_format == "folder":
        return image_folders(root, image_size, randaugment)
    if data_format != "raw":
        raise ValueError(f"{data_format}: a stream, not a map-style data set (webdataset_stream.py reads it)")
    manifest = check_converted(root, data_format)
    train = RawImages(root, "train", train_transform(image_size, randaugment))
    val = RawImages(root, "val", val_transform(image_size)) if "val" in manifest["splits"] else None
    return train, val, manifest["classes"]
