"""Everything train_classifier.py measures and records, behind a few calls, so that the training loop
shows the training and nothing else.

    ins = Instrument(config, ...)          # opens the run record (run.json), see docs/run-records.md
    ins.start_step(step)                   # before fetching the batch
    ins.split("data") ... ins.split("optimizer")   # after each phase of the step
    ins.observe_once(t, images=..., ...)   # first step only: what really ran -> run.json "observed"
    ins.end_step(step, epoch=..., ...)     # the step's metrics line (on a GPU: once its timing is known)
    ins.tensor_memory                      # the timing warm-up steps' tensors (tensor_memory.py) -> summary
    ins.event("checkpoint_saved", ...)     # an event line: work done between two steps
    if ins.checkpoint_due(step): ...       # --checkpoint-on-signal: SIGUSR1/SIGUSR2 came, every rank stops here
    ins.finish(...)                        # summary.json and the closing lines
    return ins.out_of_memory(error, ...)   # a rank ran out of memory: recorded, every rank stops (exit 3)
    return ins.failed_with(error)          # a damaged image, a checkpoint that did not fit: its one line recorded

What the run will not do although the options ask for it is said at the start and kept in the record
(`notes`): a data folder without val/ trains without validation.

How a run ends early is recorded too (docs/run-records.md): out of memory (`failed`, `oom: true`, the batch
size and the peak memory; the other ranks are told through the process group's store and stop at once
instead of waiting in their next collective until the NCCL timeout), a cancelled job (SIGTERM from
scancel or torchrun, SIGINT from Ctrl-C: `cancelled`, exit code 128 + the signal's number), a job whose time
is nearly up (--checkpoint-on-signal: SIGUSR1 or SIGUSR2, Slurm's --signal warning: a checkpoint at the next
step boundary, `checkpointed`, exit code 75 = run me again with --resume).

Memory: the process's peak (host RSS; on a GPU, max_memory_allocated) and, on the timing warm-up steps, what the
step holds in tensors (tensor_memory.py: autograd's saved tensors, weights, gradients, optimizer states), which
grows with the batch image by image where RSS hides it; `tensor_*_mib` on those steps' lines and in the summary.

Timing keeps the CPU/GPU overlap that Day 1 teaches (dlokit.in_job.measure.StepClock): on a GPU, an ordinary
step is timed as a whole with CUDA events and costs no synchronisation; the phase split (data, h2d,
augment, forward, backward, optimizer, metrics) comes from a few *breakdown* steps that synchronise at
every phase boundary (`"breakdown": true` on their metrics line). On the CPU every step is split.

A module shared by tp_scripts/train_classifier.py (yours) and tp_scripts/solutions/train_classifier.py:
it is not part of any TP, you do not need to edit it.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from functools import partial

import torch
import torch.distributed as dist
import torch.nn as nn

from dlokit.in_job.divergence import diverging
from dlokit.in_job.energy import HostEnergyMeter, process_started_unix
from dlokit.in_job.jobenv import EXIT_PEER_FAILED, EXIT_REQUEUE
from dlokit.in_job.measure import EnergyMeter, StepClock, peak_gpu_memory_mb, peak_rss_mb, tf32_enabled
from dlokit.in_job.peers import (ACK_WAIT_S, LEAVE_GRACE_S, WATCH_EVERY_S, Peers, abort_process_group, job_store,
                                 wait_for_every_rank)
from dlokit.in_job.runrecord import RunRecorder

from .image_data import uses_randaugment
from .tensor_memory import TensorMemory
from .train_options import augmentations

TIMING_WARMUP_STEPS = 2  # left out of the averages: first steps pay for allocation, autotuning, compilation
SPLITS = ("data", "h2d", "augment", "forward", "backward", "optimizer", "metrics")
POWER_SAMPLE_S = 0.2     # NVML power readings are themselves averages: no need to ask more often
CHECKPOINT_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)  # Slurm's --signal; USR2 is also submitit's
CHECKPOINTED_WAIT_S = 120.0  # after a signal's checkpoint, how long a rank waits for the others to be done too


class Instrument(Peers):
    """The classifier's timings, memory, energy and run record; as a Peers, how its rank ends early. A layer over
    RunRecorder (its step lines, its out-of-memory record) and StepClock, the surfaces every script shares."""

    def __init__(self, config: dict, *, rank: int, world_size: int, run_id: str, runs_dir, device,
                 start_step: int, total_steps: int, breakdown_every: int, print_every: int, say=print,
                 model=None, optimizer=None):
        super().__init__(rank, world_size, device, script="train_classifier.py")
        self.record = RunRecorder(config, rank=rank, world_size=world_size, run_id=run_id, runs_dir=runs_dir,
                                  script="train_classifier.py", device=device)
        self.folder = self.record.folder.parent  # <runs_dir>/<run_id>: checkpoint and profiler traces go here
        self.device, self.say = device, say
        self.total_steps, self.print_every = total_steps, print_every
        self.diverging = partial(diverging, num_classes=config.get("num_classes"),
                                 warmup_steps=config.get("warmup_steps"), lr_peak=config.get("lr_peak"))
        self.warmup_until = start_step + TIMING_WARMUP_STEPS
        self.clock = StepClock(device, breakdown_every=breakdown_every, first_breakdown=self.warmup_until + 1)
        self.energy = EnergyMeter(device)
        self.host_energy = HostEnergyMeter()  # RAPL, where the host lets us read it
        self.observed = None
        # the hooks cost a little Python per saved tensor: only the warm-up steps, which the timings leave out;
        # torch.compile's graphs would have to be traced again with them
        self.tensors = TensorMemory(model, optimizer) if model is not None and not config.get("compile") else None
        self.tensor_memory: dict = {}
        self.notes = [note for note in [validation_skipped(config)] if note]
        for note in self.notes:
            say(note)
            self.record.log("event", event="note", note=note)
        self.timed: list[dict] = []
        self.first_load = None
        self.last_metrics: dict = {}
        self._last_power = None
        self.step, self.steps_done = start_step, start_step  # the step under way, the last one ended
        self._signals = {}
        # a rank stopped from outside (SIGABRT from the kit's launcher when it is stuck) prints where every thread was
        faulthandler.enable(file=sys.stderr, all_threads=True)
        self.start_watching()
        self._signals = install_cancel_handlers(self)
        self.on_signal = (CheckpointOnSignal(self, margin=1 + int(config.get("metric_step") or 1))
                          if config.get("checkpoint_on_signal") else None)

    # ---- the step ---------------------------------------------------------------------------------

    def start_step(self, step: int) -> None:
        """`step`: the number the step will have once done (global, from 1)."""
        self.step = step
        self.tick(f"step {step}")
        if self.tensors is not None and step <= self.warmup_until:
            self.tensors.start()
        self.clock.start(step)

    def split(self, name: str) -> None:
        self.clock.split(name)
        if name == "backward" and self._measuring():
            self.tensors.after_backward()
        self.tick(f"step {self.step}, after its {name} phase")

    def end_step(self, step: int, *, epoch: int, lr: float, samples: int, **metrics) -> None:
        """Queue the step's metrics line; lines are written, in order, once their timing is known."""
        if metrics:
            self.last_metrics = metrics
        if self._measuring():
            self.tensors.stop()
            counts = {f"tensor_{key}": value for key, value in self.tensors.mib().items()}
            if counts["tensor_held_mib"] >= (self.tensor_memory.get("tensor_held_mib") or 0):
                self.tensor_memory = counts
            metrics = {**metrics, **counts}
        self.steps_done, self.first_step_done = step, True
        self.clock.stop({"epoch": epoch, "lr": lr, "batch_size": samples, **metrics})
        self._write(self.clock.ready())

    def _measuring(self) -> bool:
        return self.tensors is not None and self.tensors.active

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
        self.record.step(**line)
        if self.first_load is None:
            self.first_load = splits["data"]
        if timing.step > self.warmup_until:
            self.timed.append({**splits, "step": t_step, "period": timing.t_period, "samples": samples,
                               "breakdown": timing.breakdown, "after_breakdown": timing.after_breakdown})
        self._sample_power()
        if timing.step % self.print_every == 0 or timing.step == self.total_steps:
            loss = info.get("loss", self.last_metrics.get("loss", float("nan")))
            note = self.diverging(info.get("loss"), step=timing.step)
            self.say(f"step {timing.step:5d}/{self.total_steps} | epoch {info['epoch'] + 1} | "
                     f"loss {loss:.4f} acc {info.get('acc', self.last_metrics.get('acc', float('nan'))):.3f} | "
                     f"lr {info['lr']:.4f} | "
                     f"{samples / whole:.0f} img/s (compute {samples / t_step:.0f}) | "
                     f"data {splits['data'] * 1e3:.1f} ms step {t_step * 1e3:.1f} ms"
                     + (" [breakdown]" if timing.breakdown and self.clock.overlap else "")
                     + (f" | {note}" if note else ""))

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

    def log_batchnorm_buffers(self, model, epoch: int, channels: int = 8) -> None:
        """A 'bn_running' line: this rank's running mean and variance of the model's first BatchNorm layer (its first
        `channels` channels). SyncBatchNorm updates them from the global batch, the same on every rank; plain
        BatchNorm under DDP from each rank's own batch, so the ranks part (TP2.3)."""
        for name, module in model.named_modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.running_mean is not None:
                self.log("bn_running", epoch=epoch, layer=name,
                         running_mean=module.running_mean[:channels].float().tolist(),
                         running_var=module.running_var[:channels].float().tolist())
                return

    def event(self, name: str, **fields) -> None:
        """An event line ('checkpoint_saved', 'resumed', 'profiler_trace'), after the step lines before it."""
        self.pause()
        self.record.log("event", event=name, **fields)

    # ---- what really ran --------------------------------------------------------------------------

    def observe_once(self, t, *, phase, loaded, images, targets, logits) -> None:
        """First step only: what the script really did (not what the options asked), for the check cells.
        `loaded`: the (images, labels) the loader gave; `t.moves` watched the model's set-up and this step's h2d."""
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
            "model_to_device": t.moves.moved(raw_model.parameters()), "batch_to_device": t.moves.moved(loaded),
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
            "batch_pinned": loaded[0].is_pinned(), "non_blocking": t.data.non_blocking,
            "augment": (["randaugment"] if randaugment else []) +
                       ([n for n in augmentations(t.args.augment) if n in ("mixup", "cutmix")] if mixed else []),
            "augment_on_device": mixed,
            "randaugment_in_workers": randaugment and bool(workers),
            "record_function_labels": labels_spans(phase),
            "profiler": t.profiler is not None,
            "tf32": tf32_enabled(),
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
        }
        t.moves.forget()
        self.record.amend(observed=self.observed)
        self.record.log("event", event="observed", **self.observed)

    # ---- the end ----------------------------------------------------------------------------------

    def finish(self, **extra) -> dict:
        """Means over the timed steps, memory and energy, plus `extra`; writes summary.json and returns it."""
        self.stop_watching()
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
            **self.tensor_memory,
            **self.energy.summary(), **self.host_energy.summary(), "process_started_unix": process_started_unix(),
            "train_loss": self.last_metrics.get("loss"), "notes": self.notes,
            **extra,
            "observed": self.observed,
        }
        if not self._claim_end():
            return summary  # a signal ended the run meanwhile: its record stands
        self.record.finish(**summary)
        self._restore_signals()
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

    # ---- ending early: out of memory, another rank stopped, a cancelled job ---------------------------

    def out_of_memory(self, error: BaseException, *, batch_size: int) -> int:
        """This rank ran out of memory (torch.OutOfMemoryError on the GPU, MemoryError on the host): the cause
        in the record, a note that stops the other ranks, the process group aborted. Returns the exit code."""
        name = type(error).__name__
        message = (str(error).splitlines() or [""])[0] or "no message"
        peak_gpu, peak_host = peak_gpu_memory_mb(self.device), peak_rss_mb()
        peak = (f"peak GPU memory {peak_gpu:.0f} MiB, " if peak_gpu is not None else "") + \
            f"peak host memory {peak_host:.0f} MiB"
        where = f"step {self.step}, --batch-size {batch_size} per process"
        text = f"{name}: out of memory at {where} ({peak}): {message}"
        print(f"train_classifier.py: rank {self.rank}: {text}", file=sys.stderr, flush=True)
        if self._claim_end():
            self._write(self.clock.ready())  # the step lines already timed; no waiting for the device
            self.record.out_of_memory(text, status="failed", event={"step": self.step, "batch_size": batch_size,
                                      "gpu_mem_peak_mb": peak_gpu, "host_rss_peak_mb": peak_host},
                                      failed_step=self.step, batch_size=batch_size, **self._early_summary())
            self._restore_signals()
        return self.failed(f"ran out of memory at {where} ({name})", oom=True)

    def failed_with(self, error: BaseException) -> int:
        """This rank stopped on an error that says in one line what went wrong and where (a damaged image, a
        checkpoint that did not fit on the disk): printed, recorded as the cause (failed), the other ranks
        told. Returns the exit code."""
        text = one_line(error)
        print(f"train_classifier.py: rank {self.rank}: error: {text}", file=sys.stderr, flush=True)
        if self._claim_end():
            self._write(self.clock.ready())
            self.record.log("event", event="failed", error=text, step=self.step)
            self.record.finish(status="failed", error=text, failed_step=self.step, **self._early_summary())
            self._restore_signals()
        return self.failed(f"failed: {text}")

    def stopped_by_other_rank(self, error: BaseException) -> int:
        """A collective of this rank failed: when another rank left a stop note (it ran out of memory, or
        was cancelled), record that cause rather than the broken connection, and return the exit code;
        otherwise re-raise `error` (the usual failed summary and traceback follow)."""
        code = self.peer_stop_code()
        if code is None and self._ended:
            # The watch thread is already ending this rank for another rank's note (and exits the process once that
            # rank has left); the note is gone when the store left with it. No traceback of the broken collective.
            time.sleep(ACK_WAIT_S + LEAVE_GRACE_S + WATCH_EVERY_S)
            return EXIT_PEER_FAILED
        if code is None:
            raise error
        return code

    def stop_for(self, note: dict, *, exit_process: bool) -> int:
        code = super().stop_for(note, exit_process=exit_process)
        self._restore_signals()
        return code

    def stopped_at(self) -> int:
        return self.step

    def record_stopped(self, note: dict, reason: str) -> None:
        self.record.log("event", event="stopped", by_rank=note.get("rank"), reason=reason)
        self.record.finish(status=note.get("status", "failed"), error=reason, stopped_by_rank=note.get("rank"),
                           oom=bool(note.get("oom")), **self._early_summary())

    def record_stuck(self, reason: str, text: str) -> None:
        self.record.log("event", event="stuck", reason=reason, step=self.step, where=self.where)
        self.record.finish(status="failed", error=text, stuck=True, **self._early_summary())

    def cancel(self, signum: int) -> None:
        """SIGTERM or SIGINT (a cancelled job, Ctrl-C): record status 'cancelled', tell the other ranks."""
        name = signal.Signals(signum).name
        if self._claim_end():
            self.record.log("event", event="cancelled", signal=name, step=self.step)
            self.record.finish(status="cancelled", signal=name, error=f"cancelled by {name} at step {self.step}",
                               **self._early_summary())
        self.cancelled(signum)

    def checkpoint_due(self, step: int) -> bool:
        """--checkpoint-on-signal: a SIGUSR1/SIGUSR2 came (the job's time is nearly up) and every rank has agreed
        to save at this step boundary. Call it on every rank after every step."""
        return self.on_signal is not None and self.on_signal.due(step)

    def checkpointed(self, **extra) -> int:
        """The checkpoint the signal asked for is saved: summary 'checkpointed' (with `signal`), the process group
        left. Returns the exit code, EXIT_REQUEUE: the kit's job then requeues itself and resumes."""
        name = self.on_signal.received
        if not self._ended:
            self.record.log("event", event="checkpointed_on_signal", signal=name, step=self.steps_done)
        self.finish(status="checkpointed", signal=name, steps=self.steps_done, **extra)
        for signum in CHECKPOINT_SIGNALS:  # a late second warning must not kill the process on its way out
            signal.signal(signum, signal.SIG_IGN)
        self.say(f"checkpointed on {name} at step {self.steps_done}: exit code {EXIT_REQUEUE}, run again "
                 "with --resume (a job submitted by dlokit.race requeues itself and resumes from here)")
        wait_for_every_rank("checkpointed", CHECKPOINTED_WAIT_S)
        abort_process_group(self.device)
        return EXIT_REQUEUE

    def _early_summary(self) -> dict:
        return {"steps": self.steps_done, "gpu_mem_peak_mb": peak_gpu_memory_mb(self.device),
                "host_rss_peak_mb": peak_rss_mb(), **self.tensor_memory, **self.energy.summary(),
                **self.host_energy.summary(),
                "process_started_unix": process_started_unix(),
                "train_loss": self.last_metrics.get("loss"), "notes": self.notes, "observed": self.observed}

    def _restore_signals(self) -> None:
        for signum, previous in self._signals.items():
            try:
                signal.signal(signum, previous)
            except (ValueError, TypeError):  # not the main thread, or a handler set outside Python
                pass
        self._signals = {}


def validation_skipped(config: dict) -> str | None:
    """The note of a training run that will not validate because its data has no validation set (--test,
    --lr-finder and --data synthetic never validate: no note)."""
    data = config.get("data")
    if config.get("val_images") is not None or config.get("test") or config.get("lr_finder") or \
            data in (None, "synthetic"):
        return None
    if config.get("data_format", "folder") == "folder":
        return f"no val/ folder under {data}: validation skipped"
    return f"no val split in {data} (converted from a folder without val/): validation skipped"


def one_line(error: BaseException) -> str:
    """The error's own sentence. A DataLoader worker's comes back as 'Caught X in DataLoader worker process 0.
    Original Traceback ...', whose last line is '<module>.X: <the sentence>'."""
    text = str(error).strip()
    if "\nOriginal Traceback" in text:
        text = text.splitlines()[-1].split(": ", 1)[-1]
    return text


# ---- a cancelled job -------------------------------------------------------------------------------------

def install_cancel_handlers(ins) -> dict:
    """SIGTERM and SIGINT finish the record as 'cancelled' and exit with 128 + the signal's number. Returns
    the handlers replaced (restored when the run ends). DataLoader workers (forked: they inherit the
    handler) end as they would have without it. Main thread only. dlokit.in_job.runrecord may have installed a
    SIGTERM handler of its own for the same purpose: this one replaces it for the run, and puts it back."""
    owner, replaced = os.getpid(), {}

    def handler(signum, frame):
        if os.getpid() != owner:  # a forked DataLoader worker: it has no record of its own to finish
            if replaced.get(signum) is signal.default_int_handler:
                return signal.default_int_handler(signum, frame)  # KeyboardInterrupt: the worker ends quietly
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return None
        # Slurm signals every process of the step and the kit's task forwards the signal too: a second one,
        # handled in the middle of the first, would end the process before its summary is written.
        for other in (signal.SIGTERM, signal.SIGINT):
            signal.signal(other, signal.SIG_IGN)
        ins.cancel(signum)
        abort_process_group(ins.device)
        if hasattr(signal, "SIGCHLD"):  # the job's signal ended the DataLoader workers too: no complaint about it
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        return replaced
    for signum in (signal.SIGTERM, signal.SIGINT):
        replaced[signum] = signal.signal(signum, handler)
    return replaced


# ---- a job whose time is nearly up (--checkpoint-on-signal) ------------------------------------------------

class CheckpointOnSignal:
    """SIGUSR1 or SIGUSR2 (Slurm's `--signal` warning before the time limit, or the kit's job forwarding it) asks
    for a checkpoint at a step boundary. The save is a collective (every rank hands its random state to rank 0),
    so every rank must stop at the same step, although maybe only one got the signal. They agree through the
    process group's store, never waiting there (a rank waiting in the store would block the others in their
    next all-reduce): a rank that sees the request posts the step it is at; once every rank has posted, each one
    stops at the furthest posted step + `margin`. Ranks are within `margin` steps of each other because the
    host waits for an all-reduce every --metric-step steps. One store look per step, no device synchronisation.
    Forked DataLoader workers inherit the handler and ignore the signal."""

    def __init__(self, ins, margin: int):
        self.ins, self.margin = ins, margin
        self.received, self.stop_at, self._announced, self._posted = None, None, False, False
        owner = os.getpid()

        def handler(signum, _frame):
            if os.getpid() == owner:
                self.received = self.received or signal.Signals(signum).name

        if threading.current_thread() is threading.main_thread():
            for signum in CHECKPOINT_SIGNALS:
                ins._signals[signum] = signal.signal(signum, handler)

    def due(self, step: int) -> bool:
        if self.stop_at is None:
            store = job_store()
            if store is None:
                self.stop_at = step if self.received else None
            else:
                self.stop_at = self._agree(store, step)
        return self.stop_at is not None and step >= self.stop_at

    def _agree(self, store, step: int) -> int | None:
        key = f"dlokit/checkpoint/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        world = self.ins.world_size
        if self.received and not self._announced:
            store.set(key, self.received)
            self._announced = True
        if not self._posted:
            if not store.check([key]):
                return None
            store.set(f"{key}/step{self.ins.rank}", str(step))
            store.add(f"{key}/posted", 1)
            self._posted = True
        if store.add(f"{key}/posted", 0) < world:
            return None
        self.received = self.received or store.get(key).decode()
        return max(int(store.get(f"{key}/step{rank}")) for rank in range(world)) + self.margin


def labels_spans(phase) -> bool:
    """Whether the script's phase() context manager opens a torch.profiler.record_function span (TP1.4): read
    from its code, since without a profiler running a span leaves no trace to observe."""
    code = getattr(getattr(phase, "__wrapped__", phase), "__code__", None)
    return code is not None and "record_function" in code.co_names
