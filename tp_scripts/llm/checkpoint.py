"""Sharded checkpoints with torch.distributed.checkpoint (DCP): every rank writes its own shards,
in parallel, and can load them back under another world size (DCP reshards on load)."""
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def save_checkpoint(folder, model, optimizer, step):
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state, "step": step}, checkpoint_id=str(folder))


def load_checkpoint(folder, model, optimizer) -> int:
    """Loads in place and returns the step the checkpoint was taken at."""
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state, "step": 0}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return state["step"]
