"""Everything train_classifier.py measures and records, behind a few calls, so that the training loop
shows the training and nothing else.

    ins = Instrument(config, ...)          # opens the run record (run.json), see docs/run-records.md
    ins.start_step(step)                   # before fetching the batch
    ins.split("data") ... ins.split("optimizer")   # after each phase of the step
    ins.observe_once(t, images=..., ...)   # first step only: what really ran -> run.json "observed"
    ins.end_step(step, epoch=..., ...)     # the step's metrics line (on a GPU: once its timing is known)
    ins.event("checkpoint_saved", ...)     # an event line: work done between two steps
    ins.finish(...)                        # summary.json and the closing lines

Timing keeps the CPU/GPU overlap that Day 1 teaches (dlokit.measure.StepClock): on a GPU, an ordinary
step is timed as a whole with CUDA events and costs no synchronisation; the phase split (data, h2d,
augment, forward, backward, optimizer, metrics) comes from a few *breakdown* steps that synchronise at
every phase boundary (`"breakdown": true` on their metrics line). On the CPU every step is split.

A module shared by tp_scripts/train_classifier.py (yours) and tp_scripts/solutions/train_classifier.py:
it is not part of any TP, you do not need to edit it.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn

from dlokit.measure import EnergyMeter, StepClock, peak_gpu_memory_mb, peak_rss_mb
from dlokit.runrecord import RunRecorder

from image_data import uses_randaugment
from train_options import augmentations

TIMING_WARMUP_STEPS = 2  # left out of the averages: first steps pay for allocation, autotuning, compilation
SPLITS = ("data", "h2d", "augment", "forward", "backward", "optimizer", "metrics")
POWER_SAMPLE_S = 0.2     # NVML power readings are themselves averages: no need to ask more often


class Instrument:
    def __init__(self, config: dict, *, rank: int, world_size: int, run_id: str, runs_dir, device,
                 start_step: int, total_steps: int, breakdown_every: int, print_every: int, say=print):
        self.record = RunRecorder(config, rank=rank, world_size=world_size, run_id=run_id, runs_dir=runs_dir,
                                  script="train_classifier.py", device=device)
        self.folder = self.record.folder.parent  # <runs_dir>/<run_id>: checkpoint and profiler traces go here
        self.device, self.say = device, say
        self.total_steps, self.print_every = total_steps, print_every
        self.warmup_until = start_step + TIMING_WARMUP_STEPS
        self.clock = StepClock(device, breakdown_every=breakdown_every, first_breakdown=self.warmup_until + 1)
        self.energy = EnergyMeter(device)
        self.observed = None
        self.timed: list[dict] = []
        self.first_load = None
        self.last_metrics: dict = {}
        self._last_power = None

    # ---- the step ---------------------------------------------------------------------------------

    def start_step(self, step: int) -> None:
        """`step`: the number the step will have once done (global, from 1)."""
        self.clock.start(step)

    def split(self, name: str) -> None:
        self.clock.split(name)

    def end_step(self, step: int, *, epoch: int, lr: float, samples: int, **metrics) -> None:
        """Queue the step's metrics line; lines are written, in order, once their timing is known."""
        if metrics:
            self.last_metrics = metrics
        self.clock.stop({"epoch": epoch, "lr": lr, "batch_size": samples, **metrics})
        self._write(self.clock.ready())

    def flush(self) -> None:
        """Write every queued step line (waits for the device once if it is behind)."""
        self._write(self.clock.drain())

    def _write(self, timings) -> None:
        for timing in timings:
            self._write_step(timing)

    def _write_step(self, timing) -> None:
        info, splits, t_step = timing.info, timing.splits, max(timing.t_step, 1e-9)
        samples = info["batch_size"]
        whole = timing.t_period if timing.t_period else splits["data"] + t_step  # the real pace of training
        line = {"epoch": info["epoch"], "step": timing.step, "lr": info["lr"], "batch_size": samples,
                **{f"t_{name}": round(seconds, 6) for name, seconds in splits.items()},
                "t_step": round(t_step, 6), "throughput_train": samples / whole,
                "throughput_compute": samples / t_step, "gpu_mem_mb": peak_gpu_memory_mb(self.device),
                "breakdown": timing.breakdown,
                **({"t_period": round(timing.t_period, 6)} if timing.t_period is not None else {}),
                **{k: v for k, v in info.items() if k not in ("epoch", "lr", "batch_size")}}
        self.record.log("step", **line)
        if self.first_load is None:
            self.first_load = splits["data"]
        if timing.step > self.warmup_until:
            self.timed.append({**splits, "step": t_step, "period": timing.t_period, "samples": samples,
                               "breakdown": timing.breakdown, "after_breakdown": timing.after_breakdown})
        self._sample_power()
        if timing.step % self.print_every == 0 or timing.step == self.total_steps:
            self.say(f"step {timing.step:5d}/{self.total_steps} | epoch {info['epoch'] + 1} | "
                     f"loss {info.get('loss', self.last_metrics.get('loss', float('nan'))):.4f} "
                     f"acc {info.get('acc', self.last_metrics.get('acc', float('nan'))):.3f} | lr {info['lr']:.4f} | "
                     f"{samples / whole:.0f} img/s (compute {samples / t_step:.0f}) | "
                     f"data {splits['data'] * 1e3:.1f} ms step {t_step * 1e3:.1f} ms"
                     + (" [breakdown]" if timing.breakdown and self.clock.overlap else ""))

    def _sample_power(self) -> None:
        now = time.monotonic()
        if self._last_power is None or now - self._last_power >= POWER_SAMPLE_S:
            self.energy.sample_power()
            self._last_power = now

    # ---- between two steps -------------------------------------------------------------------------

    def pause(self) -> None:
        """Work outside the steps follows (validation, a checkpoint): the step lines so far are written,
        and the next step's t_period will not span that work."""
        self.flush()
        self.clock.interrupt()

    def log(self, kind: str, **fields) -> None:
        """An 'epoch' or 'val' line, after the step lines before it."""
        self.pause()
        self.record.log(kind, **fields)

    def event(self, name: str, **fields) -> None:
        """An event line ('checkpoint_saved', 'resumed', 'profiler_trace'), after the step lines before it."""
        self.pause()
        self.record.log("event", event=name, **fields)

    # ---- what really ran --------------------------------------------------------------------------

    def observe_once(self, t, *, images, targets, logits, pinned: bool) -> None:
        """First step only: what the script really did (not what the options asked), for the check cells."""
        if self.observed is not None:
            return
        model, raw_model, loader, sampler = t.model, t.raw_model, t.data.train_loader, t.data.shard_sampler
        ddp = getattr(model, "_orig_mod", model)
        ddp = ddp if isinstance(ddp, nn.parallel.DistributedDataParallel) else None
        first_conv = next((m for m in raw_model.modules() if isinstance(m, nn.Conv2d)), None)
        dataset = getattr(loader, "dataset", None)
        mixed = targets.ndim == 2 and targets.dtype.is_floating_point  # soft targets: the batch was mixed
        randaugment = uses_randaugment(dataset)
        workers = getattr(loader, "num_workers", None)
        self.observed = {
            "device": str(images.device), "model_device": str(next(raw_model.parameters()).device),
            "amp_dtype": str(logits.dtype).replace("torch.", ""), "grad_scaler": t.scaler.is_enabled(),
            "channels_last_input": images.is_contiguous(memory_format=torch.channels_last),
            "channels_last_weights": first_conv is not None and
            first_conv.weight.is_contiguous(memory_format=torch.channels_last),
            "ddp_wrapped": ddp is not None,
            "ddp_world_size": dist.get_world_size() if dist.is_initialized() else 1,
            "ddp_bucket_cap_mb": ddp.bucket_bytes_cap / 2**20 if ddp else None,
            "ddp_static_graph": bool(ddp.static_graph) if ddp else None,
            "ddp_gradient_as_bucket_view": ddp.gradient_as_bucket_view if ddp else None,
            "ddp_find_unused_parameters": ddp.find_unused_parameters if ddp else None,
            "sync_bn": any(isinstance(m, nn.SyncBatchNorm) for m in raw_model.modules()),
            "compiled": hasattr(model, "_orig_mod"),
            "sampler": type(sampler).__name__ if sampler is not None else None,
            "samples_per_rank_per_epoch": len(sampler) if sampler is not None else None,
            "loader_num_workers": workers,
            "loader_pin_memory": getattr(loader, "pin_memory", None),
            "loader_prefetch_factor": getattr(loader, "prefetch_factor", None),
            "loader_persistent_workers": getattr(loader, "persistent_workers", None),
            "batch_pinned": pinned, "non_blocking": t.data.non_blocking,
            "augment": (["randaugment"] if randaugment else []) +
                       ([n for n in augmentations(t.args.augment) if n in ("mixup", "cutmix")] if mixed else []),
            "augment_on_device": mixed,
            "randaugment_in_workers": randaugment and bool(workers),
            "record_function_labels": t.phase is torch.profiler.record_function,
            "profiler": t.profiler is not None,
            "tf32": tf32_enabled(),
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
        }
        self.record.amend(observed=self.observed)
        self.record.log("event", event="observed", **self.observed)

    # ---- the end ----------------------------------------------------------------------------------

    def finish(self, **extra) -> dict:
        """Means over the timed steps, memory and energy, plus `extra`; writes summary.json and returns it."""
        self.flush()
        overlap = self.clock.overlap
        timed = self.timed
        split_rows = [r for r in timed if r["breakdown"]]
        # on a GPU, a breakdown step and the one after it lost the overlap: the whole-step means leave them out
        whole = [r for r in timed if not (overlap and (r["breakdown"] or r["after_breakdown"]))] or timed

        def mean(rows, key):
            return sum(r.get(key) or 0.0 for r in rows) / len(rows) if rows else None

        t_step, samples = mean(whole, "step"), mean(whole, "samples")
        t_data = mean(timed, "data")
        periods = [r["period"] for r in whole if r["period"] is not None] if overlap else []
        pace = sum(periods) / len(periods) if periods else (t_data + t_step if timed else None)
        summary = {
            "first_step_load_s": self.first_load, "timing_warmup_steps": TIMING_WARMUP_STEPS,
            "timed_steps": len(whole), "breakdown_steps": len(split_rows),
            "timing": "cuda_events" if overlap else "host_clock",
            "breakdown_every": self.clock.breakdown_every if overlap else 1,
            "t_data": t_data, **{f"t_{name}": mean(split_rows, name) for name in SPLITS[1:]},
            "t_step": t_step, "t_period": pace if periods else None,
            "throughput_train": samples / pace if timed else None,
            "throughput_compute": samples / t_step if timed else None,
            "gpu_mem_peak_mb": peak_gpu_memory_mb(self.device), "host_rss_peak_mb": peak_rss_mb(),
            "energy_j": self.energy.energy_j(), "peak_power_w": self.energy.peak_power_w,
            "train_loss": self.last_metrics.get("loss"),
            **extra,
            "observed": self.observed,
        }
        self.record.finish(**summary)
        if timed:
            parts = ", ".join(f"{name} {summary[f't_{name}'] * 1e3:.1f}" for name in SPLITS[1:6]
                              if summary[f"t_{name}"] is not None)
            self.say(f"done: {summary['steps']} steps | {summary['throughput_train']:.1f} img/s train, "
                     f"{summary['throughput_compute']:.1f} img/s compute | per step (ms): data {t_data * 1e3:.1f}"
                     f", {parts or 'no breakdown step'} | first batch {self.first_load:.2f} s | "
                     f"host RSS {summary['host_rss_peak_mb']:.0f} MiB" +
                     (f" | GPU peak {summary['gpu_mem_peak_mb']:.0f} MiB"
                      if summary["gpu_mem_peak_mb"] is not None else ""))
        return summary


def tf32_enabled() -> bool:
    if hasattr(torch.backends.cudnn, "conv"):  # torch >= 2.9
        return torch.backends.cuda.matmul.fp32_precision == "tf32" == torch.backends.cudnn.conv.fp32_precision
    return torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
