"""Checkpoints for train_classifier.py: everything needed to continue a run with the same batches.

A checkpoint holds the model, optimizer, LR scheduler and gradient scaler states, where the run was
(epoch, batches done in that epoch, global step) and the random-number state (the crops and flips
of the next batches depend on it). It is written to a temporary file then renamed, so a job killed
while saving leaves the previous checkpoint intact; a write that fails (a full disk) removes the temporary
file and raises CheckpointWriteError, whose one line names the file.

Everything in it is a tensor, a dict, a list, a number or a string, so --resume loads it with
torch.load(weights_only=True): a file that needs more is refused, never unpickled.

A module shared by tp_scripts/train_classifier.py (yours) and tp_scripts/solutions/train_classifier.py:
not part of any TP.
"""
from __future__ import annotations

import errno
import os
import pickle
import re
import time
from pathlib import Path

import torch


class CheckpointError(ValueError):
    pass


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a quota); str() is one line that names the file."""

    def __str__(self) -> str:
        return self.strerror


def save_checkpoint(path, *, model, optimizer, scheduler, scaler, epoch: int, batch_in_epoch: int, step: int,
                    world_size: int, batch_size: int, rng_states: list, epoch_totals: list | None = None) -> None:
    """rng_states: torch.get_rng_state() of every rank, in rank order (see gather_rng_states); epoch_totals: the
    epoch's sums so far over every rank (loss x images, hits, images), for its epoch line after a resume."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "epoch": epoch,
        "batch_in_epoch": batch_in_epoch,
        "step": step,
        "world_size": world_size,
        "batch_size": batch_size,
        "rng_states": rng_states,
        "epoch_totals": epoch_totals or [0.0, 0.0, 0.0],
    }
    tmp = path.with_name(path.name + ".tmp")
    try:  # written aside, then renamed: a full disk leaves the previous checkpoint whole
        # Our own handle, closed when the write fails: a file that torch.save opens itself stayed open after a
        # failed write, so removing it freed no space (the run record could not be finished), and its error
        # ('unexpected pos ...') did not say that the disk was full.
        with open(tmp, "wb") as file:
            torch.save(state, file)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:
        tmp.unlink(missing_ok=True)
        raise write_failed(path, err) from None


def write_failed(path: Path, err: BaseException) -> CheckpointWriteError:
    """The error of a failed checkpoint write, in one line. torch.save reports a full disk as a RuntimeError
    ('unexpected pos ...'): the OSError it hides is found among the errors it was raised from."""
    cause = err
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    code = getattr(cause, "errno", None) or errno.EIO
    why = getattr(cause, "strerror", None) or str(cause or err)
    kept = "the previous checkpoint is kept" if path.is_file() else "no earlier checkpoint"
    if code in (errno.ENOSPC, errno.EDQUOT):
        text = (f"the checkpoint did not fit on the disk at {path}: {why} ({kept}); free some space there, or "
                "give --checkpoint-path on a larger disk")
    else:
        text = f"the checkpoint could not be written at {path}: {why} ({kept})"
    return CheckpointWriteError(code, text)


def resolve(path) -> Path:
    """A checkpoint file, or a run folder (or one of its rank folders) that holds checkpoint.pt."""
    path = Path(path)
    for candidate in (path, path / "checkpoint.pt", path.parent / "checkpoint.pt"):
        if candidate.is_file():
            return candidate
    raise CheckpointError(f"no checkpoint at {path} (looked for the file itself and {path}/checkpoint.pt)")


def read_safely(path: Path, device) -> dict:
    """torch.load with weights_only=True: tensors, dicts, lists, numbers and strings only (what save_checkpoint
    writes, every optimiser and schedule included). Anything else is refused in one line, never unpickled."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as error:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
        what = f" ({found.group(1)})" if found else ""
        raise CheckpointError(f"{path} holds more than tensors, numbers and strings{what}: not a checkpoint of "
                              "train_classifier.py, and not unpickled (that could run code)") from None
    except (RuntimeError, OSError, EOFError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise CheckpointError(f"{path} cannot be read as a checkpoint (damaged, or cut short?): {first}") from None


def gather_rng_states(device) -> list:
    """Every rank's random state (CPU and its GPU), gathered on every rank: a collective, call it on all ranks."""
    import torch.distributed as dist

    mine = {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}
    if not (dist.is_available() and dist.is_initialized()):
        return [mine]
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, mine)
    return states


def load_checkpoint(path, *, model, optimizer, scheduler, scaler, device, rank: int, world_size: int,
                    batch_size: int) -> dict:
    """Restore every state in place; returns {'epoch', 'batch_in_epoch', 'step', 'epoch_totals', 'path'}."""
    path = resolve(path)
    state = read_safely(path, device)
    if (state["world_size"], state["batch_size"]) != (world_size, batch_size):
        raise CheckpointError(
            f"{path} was saved by {state['world_size']} processes with --batch-size {state['batch_size']}; "
            f"resume with the same ({world_size} processes, --batch-size {batch_size} now) so that the "
            "remaining batches of the epoch are the same")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if state["scaler"]:  # empty when saved without fp16 loss scaling
        scaler.load_state_dict(state["scaler"])
    rng = state["rng_states"][rank]
    torch.set_rng_state(rng["cpu"].cpu())
    if rng["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"].cpu(), device)
    return {"epoch": state["epoch"], "batch_in_epoch": state["batch_in_epoch"], "step": state["step"],
            "epoch_totals": state.get("epoch_totals") or [0.0, 0.0, 0.0], "path": str(path)}


# ---- in train_classifier.py's run: where it starts, and a checkpoint between two steps ----------------------------

def restore(t) -> dict:
    """Where training starts: step 0, or where the --resume checkpoint left off (weights, optimiser,
    schedule, scaler, random state, position in the epoch)."""
    torch.manual_seed(t.args.seed + 1 + t.rank)  # augmentations: a different random stream per rank
    if not t.args.resume:
        return {"epoch": 0, "batch_in_epoch": 0, "step": 0, "epoch_totals": [0.0, 0.0, 0.0]}
    return load_checkpoint(t.args.resume, model=t.raw_model, optimizer=t.optimizer, scheduler=t.scheduler,
                           scaler=t.scaler, device=t.device, rank=t.rank, world_size=t.world_size,
                           batch_size=t.args.batch_size)


def save(t, ins, epoch: int, batch_in_epoch: int, epoch_totals=None) -> None:
    """Every rank hands its random state to rank 0, which writes the file (with the epoch's sums so far)."""
    ins.pause()  # between two steps: the step lines so far are written, the next step's pace leaves this out
    ins.tick("a checkpoint (gathering the random states)")
    rng_states = gather_rng_states(t.device)
    if t.rank == 0:
        started = time.perf_counter()
        save_checkpoint(t.checkpoint_path, model=t.raw_model, optimizer=t.optimizer, scheduler=t.scheduler,
                        scaler=t.scaler, epoch=epoch, batch_in_epoch=batch_in_epoch, step=t.step,
                        world_size=t.world_size, batch_size=t.args.batch_size, rng_states=rng_states,
                        epoch_totals=epoch_totals)
        ins.event("checkpoint_saved", path=str(t.checkpoint_path), step=t.step, epoch=epoch,
                  batch_in_epoch=batch_in_epoch, seconds=time.perf_counter() - started)
