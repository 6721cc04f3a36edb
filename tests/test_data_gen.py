"""The synthetic ImageNet-layout generator: layout, real JPEGs, determinism, CLI."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from PIL import Image

REPO = Path(__file__).resolve().parents[1]
GENERATOR = REPO / "data" / "make_synthetic_imagenet.py"


def generate(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GENERATOR), "--out", str(out), "--classes", "3",
                           "--train-per-class", "4", "--val-per-class", "2", "--size", "32", *extra],
                          capture_output=True, text=True, timeout=60, check=True)


def test_layout_and_real_jpegs(tmp_path):
    done = generate(tmp_path / "a")
    assert "18/18 images" in done.stdout  # progress output
    for split, count in (("train", 4), ("val", 2)):
        folders = sorted((tmp_path / "a" / split).iterdir())
        assert [f.name for f in folders] == ["n00000000", "n00000001", "n00000002"]
        for folder in folders:
            files = sorted(folder.glob("*.JPEG"))
            assert len(files) == count
            with Image.open(files[0]) as image:
                assert image.format == "JPEG" and image.mode == "RGB" and image.width == 32
    assert len((tmp_path / "a" / "classes.txt").read_text().splitlines()) == 3


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    generate(tmp_path / "a")
    generate(tmp_path / "b", "--quiet")
    generate(tmp_path / "c", "--quiet", "--seed", "1")
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.JPEG"))
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
    assert any((tmp_path / "a" / f).read_bytes() != (tmp_path / "c" / f).read_bytes() for f in files)


def test_help_and_bad_options():
    done = subprocess.run([sys.executable, str(GENERATOR), "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "--train-per-class" in done.stdout
    done = subprocess.run([sys.executable, str(GENERATOR), "--classes", "1"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2 and "--classes >= 2" in done.stderr
