"""Write a small synthetic data set in the ImageNet folder layout, as real JPEG files.

    root/train/<class>/<class>_<index>.JPEG
    root/val/<class>/<class>_<index>.JPEG
    root/classes.txt                     one line per class: folder name, then what it shows

Each class is one shape (disc, square, triangle, ring, cross, stripes, ...) in one hue, drawn at a
random position, scale and angle on a noisy background, so a network trained from scratch learns
the classes in a few epochs on a CPU, while the DataLoader still has to open, decode, crop and
normalise real JPEG files like it would for ImageNet.

--hard makes a CIFAR-like set instead (square 32 px images by default) that a network does not master
in a few epochs: classes share shapes, neighbouring classes have overlapping hue ranges, each image
holds smaller distractor shapes of other classes (sometimes on top of the object) on a noisy gradient
background, so that batch size and learning rate visibly change the accuracy reached (Day 3).

The output depends only on the options and --seed (every image has its own random stream), so two
runs write byte-identical files.

    python data/make_synthetic_imagenet.py --out data/generated/tiny --classes 10 --train-per-class 50
    python data/make_synthetic_imagenet.py --out data/generated/hard32 --hard --train-per-class 300
"""
from __future__ import annotations

import argparse
import colorsys
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

SHAPES = ("disc", "square", "triangle", "ring", "cross", "stripes", "diamond", "dots")
GOLDEN_RATIO = 0.618033988749895


def class_look(index: int, n_classes: int) -> tuple[str, float]:
    """The shape and hue of a class: neighbouring classes differ in both."""
    shape = SHAPES[index % len(SHAPES)]
    hue = (index * GOLDEN_RATIO) % 1.0 if n_classes > len(SHAPES) else index / n_classes
    return shape, hue


def polygon(cx, cy, radius, angle, corners):
    return [(cx + radius * math.cos(angle + 2 * math.pi * k / corners),
             cy + radius * math.sin(angle + 2 * math.pi * k / corners)) for k in range(corners)]


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx, cy, radius, angle, colour, rng):
    if shape == "disc":
        draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=colour)
    elif shape == "square":
        draw.polygon(polygon(cx, cy, radius * 1.2, angle, 4), fill=colour)
    elif shape == "triangle":
        draw.polygon(polygon(cx, cy, radius * 1.3, angle, 3), fill=colour)
    elif shape == "diamond":
        draw.polygon(polygon(cx, cy, radius * 1.2, angle, 4), outline=colour, width=max(2, int(radius / 3)))
    elif shape == "ring":
        draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], outline=colour,
                     width=max(2, int(radius / 2.5)))
    elif shape == "cross":
        width = max(2, int(radius / 2))
        for a in (angle, angle + math.pi / 2):
            dx, dy = radius * 1.3 * math.cos(a), radius * 1.3 * math.sin(a)
            draw.line([cx - dx, cy - dy, cx + dx, cy + dy], fill=colour, width=width)
    elif shape == "stripes":
        width = max(2, int(radius / 4))
        dx, dy = math.cos(angle), math.sin(angle)
        for offset in range(-3, 4):
            ox, oy = -dy * offset * width * 2, dx * offset * width * 2
            draw.line([cx + ox - dx * radius * 1.5, cy + oy - dy * radius * 1.5,
                       cx + ox + dx * radius * 1.5, cy + oy + dy * radius * 1.5], fill=colour, width=width)
    elif shape == "dots":
        for _ in range(7):
            x, y = cx + rng.uniform(-radius, radius), cy + rng.uniform(-radius, radius)
            r = radius / 3.5
            draw.ellipse([x - r, y - r, x + r, y + r], fill=colour)


def make_image(class_index: int, n_classes: int, size: int, rng: random.Random, noise: float) -> Image.Image:
    shape, hue = class_look(class_index, n_classes)
    # ImageNet photos are not square: vary the aspect ratio a little, so the crop transforms matter.
    width, height = size, int(size * rng.uniform(0.75, 1.33))
    background = tuple(int(rng.uniform(40, 215)) for _ in range(3))
    image = Image.new("RGB", (width, height), background)
    draw = ImageDraw.Draw(image)
    for _ in range(rng.randint(0, 3)):  # clutter: grey blobs that carry no class information
        x, y, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(2, size / 6)
        grey = int(rng.uniform(0, 255))
        draw.ellipse([x - r, y - r, x + r, y + r], fill=(grey, grey, grey))
    radius = rng.uniform(0.18, 0.32) * min(width, height)
    cx = rng.uniform(radius, width - radius)
    cy = rng.uniform(radius, height - radius)
    r, g, b = colorsys.hsv_to_rgb((hue + rng.uniform(-0.03, 0.03)) % 1.0, rng.uniform(0.7, 1.0), rng.uniform(0.75, 1.0))
    draw_shape(draw, shape, cx, cy, radius, rng.uniform(0, 2 * math.pi), (int(r * 255), int(g * 255), int(b * 255)), rng)
    if noise > 0:
        speckle = Image.effect_noise((width, height), 64 * noise).convert("RGB")
        image = Image.blend(image, speckle, min(0.5, 0.25 * noise))
    return image.filter(ImageFilter.GaussianBlur(rng.uniform(0, 0.8)))


def hard_look(index: int, n_classes: int) -> tuple[str, float]:
    """--hard: half as many shapes as classes, and hues one class apart on the wheel. Classes that share a
    shape differ in hue by half the wheel; neighbouring hues, which overlap (HARD_HUE_JITTER), differ in
    shape: only shape and hue together name the class."""
    n_shapes = min(len(SHAPES), max(2, math.ceil(n_classes / 2)))
    return SHAPES[index % n_shapes], index / n_classes


HARD_HUE_JITTER = 0.07   # of the hue wheel, either way: with 10 classes (0.1 apart) neighbours overlap
HARD_OVERSAMPLE = 2      # draw at twice the size, then shrink: smooth edges even at 32 px


def make_hard_image(class_index: int, n_classes: int, size: int, rng: random.Random, noise: float) -> Image.Image:
    """A square image: the class's shape (the largest object), one to three smaller distractors of random
    shapes and hues, some drawn over it, on a two-colour gradient, with Gaussian pixel noise."""
    canvas = size * HARD_OVERSAMPLE
    ends = [np.array(colorsys.hsv_to_rgb(rng.random(), rng.uniform(0, 0.5), rng.uniform(0.2, 0.8))) for _ in range(2)]
    angle = rng.uniform(0, 2 * math.pi)
    y, x = np.mgrid[0:canvas, 0:canvas] / canvas - 0.5
    ramp = np.clip(x * math.cos(angle) + y * math.sin(angle) + 0.5, 0, 1)[..., None]
    image = Image.fromarray((255 * ((1 - ramp) * ends[0] + ramp * ends[1])).astype(np.uint8))
    draw = ImageDraw.Draw(image)

    def shape_at(shape: str, hue: float, radius: float, saturation: float):
        cx, cy = rng.uniform(radius * 0.6, canvas - radius * 0.6), rng.uniform(radius * 0.6, canvas - radius * 0.6)
        colour = tuple(int(v * 255) for v in colorsys.hsv_to_rgb(hue % 1.0, saturation, rng.uniform(0.55, 1.0)))
        draw_shape(draw, shape, cx, cy, radius, rng.uniform(0, 2 * math.pi), colour, rng)

    distractors = [(rng.choice(SHAPES), rng.random(), rng.uniform(0.10, 0.22) * canvas, rng.random() < 0.35)
                   for _ in range(rng.randint(1, 3))]
    for shape, hue, radius, on_top in distractors:
        if not on_top:
            shape_at(shape, hue, radius, rng.uniform(0.4, 1.0))
    shape, hue = hard_look(class_index, n_classes)
    shape_at(shape, hue + rng.uniform(-HARD_HUE_JITTER, HARD_HUE_JITTER), rng.uniform(0.2, 0.34) * canvas,
             rng.uniform(0.35, 1.0))
    for shape, hue, radius, on_top in distractors:
        if on_top:
            shape_at(shape, hue, radius, rng.uniform(0.4, 1.0))
    image = image.resize((size, size), Image.LANCZOS)
    pixels = np.asarray(image, dtype=np.float32)
    speckle = np.random.default_rng(rng.getrandbits(64)).normal(0, 48 * noise, pixels.shape)
    return Image.fromarray(np.clip(pixels + speckle, 0, 255).astype(np.uint8))


def write_split(root: Path, split: str, n_classes: int, per_class: int, args, progress) -> int:
    written = 0
    if per_class == 0:
        return 0  # no empty class folders: readers would take them for a broken data set
    for c in range(n_classes):
        folder = root / split / f"n{c:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            # One random stream per image: the file does not depend on the order of generation.
            rng = random.Random(f"{args.seed}/{split}/{c}/{i}")
            maker = make_hard_image if args.hard else make_image
            image = maker(c, n_classes, args.size, rng, args.noise)
            image.save(folder / f"n{c:08d}_{i}.JPEG", format="JPEG", quality=args.quality)
            written += 1
            progress()
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="Write a synthetic ImageNet-layout JPEG data set (train/ and val/ with one folder per class).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", default="data/generated/synthetic-imagenet", help="root folder to write")
    parser.add_argument("--classes", type=int, default=10, help="number of classes")
    parser.add_argument("--train-per-class", type=int, default=100, help="training images per class")
    parser.add_argument("--val-per-class", type=int, default=20, help="validation images per class")
    parser.add_argument("--size", type=int, default=None,
                        help="image width in pixels (height varies by ±30%%) [default: 64; --hard: 32, square]")
    parser.add_argument("--seed", type=int, default=0, help="same seed, same files")
    parser.add_argument("--noise", type=float, default=0.5, help="amount of pixel noise (0 = clean)")
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality")
    parser.add_argument("--hard", action="store_true",
                        help="a CIFAR-like set that takes real training: shared shapes, overlapping hues, "
                             "distractor shapes, stronger noise (square images)")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    args = parser.parse_args(argv)
    if args.classes < 2 or args.train_per_class < 1 or args.val_per_class < 0:
        parser.error("need --classes >= 2, --train-per-class >= 1 and --val-per-class >= 0")
    if args.size is None:
        args.size = 32 if args.hard else 64
    if args.size < 16:
        parser.error("--size must be at least 16 pixels")

    root = Path(args.out)
    total = args.classes * (args.train_per_class + args.val_per_class)
    done, started, last_print = 0, time.perf_counter(), 0.0

    def progress():
        nonlocal done, last_print
        done += 1
        now = time.perf_counter()
        if not args.quiet and (now - last_print > 1.0 or done == total):
            last_print = now
            print(f"\r{done}/{total} images ({done / (now - started):.0f}/s)", end="", flush=True)

    if not args.quiet:
        print(f"writing {total} JPEG images ({args.classes} classes, {args.size} px) to {root}", flush=True)
    write_split(root, "train", args.classes, args.train_per_class, args, progress)
    write_split(root, "val", args.classes, args.val_per_class, args, progress)
    lines = []
    for c in range(args.classes):
        shape, hue = (hard_look if args.hard else class_look)(c, args.classes)
        lines.append(f"n{c:08d}\t{shape}, hue {hue:.2f}")
    (root / "classes.txt").write_text("\n".join(lines) + "\n")
    if not args.quiet:
        print(f"\ndone in {time.perf_counter() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
