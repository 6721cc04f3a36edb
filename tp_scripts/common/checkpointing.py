"""Checkpoints for train_classifier.py: everything needed to continue a run with the same batches.

A checkpoint holds the model, optimizer, LR scheduler and gradient scaler states, where the run was
(epoch, batches done in that epoch, global step) and the random-number state (the crops and flips
of the next batches depend on it). It is written to a temporary file then renamed, so a job killed
while saving leaves the previous checkpoint intact.

A module shared by tp_scripts/train_classifier.py (yours) and tp_scripts/solutions/train_classifier.py:
not part of any TP.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch


class CheckpointError(ValueError):
    pass


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
        torch.save(state, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:
        tmp.unlink(missing_ok=True)
        raise OSError(getattr(err, "errno", None) or 28,
                      f"could not write the checkpoint {path} (the previous one is kept): {err}") from None


def resolve(path) -> Path:
    """A checkpoint file, or a run folder (or one of its rank folders) that holds checkpoint.pt."""
    path = Path(path)
    for candidate in (path, path / "checkpoint.pt", path.parent / "checkpoint.pt"):
        if candidate.is_file():
            return candidate
    raise CheckpointError(f"no checkpoint at {path} (looked for the file itself and {path}/checkpoint.pt)")


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
    state = torch.load(path, map_location=device, weights_only=False)
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
