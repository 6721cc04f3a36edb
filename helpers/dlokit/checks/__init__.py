"""Check cells: did the student's script really do what the TP asks? Answered from the run records.

    import dlokit.checks as checks
    checks.amp(baseline_id, [bf16_id])   # ✅, ❌ or ➖ (not applicable on this hardware), with why

Every check reads what the training script *observed* while it ran (run.json "observed" block,
summary.json, profiler traces), not the options it was given: an option the script ignores is caught.
A check never raises: a missing, failed or still running job gives ❌ and says what to do. A check
or part of one that this hardware cannot show (tensor-core speed-ups on a CPU) is "not applicable".

Layout: framework.py (results, display, @check, scoreboard), records.py (reading runs), day1.py,
day2.py (the checks of each day). Trace files are read by dlokit.analysis.profiler.
"""
from dlokit.analysis.profiler import TYPE_BYTES, collectives_in_trace

from .day1 import (AMP_DTYPES, PHASE_LABELS, amp, channels_last, completed, fit_levers, on_device, profiler, run_traces,
                   tf32)
from .day2 import augmentation, bn_statistics, dataloader, ddp, sync_bn, sync_bn_or_why, unused_parameters
from .day3 import compilation, hpo, lr_finder, optimizers, pruners, samplers, storage
from .glance import day_jobs
from .day4 import accelerate_zero, bus_bandwidth, context_parallel, deepspeed_zero, fsdp_compile, fsdp_sharding, layout_scan, loss_match, oom_then_fit, pipeline_bubble, planner_pick, sharded_memory, tensor_parallel
from .race import race
from .framework import (CHECKS, FAILED, INFO, MARKS, MIME, NOT_APPLICABLE, NOT_APPLICABLE_PREFIX, PASSED, RESULTS,
                        STATUSES, CheckResult, Part, results_in_notebook, scoreboard, show)
from .records import observed

__all__ = [
    "AMP_DTYPES", "CHECKS", "CheckResult", "FAILED", "INFO", "MARKS", "MIME", "NOT_APPLICABLE",
    "NOT_APPLICABLE_PREFIX", "PASSED", "PHASE_LABELS", "Part", "RESULTS", "STATUSES", "TYPE_BYTES", "amp",
    "augmentation", "channels_last", "day_jobs", "compilation", "hpo", "lr_finder", "optimizers", "pruners", "samplers", "storage", "collectives_in_trace", "completed", "dataloader", "ddp", "observed",
    "on_device", "profiler", "race", "accelerate_zero", "bus_bandwidth", "context_parallel", "deepspeed_zero", "fsdp_compile", "fsdp_sharding", "layout_scan", "loss_match", "oom_then_fit", "pipeline_bubble", "planner_pick",
    "sharded_memory", "tensor_parallel", "results_in_notebook", "run_traces", "scoreboard", "show", "sync_bn", "sync_bn_or_why", "bn_statistics", "unused_parameters", "tf32",
]
