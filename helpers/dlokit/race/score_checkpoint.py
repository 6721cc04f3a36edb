"""Score a race run's final weights on the instructor's test split: the job `verify-race` submits per entry.

    python score_checkpoint.py --checkpoint RUNS/<id>/checkpoint.pt --test /instructors/test --model resnet18 \
        --image-size 64 [--cifar-stem]

The test split is a folder of class folders (ImageFolder) that no student job reads. The model is built by the
training script's own shared functions (common.image_models, common.evaluation), the weights loaded from the checkpoint, and the top-1 written to a
run record ("val" line and summary `test_acc`, `test_images`) for dlokit.race.verify to read back.

The checkpoint is the student's file and this job runs as the instructor: it is read only if it is a regular file
of at most MAX_CHECKPOINT_GB, with `weights_only=True` (tensors, numbers, strings and containers of them: nothing
in it can run code). A checkpoint that needs more is refused, named, and never unpickled.
"""
from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets

from common.checkpointing import resolve
from common.evaluation import evaluate
from common.image_data import val_transform
from common.image_models import create_model, small_image_stem

from dlokit.in_job import untrusted
from dlokit.in_job.jobenv import EXIT_REFUSED
from dlokit.in_job.runrecord import RunRecorder


MAX_CHECKPOINT_GB = 4
HOLDS_MORE = "holds more than weights (an object that could run code)"


class RefusedCheckpoint(ValueError):
    """A checkpoint this scorer will not load; the message names the file and why."""


def load_weights(path: Path) -> dict:
    """The model's state dict from a student's checkpoint, read as data only (see the module's docstring)."""
    try:
        with untrusted.open_regular(path, MAX_CHECKPOINT_GB * 1024 ** 3) as handle:  # the run folder's owner's
            state = torch.load(handle, map_location="cpu", weights_only=True)
    except untrusted.Refused as error:
        raise RefusedCheckpoint(str(error)) from None
    except FileNotFoundError:
        raise RefusedCheckpoint(f"{path}: no such file") from None
    except pickle.UnpicklingError as error:  # what weights_only refuses: an object that would run code
        said = [line.strip() for line in str(error).splitlines() if "Unsupported global" in line]
        raise RefusedCheckpoint(f"{path}: {HOLDS_MORE}, refused unloaded" + (f": {said[0][:200]}" if said else "")) \
            from None
    except (RuntimeError, EOFError, ValueError) as error:
        raise RefusedCheckpoint(f"{path}: not a readable checkpoint ({type(error).__name__}: "
                                f"{str(error)[:200]})") from None
    weights = state.get("model") if isinstance(state, dict) else None
    if not isinstance(weights, dict):
        raise RefusedCheckpoint(f"{path}: has no 'model' state dict")
    return weights


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a checkpoint.pt, or the run folder holding it")
    parser.add_argument("--test", required=True, help="the test split: one folder per class")
    parser.add_argument("--model", required=True)
    parser.add_argument("--image-size", type=int, required=True)
    parser.add_argument("--cifar-stem", action="store_true", help="the run trained with --cifar-stem")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    test_set = datasets.ImageFolder(args.test, transform=val_transform(args.image_size))
    model = create_model(args.model, len(test_set.classes))
    if args.cifar_stem:
        model = small_image_stem(model)
    try:
        model.load_state_dict(load_weights(resolve(args.checkpoint)))
    except (RefusedCheckpoint, RuntimeError) as error:  # RuntimeError: weights that do not fit the model
        print(f"checkpoint refused: {error}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with RunRecorder({**vars(args), "test_images": len(test_set)}, script=Path(__file__).name) as record:
        loader = DataLoader(test_set, batch_size=args.batch_size)
        scores = evaluate(model.to(device), loader, nn.CrossEntropyLoss(), None, False)
        record.log("val", epoch=0, step=0, **scores)
        record.finish(test_acc=scores["val_acc"], test_images=len(test_set))
    print(f"test top-1 {scores['val_acc']:.4f} over {len(test_set)} images")
    return 0


if __name__ == "__main__":
    sys.exit(main())
