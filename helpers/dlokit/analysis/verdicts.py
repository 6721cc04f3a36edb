"""The verdicts (dlokit.lessons) a day's cells show where their comparison ran, one call each.

Each returns what the cell shows, in order (`display(*verdicts.sync_bn_views(...))`), nothing where the comparison
did not run. Not imported by dlokit.analysis itself: dlokit.lessons reads dlokit.analysis.stats, and this module
reads dlokit.lessons (`from dlokit.analysis import verdicts`)."""
from __future__ import annotations

from dlokit import lessons
from dlokit.analysis.batchnorm import running_stats_table
from dlokit.analysis.compare import compare_runs
from dlokit.analysis.table import runs_table


class Said(str):
    """A sentence shown as it is (display() of a plain str would show its quotes)."""

    def _repr_pretty_(self, printer, cycle):
        printer.text(str(self))


def precision_verdicts(arms: dict, on_gpu: bool) -> dict:
    """TP1.2: each precision's verdict against fp32 ({precision: Verdict}; TF32 has a lesson of its own)."""
    return {name: lessons.verdict("tf32" if name == "tf32" else "amp", arms["fp32"], jobs, on_gpu,
                                  f"{name} against fp32") for name, jobs in arms.items() if name != "fp32"}


def scaling_views(scaling, by_size: dict, on_gpu: bool) -> list:
    """TP2.2: the scaling table and the most ranks against one (scaling: scaling_summary's table, None where the
    runs made none)."""
    if scaling is None:
        return []
    last = scaling.iloc[-1]
    return [scaling.round(3), lessons.verdict("ddp", by_size[min(by_size)], by_size[max(by_size)], on_gpu,
                           f"{last['world_size']} ranks against 1 (efficiency {100 * last['efficiency']:.0f} % "
                           f"[{100 * last['efficiency_low']:.0f}–{100 * last['efficiency_high']:.0f}])")]


def scaling_decided(job_ids) -> bool:
    """TP2.2's rounds (day.submit_until_decided): does the most ranks against one decide (agrees or contradicts)?"""
    from dlokit.analysis.run import ran_on_gpu
    from dlokit.analysis.scaling import ScalingError, runs_by_size, scaling_table
    from dlokit.analysis.stats import WITHIN_NOISE

    try:
        scaling_table(job_ids)
    except ScalingError:  # e.g. ranks without DDP (TODO TP2.2): no speed-up to judge, however many rounds
        return True
    by_size = runs_by_size(job_ids)
    if len(by_size) < 2:
        return True  # nothing to compare: more rounds would not decide anything
    judged = lessons.judge("ddp", by_size[min(by_size)], by_size[max(by_size)], ran_on_gpu(job_ids[0]), "")
    return judged.outcome != WITHIN_NOISE


def switch_verdicts(arms: dict, on_gpu: bool, metric_steps: int) -> list:
    """TP2.3's switches against the baseline: --metric-step (where it ran: a GPU), find_unused_parameters."""
    metric_step = (lessons.verdict("metric_step", arms["baseline"], arms["metric_step"], on_gpu,
                                   f"--metric-step {metric_steps} against every step") if "metric_step" in arms else
                   Said("--metric-step: not applicable on this hardware: " + lessons.LESSONS["metric_step"].gpu_only))
    return [metric_step, lessons.verdict("find_unused", arms["baseline"], arms["find_unused"], on_gpu,
                                         "find_unused_parameters against the baseline")]


def sync_bn_views(bn_jobs: list, plain_jobs: list, on_gpu: bool) -> list:
    """TP2.3: BatchNorm against SyncBatchNorm (speed, accuracy, the verdict, what each rank kept) where they ran;
    else what each rank of `plain_jobs` (a multi-rank training, plain BatchNorm) kept apart."""
    if bn_jobs:
        return [runs_table(bn_jobs)[["run_id", "state", "t_forward", "t_backward", "throughput_train", "val_acc",
                                     "overlapped_by"]],
                compare_runs(bn_jobs, metric="throughput_train", baseline=bn_jobs[0]),
                lessons.verdict("sync_bn", bn_jobs[0], bn_jobs[1], on_gpu, "SyncBatchNorm against BatchNorm"),
                running_stats_table(bn_jobs)]  # equal under SyncBatchNorm only
    apart = running_stats_table(plain_jobs)
    said = (f"Without SyncBatchNorm each rank's BatchNorm kept running statistics of its own batches: up to "
            f"{apart['from_rank0'].max():.2f} of rank 0's values apart (the first layer, its first channels). "
            "SyncBatchNorm would keep them equal.")
    return [apart, *([Said(said)] if len(apart) > 1 else [])]


def augment_verdicts(arms: dict, on_gpu: bool) -> list:
    """TP2.4: mixup on the device against RandAugment in the loader's workers, where both ran (a GPU)."""
    if "RandAugment (CPU workers)" not in arms:
        return []
    return [lessons.verdict("augment_on_device", arms["RandAugment (CPU workers)"], arms["mixup (device)"], on_gpu,
                           "mixup on the device against RandAugment in the workers")]
