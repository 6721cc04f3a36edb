"""Results tracking beside the run record: TensorBoard event files (--tensorboard) and Weights & Biases in
offline mode (--wandb), written by rank 0 only.

    trackers = start_tracking(args, ins.record, rank, config)   # after the run record is open
    ...                                                          # every record line is mirrored
    stop_tracking(trackers)

The trackers are fed the run record's own lines as they are written (step: loss, acc, lr, img/s; epoch;
val; lr_trial), so TensorBoard and W&B show the numbers the notebook's tables show.

No key is ever an option of this script. An offline W&B run needs none; `wandb sync <folder>` uploads it
later and reads $WANDB_API_KEY (or `wandb login`) by itself. Nothing here reads, prints or records a key.

A module shared by tp_scripts/train_classifier.py (yours) and tp_scripts/solutions/train_classifier.py:
it is not part of any TP, you do not need to edit it.
"""
from __future__ import annotations

import os
from pathlib import Path

# record line kind -> {record field: tracker tag}
TAGS = {
    "step": {"loss": "train/loss", "acc": "train/acc", "lr": "train/lr", "throughput_train": "train/img_per_s"},
    "epoch": {"train_loss": "epoch/train_loss", "train_acc": "epoch/train_acc", "throughput_train": "epoch/img_per_s"},
    "val": {"val_loss": "val/loss", "val_acc": "val/acc", "val_acc5": "val/acc5"},
    "lr_trial": {"lr": "lr_finder/lr", "first_loss": "lr_finder/first_loss",
                 "smoothed_loss": "lr_finder/smoothed_loss"},
}


class TensorBoard:
    def __init__(self, folder: Path, run_id: str, config: dict):
        from torch.utils.tensorboard import SummaryWriter

        self.folder = folder
        self.writer = SummaryWriter(str(folder), flush_secs=5)

    def log(self, step: int, values: dict) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self.writer.close()


class WandB:
    def __init__(self, folder: Path, run_id: str, config: dict):
        import wandb

        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.run = wandb.init(mode="offline", dir=str(folder), name=run_id, config=config,
                              project=os.environ.get("WANDB_PROJECT", "dlokit"))

    def log(self, step: int, values: dict) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


def start_tracking(args, record, rank: int, config: dict) -> list:
    """The trackers the options ask for (none on ranks other than 0), fed every line `record` writes from now on;
    run.json gets a `tracking` field naming their folders."""
    wanted = [(kind, name) for kind, name, on in ((TensorBoard, "tensorboard", args.tensorboard),
                                                  (WandB, "wandb", args.wandb)) if on]
    if rank != 0 or not wanted:
        return []
    run_folder = record.folder.parent
    trackers = [kind(run_folder / name, record.run_id, config) for kind, name in wanted]
    mirror(record, trackers)
    record.amend(tracking={name: str(tracker.folder) for (_, name), tracker in zip(wanted, trackers)})
    return trackers


def mirror(record, trackers: list) -> None:
    """Wrap record.log so that each line it writes also goes to the trackers (x axis: the optimizer step;
    the trial number for the LR range test)."""
    write = record.log
    last_step = 0

    def log_and_track(kind: str, **fields) -> None:
        nonlocal last_step
        write(kind, **fields)
        last_step = fields.get("step", last_step)
        values = {tag: fields[key] for key, tag in TAGS.get(kind, {}).items()
                  if isinstance(fields.get(key), (int, float))}
        if values:
            for tracker in trackers:
                tracker.log(fields["trial"] if kind == "lr_trial" else last_step, values)

    record.log = log_and_track


def stop_tracking(trackers: list) -> None:
    for tracker in trackers:
        tracker.close()
