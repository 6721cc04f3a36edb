"""A tiny ImageNet-layout folder (data/make_synthetic_imagenet.py) for the tests that train the classifier."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
import make_synthetic_imagenet  # noqa: E402


def tiny_folder(root: Path, *, val_per_class: int, classes: int = 4, per_class: int = 12, size: int = 36) -> Path:
    """`classes` x `per_class` training images (6 steps of 8 an epoch by default), `val_per_class` to validate."""
    make_synthetic_imagenet.main(["--out", str(root), "--classes", str(classes), "--train-per-class", str(per_class),
                                  "--val-per-class", str(val_per_class), "--size", str(size), "--quiet"])
    return root
