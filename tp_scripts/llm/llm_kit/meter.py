"""What a train_llm.py run measured: each step's metrics line (losses, section times, throughput, MFU,
pipeline activity) and the run's summary (means after the warm-up steps, memory, energy, the pipeline's idle
fraction, a gradient all-reduce timed alone)."""
from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from dlokit.in_job.measure import EnergyMeter, peak_gpu_memory_mb, peak_rss_mb, tf32_enabled

from .mfu import arithmetic, mfu, peak_flops
from .model import count_params, flops_per_token


class Meter:
    """Turns each step's loss and section times into a metrics line, and the run into its summary: train_llm.py's
    layer over RunRecorder (run.recorder), as the classifier's Instrument is."""

    def __init__(self, run):
        self.run = run
        args, device = run.args, run.device
        self.tokens_per_step = args.batch_size * args.seq_len
        self.fpt = flops_per_token(run.config, args.seq_len)
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.peak, self.peak_basis = peak_flops(device, arithmetic(args.dtype, tf32_enabled(ops=("matmul",))))
        if run.is_main and self.peak is None:
            print(f"[train_llm] MFU not computed: {self.peak_basis}", flush=True)
        self.energy = EnergyMeter(device)

    def log_step(self, step, loss, norm, timing):
        """`timing`: the step as the run's StepClock measured it (every step split into its phases)."""
        run, args = self.run, self.run.args
        parallel = run.parallel
        splits, t_step = timing.splits, timing.t_step
        t_total = t_step + splits["data"]
        fields = {
            "epoch": 0, "step": step + 1, "lr": args.lr, "loss": loss, "batch_size": args.batch_size,
            "t_data": splits["data"], "t_h2d": splits["h2d"],
            "t_forward": splits.get("forward"), "t_backward": splits.get("backward"),
            "t_fwd_bwd": splits.get("fwd_bwd"), "t_optimizer": splits["optimizer"], "t_step": t_step,
            "throughput_train": args.batch_size / t_total, "throughput_compute": args.batch_size / t_step,
            "tokens_per_s": self.tokens_per_step / t_total,
            "mfu": mfu(self.tokens_per_step / t_total, self.fpt, self.world, self.peak),
            "comm_s": parallel.comm.take() if parallel.comm is not None else None,
            "grad_norm": norm, "gpu_mem_mb": peak_gpu_memory_mb(run.device),
        }
        events = []
        if parallel.pipeline is not None:
            stats = parallel.pipeline.take_stats()
            idle = stats.get("idle_fraction")
            fields.update(pp_busy_s=stats["busy_s"], pp_span_s=stats.get("span_s"),
                          pp_peak_in_flight=stats["peak_in_flight"], pp_order=stats["order"],
                          pp_idle_fraction=idle if idle is not None else 1 - stats["busy_s"] / splits["fwd_bwd"])
            events = stats.get("events", [])
        self.energy.sample_power()
        run.recorder.step(**fields)
        for event in events:  # each micro-batch's forward/backward on this rank's stages, from the step's start
            run.recorder.log("pp_event", step=step + 1, **event)
        run.history.append(fields)
        if run.is_main:
            extra = f" grad_norm {norm:.4f}" if norm is not None else ""
            print(f"step {step + 1:4d} loss {loss:.4f}{extra} tokens/s {fields['tokens_per_s']:,.0f}", flush=True)
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at step {step + 1}")

    def finish(self, start_step):
        run, device = self.run, self.run.device
        history, parallel = run.history, run.parallel
        summary = _summarise(history, run.args.warmup)
        first_loss = history[0]["loss"] if history else None
        last_loss = history[-1]["loss"] if history else None
        summary.update(first_loss=first_loss, last_loss=last_loss, n_params=count_params(run.config),
                       flops_per_token=self.fpt, params_bytes_this_rank=_local_param_bytes(parallel.modules),
                       energy_j=self.energy.energy_j(), peak_power_w=self.energy.peak_power_w,
                       gpu_mem_peak_mb=peak_gpu_memory_mb(device), host_rss_peak_mb=peak_rss_mb(),
                       peak_flops=self.peak, mfu_basis=self.peak_basis,
                       mfu=mfu(summary.get("tokens_per_s"), self.fpt, self.world, self.peak),
                       data_parallel=run.dims.data_parallel, fsdp_reduce_op=parallel.fsdp_reduce_op,
                       optimizer=type(run.optimizer).__name__, **run.extra_summary)
        if parallel.pipeline is not None:  # a collective: every rank calls it
            summary.update(_pipeline_summary(parallel.pipeline, history, run.args.warmup, device))
        if run.dims.data_parallel in ("ddp", "zero1"):
            summary["comm_probe_s"] = _time_gradient_all_reduce(parallel.modules, device, parallel.dp_group)
        run.recorder.finish(**summary)
        if run.is_main and history:
            print(f"[train_llm] done: loss {first_loss:.4f} -> {last_loss:.4f}, "
                  f"tokens/s {summary.get('tokens_per_s') or 0:,.0f}, mfu {summary.get('mfu')}", flush=True)
        elif run.is_main:
            print(f"[train_llm] nothing to do: the checkpoint is at step {start_step} >= --steps {run.args.steps}",
                  flush=True)


def _local_param_bytes(modules) -> int:
    """Bytes of parameters this rank really holds (a DTensor counts its local shard only)."""
    total = 0
    for module in modules:
        for p in module.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            total += local.numel() * local.element_size()
    return total


def _measured(history, warmup):
    return history[warmup:] or history


def _summarise(history, warmup) -> dict:
    measured = _measured(history, warmup)
    if not measured:
        return {"steps": 0}
    mean = lambda key: (sum(h[key] for h in measured) / len(measured)) if measured[0].get(key) is not None else None
    return {
        "steps": history[-1]["step"], "epochs": 0, "first_step_load_s": history[0]["t_data"],
        **{key: mean(key) for key in ("t_data", "t_h2d", "t_forward", "t_backward", "t_fwd_bwd", "t_optimizer",
                                      "t_step", "throughput_train", "throughput_compute", "comm_s", "tokens_per_s")},
    }


def _pipeline_summary(pipeline, history, warmup, device) -> dict:
    """Idle fraction measured in the run's own steps: 1 - (time this rank computed) / (step time).
    Every rank idles; the pipeline's figure is the least idle (busiest) rank's."""
    measured = _measured(history, warmup)
    if not measured:
        return {}
    idle = sum(h["pp_idle_fraction"] for h in measured) / len(measured)
    least_idle = torch.tensor(idle, device=device)
    dist.all_reduce(least_idle, op=dist.ReduceOp.MIN)
    return {
        "pp_microbatches": pipeline.microbatches, "pp_virtual_stages": pipeline.virtual,
        "pp_busy_s": sum(h["pp_busy_s"] for h in measured) / len(measured),
        "pp_idle_fraction_this_rank": idle,
        "pp_idle_fraction_measured": least_idle.item(),
        "pp_idle_fraction_theory": pipeline.idle_fraction_theory(),  # (p - 1) / (v m + p - 1)
        "pp_peak_in_flight": max(h["pp_peak_in_flight"] for h in history),
        "pp_order": history[-1]["pp_order"],
    }


def _time_gradient_all_reduce(modules, device, group, repeats=3) -> float:
    """Time of one all-reduce of every gradient, alone: DDP's communication if none of it overlapped."""
    flat = torch.zeros(sum(p.numel() for m in modules for p in m.parameters()), device=device)
    best = float("inf")
    for _ in range(repeats):
        dist.barrier(group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        dist.all_reduce(flat, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best
