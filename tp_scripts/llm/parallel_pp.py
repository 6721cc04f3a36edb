"""Pipeline parallelism: consecutive blocks on consecutive ranks, activations sent rank to rank.

naive       : the whole batch goes through stage 0, then stage 1, ...; one stage works at a time.
gpipe       : the batch is cut into m micro-batches; all forwards, then all backwards.
1f1b        : after warming up, each stage alternates one forward and one backward, so at most
              p micro-batches' activations are alive on the first stage (GPipe keeps m).
interleaved : each rank holds v non-consecutive stages (rank r: stages r, r+p, ...); the bubble
              shrinks by v at the price of v times more sends.

The bubble, as the idle fraction of a step: (p - 1) / (m + p - 1), or (p - 1) / (v m + p - 1)
interleaved (idle over ideal time, the other usual form, is (p - 1) / m).

What a step really did is measured inside the step, on the run's own micro-batches, dtype and clock:
every forward/backward chunk a stage computes is timed (SectionTimer: CUDA events on a GPU) and
logged in order, which gives this rank's busy time and the number of micro-batches whose
activations were alive at once (the activation memory a schedule costs).
"""
import copy

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from model import loss_fn
from timing import SectionTimer

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


def merged_view(modules):
    """One module holding this rank's stages with the full model's parameter names (layers keep
    their index): what the checkpoint saves, so that any other layout can load it."""
    if len(modules) == 1:
        return modules[0]
    view = nn.Module()
    view.layers = nn.ModuleDict({name: block for m in modules for name, block in m.layers.items()})
    for name in ("tok_embeddings", "norm", "output"):
        owner = next((m for m in modules if getattr(m, name) is not None), None)
        if owner is not None:
            setattr(view, name, getattr(owner, name))
    return view


class Pipeline:
    """This rank's stages and schedule, instrumented: `step()` runs one batch, `take_stats()` says
    how long this rank computed and how many micro-batches were in flight at most."""

    def __init__(self, model, schedule_name, n_microbatches, pp_rank, pp_size, virtual_stages, device, group):
        self.group, self.device = group, device
        self.num_stages = pp_size * virtual_stages
        self.pp_size, self.virtual, self.microbatches = pp_size, virtual_stages, n_microbatches
        self.ids = stage_ids(pp_rank, pp_size, virtual_stages)
        self.modules = [split_model(copy.deepcopy(model), s, self.num_stages) for s in self.ids]
        stages = [PipelineStage(m, s, self.num_stages, device, group=group) for m, s in zip(self.modules, self.ids)]
        if schedule_name == "interleaved":
            self.schedule = ScheduleInterleaved1F1B(stages, n_microbatches=n_microbatches, loss_fn=loss_fn)
        else:
            self.schedule = SCHEDULES[schedule_name](stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn)
        self.busy = SectionTimer(device)
        self.actions = []  # this step's ("F" | "B" | "W", stage, micro-batch), in the order they ran
        for stage in stages:
            self._instrument(stage)
        compute_loss = self.schedule._compute_loss  # the last stage's loss is compute too

        def timed_loss(*args, **kwargs):
            with self.busy.section():
                return compute_loss(*args, **kwargs)
        self.schedule._compute_loss = timed_loss

    def _instrument(self, stage):
        for kind, name in (("F", "forward_one_chunk"), ("B", "backward_one_chunk"),
                           ("W", "backward_weight_one_chunk")):
            original = getattr(stage, name)

            def timed(chunk, *args, _original=original, _kind=kind, _stage=stage.stage_index, **kwargs):
                self.actions.append((_kind, _stage, chunk))
                with self.busy.section():
                    return _original(chunk, *args, **kwargs)
            setattr(stage, name, timed)

    def step(self, inputs, targets):
        """One forward+backward of the whole batch; every rank gets the mean micro-batch loss."""
        losses = []
        args = (inputs,) if 0 in self.ids else ()
        kwargs = {"target": targets, "losses": losses} if self.num_stages - 1 in self.ids else {}
        self.schedule.step(*args, **kwargs)
        # the loss exists on the last stage only: give every rank the same number to log
        loss = torch.stack(losses).mean().detach().float() if losses else torch.zeros((), device=self.device)
        dist.all_reduce(loss, group=self.group)
        return loss

    def take_stats(self) -> dict:
        """This step's busy seconds (read after the step's synchronisation), peak micro-batches in
        flight on this rank (forwarded, not yet backwarded, over all its stages) and the order."""
        in_flight = peak = 0
        for kind, _, _ in self.actions:
            in_flight += {"F": 1, "B": -1}.get(kind, 0)
            peak = max(peak, in_flight)
        order = " ".join(f"{kind}{stage}.{chunk}" for kind, stage, chunk in self.actions)
        self.actions = []
        return {"busy_s": self.busy.take(), "peak_in_flight": peak, "order": order}

    def idle_fraction_theory(self) -> float:
        p, v, m = self.pp_size, self.virtual, self.microbatches
        return (p - 1) / (v * m + p - 1)
