"""Pipeline parallelism: consecutive blocks on consecutive ranks, activations sent rank to rank.

naive       : the whole batch goes through stage 0, then stage 1, ...; one stage works at a time.
gpipe       : the batch is cut into m micro-batches; all forwards, then all backwards.
1f1b        : after warming up, each stage alternates one forward and one backward, so at most
              p micro-batches' activations are alive (GPipe keeps m).
interleaved : each rank holds v non-consecutive stages (rank r: stages r, r+p, ...); the bubble
              shrinks by v at the price of v times more sends.
Idle fraction of the ideal time (the bubble): (p - 1) / m, or (p - 1) / (v m) interleaved.
"""
import copy
import time

import torch
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from model import loss_fn

SCHEDULES = {"naive": ScheduleGPipe, "gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
             "interleaved": ScheduleInterleaved1F1B}


def stage_ids(pp_rank, pp_size, virtual_stages):
    return [pp_rank + i * pp_size for i in range(virtual_stages)]


def split_model(model, stage, num_stages):
    """Keep this stage's blocks; the embedding lives on the first stage, norm and output on the last."""
    n_layers = model.config.n_layers
    per_stage = n_layers // num_stages
    keep = {str(i) for i in range(stage * per_stage, (stage + 1) * per_stage)}
    for name in list(model.layers):
        if name not in keep:
            del model.layers[name]
    if stage != 0:
        model.tok_embeddings = None
    if stage != num_stages - 1:
        model.norm, model.output = None, None
    return model


def build_pipeline(model, schedule_name, n_microbatches, pp_rank, pp_size, virtual_stages, device, group):
    """Returns (schedule, this rank's stage modules, stage ids)."""
    num_stages = pp_size * virtual_stages
    ids = stage_ids(pp_rank, pp_size, virtual_stages)
    modules = [split_model(copy.deepcopy(model), s, num_stages) for s in ids]
    stages = [PipelineStage(m, s, num_stages, device, group=group) for m, s in zip(modules, ids)]
    if schedule_name == "interleaved":
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=n_microbatches, loss_fn=loss_fn)
    else:
        schedule = SCHEDULES[schedule_name](stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn)
    return schedule, modules, ids


def pipeline_step(schedule, ids, num_stages, inputs, targets):
    """One forward+backward of the whole batch; returns the mean micro-batch loss (last stage) or None."""
    losses = []
    args = (inputs,) if 0 in ids else ()
    kwargs = {"target": targets, "losses": losses} if num_stages - 1 in ids else {}
    schedule.step(*args, **kwargs)
    return torch.stack(losses).mean().detach() if losses else None


def microbatch_compute_seconds(modules, ids, num_stages, inputs, targets, n_microbatches, repeats=3):
    """Forward+backward time of one micro-batch through this rank's stages, with no communication:
    the busy time from which the bubble is measured."""
    mb_inputs, mb_targets = inputs.chunk(n_microbatches)[0], targets.chunk(n_microbatches)[0]
    dim = modules[0].config.dim
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for module, stage in zip(modules, ids):
            x = mb_inputs if stage == 0 else torch.randn(*mb_inputs.shape, dim, device=mb_inputs.device,
                                                         requires_grad=True)
            out = module(x)
            loss = loss_fn(out, mb_targets) if stage == num_stages - 1 else out.float().pow(2).mean()
            loss.backward()
        best = min(best, time.perf_counter() - start)
    for module in modules:
        module.zero_grad(set_to_none=True)
    return best
