"""compile_bench.py's timing (TP3.3): each variant built, called, timed and compared with eager, one line each.

Per variant, the first calls (tracing, compiling, TorchScript's profiling runs) are timed apart from the steady
state (the median of the timed calls after warm-up). One `compile_result` line per part and variant goes to
metrics.jsonl, and the whole table to summary.json `results` (docs/run-records.md). A variant that fails is recorded
with why, and the others still run; a variant the machine cannot run (no compiler, CUDA graphs on a CPU) is skipped,
with why.
"""
from __future__ import annotations

import ctypes
import resource
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch._dynamo.utils import counters

from .compile_options import applying_to, compiles
from .compile_support import CUDA_GRAPH_MODES, use_fresh_cache

RTOL, ATOL = 1e-3, 1e-5  # "agrees with eager": |variant - eager| <= ATOL + RTOL * |eager|, element by element
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def steady_host_allocator() -> bool:
    """Keep freed host memory in the process, whatever was freed before. glibc's mmap threshold moves with what the
    process has freed: the function part's 16 MiB tensors (4096 x 1024, its size then) were mapped afresh on every call in some runs and
    reused in others, and eager's call took 31 or 75 ms from one course run to the next (512 page faults per call
    against none, 2026-11-28). Fixed thresholds: every run times the same allocator. False where it is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, 32 << 20) and libc.mallopt(M_TRIM_THRESHOLD, 1 << 30))


@dataclass
class Bench:
    """What every part needs: the options, the variants asked for, where they run, the record, and the student's
    make_variant (the script hands it over: this package imports no student file)."""
    args: object
    variants: list
    device: torch.device
    world_size: int
    compiler_problem: str | None
    record: object                # dlokit.in_job.runrecord.RunRecorder
    say: Callable                 # print on rank 0, nothing on the others
    make_variant: Callable        # (variant, fn, example) -> the callable that variant runs

    def __post_init__(self):
        self.steady_allocator = steady_host_allocator()

    def measure(self, build, *, items: int, item_name: str):
        """Build the variant (timed: tracing, scripting, wrapping), then call it warm-up + timed times:
        (result fields, what the calls returned). `build()` returns (fn, call) or (fn, call, compared): then
        `compared()`, read after the calls, is what is compared with the reference instead."""
        torch._dynamo.reset()  # each compile variant compiles from nothing (no graph kept from the previous one)
        if self.args.fresh_cache:  # ... and no kernel either: a cold cache for each, so their compile times compare
            use_fresh_cache()
        counters.clear()
        started = time.perf_counter()
        fn, call, *compared = build()
        t_build = time.perf_counter() - started
        seconds, outputs, faults = time_calls(call, self.args.warmup_steps, self.args.steps, self.device)
        if compared:  # what to compare is read after the timed calls (e.g. the parameters the steps ended with)
            outputs = compared[0]()
        warmup, timed = seconds[:self.args.warmup_steps], seconds[self.args.warmup_steps:]
        t_step = statistics.median(timed)
        fields = {"status": "ok", "reason": None, "t_build": t_build, "t_first": seconds[0], "t_warmup": sum(warmup),
                  # what the first calls cost beyond the steady state: the price of tracing or compiling
                  "t_compile": max(0.0, t_build + sum(warmup) - len(warmup) * t_step),
                  "t_step": t_step, "t_step_min": min(timed), "t_step_max": max(timed),
                  "warmup_steps": len(warmup), "timed_steps": len(timed),
                  # host memory mapped afresh during a call: what made eager's calls bimodal before steady_host_allocator
                  "page_faults_per_call": statistics.median(faults[self.args.warmup_steps:]),
                  "steady_allocator": self.steady_allocator, "step_times": [round(s, 6) for s in seconds],
                  "items": item_name, "items_per_s": items / t_step, "compiled": is_compiled(fn),
                  "cache": "fresh" if self.args.fresh_cache else "shared (may hold kernels compiled before)",
                  **dynamo_counts()}
        return fields, outputs

    def run(self, part: str, build_for, *, items, item_name, extra: dict,
            compare_first: int | None = None) -> list[dict]:
        """Every variant that applies to one part, the reference (eager) first: measured, compared with the reference,
        one compile_result line each. `build_for(variant)` prepares what is not timed and returns the builder."""
        variants = applying_to(part, self.variants)
        reference_variant = next((v for v in ("eager", "numpy") if v in variants), None)
        variants = sorted(variants, key=lambda v: v != reference_variant)
        results, reference, reference_step = [], None, None
        for variant in variants:
            line = {"part": part, "variant": variant, **extra}
            reason = skip_reason(variant, self.device, self.compiler_problem)
            if reason:
                line.update(status="skipped", reason=reason)
            else:
                try:
                    fields, outputs = self.measure(build_for(variant), items=items, item_name=item_name)
                except Exception as error:  # recorded: the other variants still run
                    line.update(status="failed", reason=f"{type(error).__name__}: {str(error).strip()[:500]}")
                else:
                    if variant == reference_variant:
                        reference, reference_step = outputs, fields["t_step"]
                    line.update(fields, **compare(outputs, reference, compare_first), reference=reference_variant,
                                speedup=reference_step / fields["t_step"] if reference_step else None)
            self.record.log("compile_result", **line)
            results.append(line)
            self.say(describe(line))
        return results


def is_compiled(fn) -> bool:
    """The object torch.compile returns: an OptimizedModule for a module, a wrapper for a function."""
    return hasattr(fn, "_orig_mod") or hasattr(fn, "_torchdynamo_orig_callable")


def skip_reason(variant: str, device, compiler_problem) -> str | None:
    if compiles(variant) and compiler_problem:
        return compiler_problem
    if variant.removeprefix("compile-") in CUDA_GRAPH_MODES and device.type != "cuda":
        return f"{variant}: CUDA graphs replay GPU work, there is none on the CPU"
    return None


def time_calls(call, warmup: int, steps: int, device) -> tuple[list[float], list, list[int]]:
    """(seconds of each call, what each returned, the process's minor page faults during each); every call ends
    once the device has finished."""
    seconds, outputs, faults = [], [], []
    for _ in range(warmup + steps):
        faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        started = time.perf_counter()
        out = call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - started)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faulted)
        outputs.append(out)
    return seconds, outputs, faults


def dynamo_counts() -> dict:
    """Graphs Dynamo compiled, graph breaks, and Inductor's on-disk cache hits/misses so far."""
    return {"graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values()),
            "cache_hits": counters["inductor"]["fxgraph_cache_hit"],
            "cache_misses": counters["inductor"]["fxgraph_cache_miss"]}


def compare(outputs, reference, first: int | None) -> dict:
    """Largest difference from the reference's outputs (losses step by step, or the function's output) over the
    first `first` calls (None: all), which decide `agrees`; and over all calls."""
    if reference is None:
        return {"max_abs_diff": None, "agrees": None, "compared_calls": 0, "max_abs_diff_all_calls": None}
    a, b = np.asarray(outputs, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    first = len(a) if first is None else min(first, len(a))
    return {"max_abs_diff": float(np.max(np.abs(a[:first] - b[:first]))), "compared_calls": first,
            "agrees": bool(np.allclose(a[:first], b[:first], rtol=RTOL, atol=ATOL)),
            "max_abs_diff_all_calls": float(np.max(np.abs(a - b)))}


def describe(line: dict) -> str:
    head = f"{line['part']:8s} {line['variant']:36s}"
    if line["status"] != "ok":
        return f"{head} {line['status']}: {line['reason']}"
    diff = "" if line["max_abs_diff"] is None else f" | max |Δ| vs {line['reference']} {line['max_abs_diff']:.2e}"
    return (f"{head} compile {line['t_compile']:7.2f} s | step {line['t_step'] * 1e3:8.2f} ms | "
            f"{line['items_per_s']:,.0f} {line['items']}/s{diff} | compiled {line['compiled']} graphs {line['graphs']}")
