"""Storage formats (Day 3): data/convert_formats.py, the readers (storage_formats.py, webdataset_stream.py),
train_classifier.py --data-format, and tp_scripts/read_bench.py.

A tiny generated JPEG folder (3 classes, 12 training and 3 validation images each, 40 px) converted once per
module into shards of 5 samples; scripts run as real subprocesses with one thread.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import preloaded
import pytest
import torch
from torch.utils.data import DataLoader

from dlokit import analysis, checks
from dlokit.in_job.runrecord import RunRecorder, read_rank

REPO = Path(__file__).resolve().parents[1]
CONVERT = REPO / "data" / "convert_formats.py"
TRAIN = REPO / "tp_scripts" / "solutions" / "train_classifier.py"
READ_BENCH = REPO / "tp_scripts" / "read_bench.py"
PYTHON = sys.executable
TRAIN_IMAGES, VAL_IMAGES, PER_SHARD = 36, 9, 5

sys.path.insert(0, str(REPO / "data"))
import convert_formats  # noqa: E402
import make_synthetic_imagenet  # noqa: E402
from tp_imports import common, load_script  # noqa: E402

fixed_size = common("storage_formats").fixed_size
ShardStream, shard_loaders, shard_pipeline, smallest_share = (
    getattr(common("webdataset_stream"), name) for name in ("ShardStream", "shard_loaders", "shard_pipeline", "smallest_share"))


@pytest.fixture(scope="module")
def jpeg(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data") / "jpeg"
    make_synthetic_imagenet.main(["--out", str(root), "--classes", "3", "--train-per-class", "12",
                                  "--val-per-class", "3", "--size", "40", "--quiet"])
    return root


@pytest.fixture(scope="module")
def converted(jpeg) -> Path:
    out = jpeg.parent / "formats"
    assert convert_formats.main(["--src", str(jpeg), "--out", str(out), "--image-size", "32",
                                 "--samples-per-shard", str(PER_SHARD), "--quiet"]) == 0
    return out


def run(*cmd, env=None, timeout=300) -> subprocess.CompletedProcess:
    return preloaded.run([PYTHON, *map(str, cmd)], env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                         cwd=REPO, timeout=timeout)


# ---- conversion and checksums ---------------------------------------------------------------------------------

def test_manifest_describes_both_splits(converted, jpeg):
    manifest = json.loads((converted / "manifest.json").read_text())
    assert manifest["source"] == str(jpeg.resolve()) and manifest["image_size"] == 32
    assert manifest["classes"] == ["n00000000", "n00000001", "n00000002"] and "aspect ratio not kept" in manifest["resize"]
    train, val = manifest["splits"]["train"], manifest["splits"]["val"]
    assert train["count"] == TRAIN_IMAGES and val["count"] == VAL_IMAGES
    assert [s["count"] for s in train["shards"]] == [5, 5, 5, 5, 5, 5, 5, 1]
    assert all((converted / s["file"]).stat().st_size == s["bytes"] for s in train["shards"] + val["shards"])
    assert np.load(converted / train["raw"]["images"], mmap_mode="r").shape == (TRAIN_IMAGES, 32, 32, 3)
    assert train["folder_bytes"] == sum(p.stat().st_size for p in (jpeg / "train").rglob("*.JPEG"))


def test_the_three_formats_hold_the_same_samples(converted):
    found = convert_formats.verify(converted)
    for split, count in (("train", TRAIN_IMAGES), ("val", VAL_IMAGES)):
        sums = found[split]
        assert sums["folder"] == sums["webdataset"] == sums["raw"] == sums["manifest"]
        assert sums["raw"]["samples"] == count and sums["raw"]["pixel_sum"] > 0
    assert convert_formats.main(["--verify", str(converted), "--quiet"]) == 0


def test_a_changed_pixel_changes_the_checksum(converted, tmp_path, capsys):
    """The check can fail: one pixel of one raw image off by one, and raw no longer matches."""
    copy = tmp_path / "formats"
    shutil.copytree(converted, copy)
    images = np.load(copy / "raw" / "train_images.npy", mmap_mode="r+")
    images[7, 3, 4, 0] ^= 1
    images.flush()
    del images
    sums = convert_formats.verify(copy)["train"]
    assert sums["folder"] == sums["webdataset"] == sums["manifest"] != sums["raw"]
    assert convert_formats.main(["--verify", str(copy)]) == 1 and "DIFFERENT" in capsys.readouterr().out


def test_conversion_refuses_bad_input_in_one_line(jpeg, converted, tmp_path, capsys):
    assert convert_formats.main(["--src", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert "has no train/ folder" in capsys.readouterr().err
    assert convert_formats.main(["--src", str(jpeg), "--out", str(converted), "--quiet"]) == 2  # not empty, no --force
    assert "not empty: pass --force" in capsys.readouterr().err
    assert convert_formats.main(["--verify", str(jpeg), "--quiet"]) == 2  # a JPEG folder has no manifest
    assert "holds no manifest.json" in capsys.readouterr().err
    done = run(CONVERT, "--src", jpeg, "--out", converted)
    assert done.returncode == 2 and "--force" in done.stderr and "Traceback" not in done.stderr
    again = tmp_path / "again"
    (again / "webdataset").mkdir(parents=True)
    (again / "webdataset" / "stale-000099.tar").write_bytes(b"old")
    (again / "notes.txt").write_text("mine")
    assert convert_formats.main(["--src", str(jpeg), "--out", str(again), "--samples-per-shard", "100", "--force",
                                 "--quiet"]) == 0
    assert not (again / "webdataset" / "stale-000099.tar").exists() and (again / "notes.txt").read_text() == "mine"
    assert [s["count"] for s in json.loads((again / "manifest.json").read_text())["splits"]["train"]["shards"]] == [36]


# ---- webdataset: shards split by rank, then by worker ----------------------------------------------------------

def sample_ids(pixels: torch.Tensor) -> list[str]:
    return [hashlib.sha1(image.numpy().tobytes()).hexdigest() for image in pixels]


def read_all(converted: Path, *, rank: int, world_size: int, workers: int, seed, epoch: int = 0) -> list[str]:
    manifest = json.loads((converted / "manifest.json").read_text())
    urls = [str(converted / s["file"]) for s in manifest["splits"]["train"]["shards"]]
    pipeline = shard_pipeline(urls, lambda image: fixed_size(image, 32), rank=rank, world_size=world_size,
                              seed=seed, batch_size=4)
    pipeline.shards.epoch = epoch
    return [i for pixels, _ in DataLoader(pipeline, batch_size=None, num_workers=workers) for i in sample_ids(pixels)]


@pytest.mark.parametrize("seed", [None, 3])
def test_every_sample_is_read_once_across_ranks_and_workers(converted, seed):
    everything = read_all(converted, rank=0, world_size=1, workers=0, seed=None)
    assert len(set(everything)) == TRAIN_IMAGES
    shares = [read_all(converted, rank=r, world_size=2, workers=2, seed=seed) for r in (0, 1)]
    assert sorted(shares[0] + shares[1]) == sorted(everything)  # nothing twice, nothing missing
    assert shares[0] and shares[1] and not set(shares[0]) & set(shares[1])


def test_shard_order_follows_seed_and_epoch_the_same_on_every_rank(converted):
    first = [read_all(converted, rank=r, world_size=2, workers=0, seed=3, epoch=0) for r in (0, 1)]
    second = [read_all(converted, rank=r, world_size=2, workers=0, seed=3, epoch=1) for r in (0, 1)]
    assert sorted(first[0] + first[1]) == sorted(second[0] + second[1])  # each epoch: all samples once
    assert set(first[0]) != set(second[0])  # a new split of the shards between the ranks


def test_training_stream_gives_every_rank_the_same_number_of_full_batches(converted):
    val_transform = common("image_data").val_transform

    streams = [shard_loaders(converted, val_transform(32), val_transform(32), batch_size=4, rank=r, world_size=2,
                             seed=0, loader_options={"num_workers": 2}, validation=True) for r in (0, 1)]
    # 8 shards (7 x 5 + 1): a rank gets 4, at least 5 + 5 + 5 + 1 samples: 4 full batches of 4
    assert smallest_share([5] * 7 + [1], 2) == 16
    for stream, split, val_loader, classes, count in streams:
        assert isinstance(stream, ShardStream) and len(stream) == 4 and len(split) == 16 and count == TRAIN_IMAGES
        stream.set_epoch(1)
        batches = list(stream)
        assert [len(labels) for _, labels in batches] == [4] * 4 and batches[0][0].shape == (4, 3, 32, 32)
        assert stream.num_workers == 2  # the DataLoader's settings, for the record's `observed`
    validated = sum(len(labels) for s in streams for _, labels in s[2])
    assert validated == VAL_IMAGES  # validation: every sample once over the ranks, partial batches kept


# ---- the training script reads each format -----------------------------------------------------------------

@pytest.mark.parametrize("data_format", ["folder", "raw", "webdataset"])
def test_train_classifier_trains_from_each_format(converted, jpeg, tmp_path, data_format):
    data = jpeg if data_format == "folder" else converted
    done = run(TRAIN, "--runs-dir", tmp_path, "--data", data, "--data-format", data_format, "--model", "resnet18",
               "--image-size", "32", "--batch-size", "4", "--epochs", "1", "--num-workers", "1",
               "--print-every", "1000", env={"DLOKIT_RUN_ID": data_format})
    assert done.returncode == 0, done.stderr[-3000:]
    rec = read_rank(tmp_path / data_format / "rank0")
    steps = [m for m in rec["metrics"] if m["kind"] == "step"]
    assert rec["state"] == "completed" and rec["run"]["config"]["data_format"] == data_format
    assert len(steps) == 9 and all(s["batch_size"] == 4 for s in steps)  # one process: every shard, 36 images
    assert [m["kind"] for m in rec["metrics"]].count("val") == 1 and rec["summary"]["val_acc"] is not None
    observed = rec["run"]["observed"]
    assert observed["sampler"] == ("RankShards" if data_format == "webdataset" else "DistributedSampler")
    assert observed["loader_num_workers"] == 1


def test_train_classifier_refuses_a_format_its_data_lacks(jpeg, converted, tmp_path, capsys):
    parse_args = common("train_options").parse_args

    for args, message in ((["--data", str(converted), "--data-format", "parquet"], "invalid choice"),
                          (["--data", "synthetic", "--data-format", "webdataset"], "--data synthetic has none"),
                          (["--data", str(converted), "--data-format", "webdataset"], "8 training shard(s) for 9")):
        with pytest.raises(SystemExit) as stopped:
            parse_args(["--model", "resnet18", "--image-size", "32", *args], world_size=9)
        assert stopped.value.code == 2 and message in capsys.readouterr().err
    done = run(TRAIN, "--runs-dir", tmp_path, "--model", "resnet18", "--image-size", "32", "--data", jpeg,
               "--data-format", "raw")
    assert done.returncode == 2 and "holds no manifest.json" in done.stderr and "Traceback" not in done.stderr
    assert not list(tmp_path.iterdir())


# ---- the read bench ---------------------------------------------------------------------------------------

def test_read_bench_records_images_per_second_per_format_and_workers(converted, tmp_path, monkeypatch):
    """Enough batches to read the whole split: every format and worker count reads the same pixels."""
    done = run(READ_BENCH, "--data", converted, "--workers", "0,2", "--batch-size", 4, "--batches", 50,
               "--repeats", 2, "--runs-dir", tmp_path, env={"DLOKIT_RUN_ID": "read"})
    assert done.returncode == 0, done.stderr[-3000:]
    rec = read_rank(tmp_path / "read" / "rank0")
    lines = [m for m in rec["metrics"] if m["kind"] == "read_result"]
    each = [("folder", 0), ("folder", 2), ("webdataset", 0), ("webdataset", 2), ("raw", 0), ("raw", 2)]
    assert [(m["format"], m["num_workers"], m["repeat"]) for m in lines] == [(*c, r) for r in (0, 1) for c in each]
    pixels = json.loads((converted / "manifest.json").read_text())["splits"]["train"]["checksum"]["pixel_sum"]
    for line in lines:
        assert line["images"] == TRAIN_IMAGES and line["pixel_sum"] == pixels, line
        assert line["images_per_s"] > 0 and line["mb_per_s"] > 0 and line["t_first_batch"] > 0
        assert line["cache"] == "cold"
    stored = rec["run"]["config"]["stored_bytes"]
    by_format = {m["format"]: m["bytes_read"] for m in lines if m["num_workers"] == 0}
    assert by_format["raw"] == TRAIN_IMAGES * (32 * 32 * 3 + 8)
    assert by_format["folder"] == stored["folder"] and by_format["webdataset"] == pytest.approx(stored["webdataset"])
    assert rec["summary"]["results"] == [{k: v for k, v in m.items() if k not in ("kind", "time")} for m in lines]
    # the view: one row per format and worker count, its speed over the two reads with an interval around it
    table = analysis.read_table("read", tmp_path)
    assert [(r.format, r.num_workers) for r in table.itertuples()] == each
    assert (table["repeats"] == 2).all() and (table["low"] <= table["images_per_s"]).all()
    assert (table["images_per_s"] <= table["high"]).all() and (table["first_batch_ms"] > 0).all()
    monkeypatch.setenv("DLOKIT_RUNS_DIR", str(tmp_path))
    result = checks.storage("read")
    assert result.status == "passed" and " over 2 reads" in result.details[0]
    assert re.search(r"samples; (fastest here|no single fastest here|fastest of one measurement each): ", result.message)


def write_reads(runs_dir, run_id, speeds: dict):
    """A read_bench record: {(format, workers): [images/s of each read]}, the reads interleaved as the script does."""
    with RunRecorder({"batch_size": 16}, run_id=run_id, runs_dir=runs_dir, script="read_bench.py") as recorder:
        for repeat in range(max(len(v) for v in speeds.values())):
            for (data_format, workers), values in speeds.items():
                recorder.log("read_result", format=data_format, num_workers=workers, repeat=repeat, cache="cold",
                             images=400, images_per_s=values[repeat], mb_per_s=1.0, t_first_batch=0.01, pixel_sum=7)


def test_the_fastest_format_is_named_with_its_lead_or_said_to_be_within_noise(tmp_path):
    write_reads(tmp_path, "clear", {("folder", 0): [1000, 1050, 980], ("raw", 0): [9000, 9400, 8800]})
    said = analysis.fastest_read("clear", tmp_path)
    assert said.startswith("fastest here: raw with 0 workers (9063 img/s [8339–9851]), ×8.98 [")
    assert "the next, folder with 0 workers" in said
    # the GPU read raw at 44,297 then 10,379 img/s in two calls: reads that far apart name no winner
    write_reads(tmp_path, "noisy", {("raw", 0): [44297, 10379, 30000], ("folder", 0): [12000, 11000, 13000]})
    noisy = analysis.fastest_read("noisy", tmp_path)  # no "fastest here" that its own interval denies
    assert noisy.startswith("no single fastest here: raw with 0 workers") and "within noise of folder" in noisy
    write_reads(tmp_path, "once", {("raw", 0): [5000], ("folder", 0): [1000]})
    assert analysis.read_table("once", tmp_path)["low"].isna().all()
    assert analysis.fastest_read("once", tmp_path).startswith("fastest of one measurement each: raw with 0 workers")


@pytest.mark.parametrize("args, message", [
    (["--formats", "hdf5"], "--formats"),
    (["--workers", "two"], "--workers"),
    (["--batches", "0"], "--batches"),
    (["--repeats", "0"], "--repeats"),
])
def test_read_bench_refuses_bad_options(converted, args, message, capsys):
    read_bench = load_script(READ_BENCH)

    with pytest.raises(SystemExit) as stopped:
        read_bench.parse_args(["--data", str(converted), *args])
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_read_bench_refuses_a_folder_that_was_not_converted(jpeg, tmp_path):
    done = run(READ_BENCH, "--data", jpeg, "--runs-dir", tmp_path)
    assert done.returncode == 2 and "convert_formats.py" in done.stderr and "Traceback" not in done.stderr
    assert not list(tmp_path.iterdir())
