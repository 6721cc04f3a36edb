"""Sharded checkpoints with torch.distributed.checkpoint (DCP): every rank writes its own shards,
in parallel, and the checkpoint can be loaded back under another layout or world size (DCP reshards
on load: an FSDP checkpoint resumes in one process, a single-process one under DDP, ...).

DCP must know where each tensor sits in the full one. A DTensor says so itself (FSDP, TP, 2-D). A
plain tensor is taken as a whole copy: two ranks saving the same name are replicas and only one is
kept. So the from-scratch tensor-parallel weights, plain tensors holding 1/tp of a weight each, are
wrapped as DTensor shards of the full weight (`tp_shard_dim` says along which dimension) before
saving and loading, with their optimizer states; otherwise the checkpoint would hold half of every
split weight. Pipeline stages save disjoint names, under the full model's names (the optimizer state
is flattened per parameter name, so no rank's entries overwrite another's).
"""
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor, Shard

OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _split_params(model):
    return {name: p for name, p in model.named_parameters() if getattr(p, "tp_shard_dim", None) is not None}


def _place_splits(model, model_state, optim_state, split_mesh):
    """Plain tensor-parallel shards -> DTensor shards of the full tensors (same storage)."""
    if split_mesh is None:
        return
    for name, param in _split_params(model).items():
        placement = [Shard(param.tp_shard_dim)]
        wrap = lambda t: DTensor.from_local(t, split_mesh, placement, run_check=False)
        model_state[name] = wrap(model_state[name])
        for key, value in optim_state.items():  # exp_avg, exp_avg_sq: shaped like the weight
            if key.startswith(f"state.{name}.") and getattr(value, "shape", None) == param.shape:
                optim_state[key] = wrap(value)


def save_checkpoint(folder, model, optimizer, step, split_mesh=None):
    model_state, optim_state = get_state_dict(model, optimizer, options=OPTIONS)
    _place_splits(model, model_state, optim_state, split_mesh)
    dcp.save({"model": model_state, "optim": optim_state, "step": step}, checkpoint_id=str(folder))


def load_checkpoint(folder, model, optimizer, split_mesh=None) -> int:
    """Loads in place and returns the step the checkpoint was taken at."""
    model_state, optim_state = get_state_dict(model, optimizer, options=OPTIONS)
    wrapped = dict(model_state), dict(optim_state)
    _place_splits(model, *wrapped, split_mesh)
    state = {"model": wrapped[0], "optim": wrapped[1], "step": 0}
    dcp.load(state, checkpoint_id=str(folder))
    # back to the plain local tensors the model and the optimizer hold
    for loaded, original in zip((state["model"], state["optim"]), (model_state, optim_state)):
        for key, value in loaded.items():
            plain = isinstance(value, DTensor) and not isinstance(original[key], DTensor)
            original[key] = value.to_local() if plain else value
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state, options=OPTIONS)
    return state["step"]
