"""Issue 48, item 3: every slip named where it happens, in one line that says what to change.

A notebook's sizes and nickname are refused by setup_day; a training run says when it skips validation, names
the image it cannot decode, and refuses a checkpoint that holds more than tensors, numbers and strings. (A
checkpoint that does not fit on the disk: tests/test_disk_full.py.)
"""
from __future__ import annotations

import os
import pathlib
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
