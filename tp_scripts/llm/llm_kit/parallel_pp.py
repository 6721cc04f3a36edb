"""Pipeline parallelism: consecutive blocks on consecutive ranks, activations sent rank to rank.

naive       : the whole batch goes through stage 0, then stage 1, ...; one stage works at a time.
gpipe       : the batch is cut into m micro-batches; all forwards, then all backwards.
1f1b        : after warming up, each stage alternates one forward and one backward, so at most
              p micro-batches' activations are alive on the first stage (GPipe keeps m).
interleaved : each rank holds v non-consecutive stages (rank r: stages r, r+p, ...); the bubble
              shrinks by v at the price of v times more sends.

A tied model (125m, 1b, 3b: the output projection is the embedding's weight) keeps one copy of that weight on
the first stage and one on the last; after each backward the two stages add each other's gradient (Megatron's
embedding all-reduce, here a send and a receive), so both copies take the single model's step.

The bubble, as the idle fraction of a step: (p - 1) / (m + p - 1), or (p - 1) / (v m + p - 1)
interleaved (idle over ideal time, the other usual form, is (p - 1) / m).

What a step really did is measured inside the step, on the run's own micro-batches, dtype and clock:
every forward, backward and loss a stage computes is timed (timing.Timeline: CUDA events on a GPU)
from the step's start, which every stage shares (a barrier), to the end of the last stage (the loss
all-reduce). That gives the timeline of the step, each rank's busy time and idle fraction
(1 - busy / span), and the number of micro-batches whose activations were alive at once (the
activation memory a schedule costs).

Measuring the bubble on CPUs: the formula counts compute only. Each micro-batch also costs a
send/receive (gloo, through loopback) and the schedule's own Python, about a millisecond, and gloo
moves the data in a background thread that must get a core: with the tiny model at 16 x 64 tokens a
micro-batch computes for 1-2 ms and the idle fraction stays near 0.5 whatever m. Give each rank its
own core (one thread, pinned: bench/pin_rank.py, or the kit's local launcher) and enough tokens per
micro-batch (32 x 128 per step) and the measured bubble follows (p - 1) / (m + p - 1); the last
stage (output layer + loss) is the busiest, so the first one idles a little more.
"""
import copy

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from .model import loss_fn
from .timing import Timeline

PHASES = {"F": "fwd", "B": "bwd", "W": "bwd_weight"}
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
        self.tied = self._tied_copy() if model.config.tie_embeddings else None
        self.timeline = Timeline(device)
        self.actions = []  # this step's ("F" | "B" | "W", stage, micro-batch), in the order they ran
        for stage in stages:
            self._instrument(stage)
        maybe_compute_loss = self.schedule._maybe_compute_loss  # the last stage's loss is compute too

        def timed_loss(stage, output, target_mbs, mb_index, *args, **kwargs):
            if not stage.is_last:
                return maybe_compute_loss(stage, output, target_mbs, mb_index, *args, **kwargs)
            with self.timeline.section(stage=stage.stage_index, microbatch=mb_index, phase="loss"):
                return maybe_compute_loss(stage, output, target_mbs, mb_index, *args, **kwargs)
        self.schedule._maybe_compute_loss = timed_loss

    def _tied_copy(self):
        """(this rank's copy of the tied weight, the rank holding the other copy), or None on a middle rank.
        The last stage's copy is marked `tied_copy`: the gradient norm counts the weight once."""
        first, last = 0, self.num_stages - 1
        for module, stage in zip(self.modules, self.ids):
            if stage == first:
                return module.tok_embeddings.weight, dist.get_global_rank(self.group, self.pp_size - 1)
            if stage == last:
                module.output.weight.tied_copy = True
                return module.output.weight, dist.get_global_rank(self.group, 0)
        return None

    def _add_tied_gradients(self):
        weight, peer = self.tied
        other = torch.empty_like(weight.grad)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, weight.grad, peer, self.group),
                                        dist.P2POp(dist.irecv, other, peer, self.group)])
        for work in works:
            work.wait()
        weight.grad += other

    def _instrument(self, stage):
        for kind, name in (("F", "forward_one_chunk"), ("B", "backward_one_chunk"),
                           ("W", "backward_weight_one_chunk")):
            original = getattr(stage, name)

            def timed(chunk, *args, _original=original, _kind=kind, _stage=stage.stage_index, **kwargs):
                self.actions.append((_kind, _stage, chunk))
                with self.timeline.section(stage=_stage, microbatch=chunk, phase=PHASES[_kind]):
                    return _original(chunk, *args, **kwargs)
            setattr(stage, name, timed)

    def step(self, inputs, targets):
        """One forward+backward of the whole batch; every rank gets the mean micro-batch loss."""
        losses = []
        args = (inputs,) if 0 in self.ids else ()
        kwargs = {"target": targets, "losses": losses} if self.num_stages - 1 in self.ids else {}
        # every stage starts the step together: one time origin for all the ranks' timelines
        dist.barrier(group=self.group)
        self.timeline.start()
        self.schedule.step(*args, **kwargs)
        if self.tied is not None:
            self._add_tied_gradients()
        # the loss exists on the last stage only: give every rank the same number to log
        loss = torch.stack(losses).mean().detach().float() if losses else torch.zeros((), device=self.device)
        dist.all_reduce(loss, group=self.group)  # also ends the step together: the last stage has finished
        self.timeline.stop()
        return loss

    def take_stats(self) -> dict:
        """This step as it ran (read after the step's synchronisation): busy seconds, the step's span
        (from the common start to the end of the last stage), the idle fraction 1 - busy / span, the peak
        micro-batches in flight on this rank (forwarded, not yet backwarded, over all its stages), the
        order, and every forward/backward/loss section with its start and end (seconds from the start)."""
        in_flight = peak = 0
        for kind, _, _ in self.actions:
            in_flight += {"F": 1, "B": -1}.get(kind, 0)
            peak = max(peak, in_flight)
        order = " ".join(f"{kind}{stage}.{chunk}" for kind, stage, chunk in self.actions)
        self.actions = []
        span, events = self.timeline.take()
        busy = sum(e["t_end"] - e["t_start"] for e in events)
        return {"busy_s": busy, "span_s": span, "idle_fraction": 1 - busy / span if span > 0 else None,
                "peak_in_flight": peak, "order": order, "events": events}

    def idle_fraction_theory(self) -> float:
        p, v, m = self.pp_size, self.virtual, self.microbatches
        return (p - 1) / (v * m + p - 1)
