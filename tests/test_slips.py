"""Issue 48, item 3: every slip named where it happens, in one line that says what to change.

A notebook's sizes and nickname are refused by setup_day; a training run says when it skips validation, names
the image it cannot decode, and refuses a checkpoint that holds more than tensors, numbers and strings. (A
checkpoint that does not fit on the disk: tests/test_disk_full.py.)
"""
from __future__ import annotations

import os
import pathlib
import shutil
import sys
from pathlib import Path

import pytest
from ranks import run_warm

import dlokit
from dlokit.in_job.runrecord import read_rank

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = REPO / "tp_scripts" / "solutions"

sys.path.insert(0, str(REPO / "data"))
import make_synthetic_imagenet  # noqa: E402
from tp_imports import common  # noqa: E402


# ---- the parameters cell: setup_day ---------------------------------------------------------------------------

def setup(workspace, nickname="ann", **sizes):
    return dlokit.setup_day(nickname, "local", str(SOLUTIONS), data="synthetic", verbose=False, **sizes)


@pytest.mark.parametrize("name, value", [("batch_size", 0), ("batch_size", -8), ("batch_size", 2.5),
                                         ("steps", 0), ("image_size", 0), ("train_per_class", 0)])
def test_a_size_that_is_not_above_zero_is_refused_by_setup_day(workspace, name, value):
    label = {"batch_size": "BATCH_SIZE", "steps": "STEPS", "image_size": "IMAGE_SIZE",
             "train_per_class": "TRAIN_PER_CLASS"}[name]
    with pytest.raises(ValueError) as raised:
        setup(workspace, **{name: value})
    assert str(raised.value) == f"{label} = {value!r}: give a whole number above 0"


def test_batch_size_none_still_means_the_default(workspace):
    assert setup(workspace, batch_size=None).batch_size == 16


@pytest.mark.parametrize("option", ["batch_size", "steps", "epochs"])
def test_a_command_with_a_size_of_zero_is_refused(workspace, option):
    day = setup(workspace)
    with pytest.raises(ValueError, match=rf"^day.command\({option}=...\) = 0: give a whole number above 0$"):
        day.command(**{option: 0})
    assert "--batch-size 8" in day.command(batch_size=8) and "--epochs 2" in day.command(epochs=2)


def test_llm_day_sizes_are_checked_too(workspace):
    with pytest.raises(ValueError, match=r"^BATCH = 0: give a whole number above 0$"):
        dlokit.setup_llm_day("ann", "local", str(SOLUTIONS), batch_size=0, verbose=False)


@pytest.mark.parametrize("nickname", ["a b", "x;touch y", "", "../up", "-dash"])
def test_a_nickname_that_cannot_be_a_job_name_is_refused_by_setup_day(workspace, nickname):
    with pytest.raises(ValueError) as raised:
        setup(workspace, nickname=nickname)
    assert str(raised.value) == (f"NICKNAME {nickname!r}: use 1-64 letters, digits, '.', '_' or '-' starting with "
                                 "a letter or digit (it becomes a file name and a squeue filter), e.g. 'alice'")


# ---- the training script ---------------------------------------------------------------------------------------

def make_dataset(root: Path, train: int = 6, val: int = 2) -> Path:
    make_synthetic_imagenet.main(["--out", str(root), "--classes", "2", "--train-per-class", str(train),
                                  "--val-per-class", str(val), "--size", "36", "--quiet"])
    return root


def train(runs: Path, run_id: str, *args, ranks: int = 1):
    """The reference script, started warm, on `ranks` processes; one thread each (the CI machines have two cores)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DLOKIT_RUN_ID": run_id, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, str(SOLUTIONS / "train_classifier.py"), "--runs-dir", str(runs), "--model", "resnet18",
               "--image-size", "32", "--batch-size", "4", "--print-every", "1000", *map(str, args)]
    return run_warm(command, env, 240, ranks=ranks, cwd=REPO)


def cut_short(data: Path) -> Path:
    """One training JPEG of `data`, cut short in its compressed data: a real truncated file."""
    damaged = sorted((data / "train").rglob("*.JPEG"))[3]
    damaged.write_bytes(damaged.read_bytes()[:400])
    return damaged


def test_a_folder_without_val_says_that_validation_is_skipped(tmp_path):
    data = make_dataset(tmp_path / "data")
    shutil.rmtree(data / "val")
    done = train(tmp_path / "runs", "noval", "--data", data, "--epochs", 1)
    assert done.returncode == 0, done.stderr[-3000:]
    note = f"no val/ folder under {data}: validation skipped"
    assert note in done.stdout.splitlines()
    record = read_rank(tmp_path / "runs" / "noval" / "rank0")
    assert record["summary"]["notes"] == [note] and record["summary"]["val_acc"] is None
    assert {"kind": "event", "event": "note", "note": note}.items() <= record["metrics"][0].items()


def test_a_folder_with_val_has_no_note(tmp_path):
    done = train(tmp_path / "runs", "val", "--data", make_dataset(tmp_path / "data"), "--epochs", 1)
    assert done.returncode == 0 and "validation skipped" not in done.stdout, done.stderr[-3000:]
    assert read_rank(tmp_path / "runs" / "val" / "rank0")["summary"]["notes"] == []


@pytest.mark.parametrize("workers", [0, 1])
def test_a_truncated_jpeg_stops_the_run_naming_the_file(tmp_path, workers):
    """The chosen behaviour: the run fails (exit 1) and its one line names the file; nothing is skipped."""
    data = make_dataset(tmp_path / "data")
    damaged = cut_short(data)
    done = train(tmp_path / "runs", "cut", "--data", data, "--epochs", 1, "--num-workers", workers)
    assert done.returncode == 1, done.stderr[-3000:]
    line = f"train_classifier.py: rank 0: error: {damaged} cannot be decoded ("
    assert done.stderr.startswith(line) and len(done.stderr.splitlines()) == 1, done.stderr[-3000:]
    assert done.stderr.rstrip().endswith("the image is damaged or cut short; replace or remove the file")
    summary = read_rank(tmp_path / "runs" / "cut" / "rank0")["summary"]
    assert summary["status"] == "failed" and summary["error"] == done.stderr.split(": error: ", 1)[1].rstrip()


def test_a_truncated_jpeg_on_one_rank_stops_the_other_with_its_cause(tmp_path):
    data = make_dataset(tmp_path / "data")
    damaged = cut_short(data)
    done = train(tmp_path / "runs", "cut2", "--data", data, "--epochs", 1, ranks=2)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    summaries = [read_rank(tmp_path / "runs" / "cut2" / f"rank{r}")["summary"] for r in (0, 1)]
    [failed] = [s for s in summaries if "stopped_by_rank" not in s]
    [stopped] = [s for s in summaries if "stopped_by_rank" in s]
    assert failed["status"] == stopped["status"] == "failed" and failed["error"].startswith(f"{damaged} cannot be")
    assert stopped["error"].startswith(f"rank {failed['rank']} failed: {damaged} cannot be decoded (")


def test_a_checkpoint_that_needs_more_than_weights_is_refused_and_never_unpickled(tmp_path):
    """--resume loads with torch.load(weights_only=True): an object that would run code when unpickled is not."""
    import torch

    checkpointing = common("checkpointing")
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    parts = dict(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler)
    path = tmp_path / "checkpoint.pt"
    checkpointing.save_checkpoint(path, **parts, epoch=0, batch_in_epoch=1, step=1, world_size=1, batch_size=8,
                                  rng_states=checkpointing.gather_rng_states(torch.device("cpu")))
    where = dict(device=torch.device("cpu"), rank=0, world_size=1, batch_size=8)
    assert checkpointing.load_checkpoint(path, **parts, **where)["step"] == 1  # what the kit saves loads safely

    marker = tmp_path / "code-ran"

    class Sneaky:
        def __reduce__(self):
            return pathlib.Path.touch, (marker,)

    torch.save({**torch.load(path, weights_only=True), "extra": Sneaky()}, path)
    with pytest.raises(checkpointing.CheckpointError) as raised:
        checkpointing.load_checkpoint(path, **parts, **where)
    message = str(raised.value)
    assert message.startswith(f"{path} holds more than tensors, numbers and strings (") and "\n" not in message
    assert message.endswith("): not a checkpoint of train_classifier.py, and not unpickled (that could run code)")
    assert not marker.exists()
