"""Day 2 checks: the DataLoader (TP2.1), data parallelism (TP2.2), SyncBatchNorm and what it computes (TP2.3),
augmentation on the device (TP2.4); and what a DDP trace says about the collectives."""
from __future__ import annotations

import math

from .framework import (CHECKS, FAILED, NOT_APPLICABLE, NOT_APPLICABLE_PREFIX, PASSED, CheckResult, check, failed,
                        from_parts, not_applicable, part, passed, same_computation, show)
from .records import (compare_text, effect_part, hardware_words, ids, load, load_completed, observed,
                      why_not_finished)

BATCH_AUGMENTATIONS = ("mixup", "cutmix")  # --augment values that run on the device, per batch


@check("TP2.1 DataLoader tuned")
def dataloader(baseline_ids, tuned_ids):
    """The tuned run's DataLoader really used the options it was given (workers, prefetching, persistent
    workers, non_blocking copies; pinned batches on a GPU), and the time the loop waits for each batch dropped
    (dlokit.lessons judges it from the step lines; each side one id or the repeats of one command).

    On a CPU-only machine pinning is not applicable (PyTorch turns pin_memory off without an accelerator).
    """
    bases, problem = load_completed(baseline_ids)
    if problem:
        return failed(f"baseline: {problem.message}", problem.details)
    runs, problem = load_completed(tuned_ids)
    if problem:
        return problem
    run, base = runs[-1], bases[0]
    seen, config, gpu = observed(run), run.config, run.on_gpu
    details = [f"run {run.run_id}: workers {seen.get('loader_num_workers')}, pin_memory {seen.get('loader_pin_memory')}"
               f" (batch pinned: {seen.get('batch_pinned')}), prefetch {seen.get('loader_prefetch_factor')}, "
               f"persistent {seen.get('loader_persistent_workers')}, non_blocking {seen.get('non_blocking')}",
               compare_text("load time per step", run, base, "t_data", "s") + f" (baseline run {base.run_id})"]
    problems = []
    if not config.get("num_workers"):
        problems.append(f"run {run.run_id} was started with --num-workers 0: nothing to check")
    elif seen.get("loader_num_workers") != config["num_workers"]:
        problems.append(f"run {run.run_id} asked for {config['num_workers']} workers but its DataLoader used "
                        f"{seen.get('loader_num_workers')}: pass num_workers (and the other options) to DataLoader "
                        "(TODO TP2.1)")
    elif seen.get("loader_prefetch_factor") != config.get("prefetch_factor"):
        problems.append(f"run {run.run_id}: prefetch_factor {seen.get('loader_prefetch_factor')} in effect, "
                        f"{config.get('prefetch_factor')} asked (TODO TP2.1)")
    elif config.get("persistent_workers") and not seen.get("loader_persistent_workers"):
        problems.append(f"run {run.run_id}: --persistent-workers asked but the workers are not persistent (TODO TP2.1)")
    elif config.get("non_blocking") and not seen.get("non_blocking"):
        problems.append(f"run {run.run_id}: --non-blocking asked but the copies are blocking (TODO TP2.1)")
    elif config.get("pin_memory") and gpu and not seen.get("batch_pinned"):
        problems.append(f"run {run.run_id}: --pin-memory asked but the batches are not in pinned memory (TODO TP2.1)")
    code = part("code", FAILED, problems[0]) if problems else part(
        "code", PASSED, "the DataLoader was built with the options asked for")
    pinning = None
    if config.get("pin_memory") and not gpu:
        pinning = part("pinned memory", NOT_APPLICABLE,
                       "page-locked batches speed up copies to a GPU, and there is none: PyTorch leaves pin_memory "
                       f"off without an accelerator (observed: loader pin_memory {seen.get('loader_pin_memory')})")
    speed = same_computation("speed", "dataloader", bases, {"tuned": runs}) or effect_part(
        "speed", "dataloader", bases, {"tuned": runs}, on_gpu_run=gpu, what="the tuned loader against every option off",
        gpu_failure=(f"the options are in effect but the loop did not wait less for its batches than in run "
                     f"{base.run_id}; try more workers or a larger prefetch factor"))
    return from_parts([code, pinning, speed], "the loader options are in effect" + (
        " and the wait for each batch dropped" if speed is not None and speed.status == PASSED else ""), details)


@check("TP2.2 data parallelism")
def ddp(job_ids, world_size: int | None = None):
    """Every multi-process run: DDP-wrapped, sharded sampler, every rank finished, identical weights."""
    runs, problem = load_completed(job_ids)
    if problem:
        return problem
    details, problems = [], []
    sizes = sorted(r.world_size for r in runs)
    if world_size is not None and world_size not in sizes:
        problems.append(f"no run with {world_size} processes among these (world sizes: {sizes})")
    for run in runs:
        n = run.world_size
        seen = observed(run)
        summaries = run.summaries
        identical = [s.get("params_identical_across_ranks") for s in summaries]
        shard = seen.get("samples_per_rank_per_epoch")
        images = run.config.get("train_images")
        details.append(f"run {run.run_id}: {n} process(es), {len(summaries)} summary file(s), DDP "
                       f"{seen.get('ddp_wrapped')}, sampler {seen.get('sampler')} ({shard} of {images} images per "
                       f"rank), identical weights {all(identical) if identical else None}")
        if n == 1:
            continue
        if len(summaries) < n:
            problems.append(f"run {run.run_id}: only {len(summaries)} of {n} ranks finished")
        elif not seen.get("ddp_wrapped") or seen.get("ddp_world_size") != n:
            problems.append(f"run {run.run_id}: the model is not wrapped in DistributedDataParallel, so each rank "
                            "trains its own copy (TODO TP2.2)")
        elif not all(identical):
            problems.append(f"run {run.run_id}: the ranks ended with different weights: gradients were not averaged")
        elif images and shard and shard > math.ceil(images / n):
            problems.append(f"run {run.run_id}: each rank reads {shard} images per epoch, the whole set: use a "
                            "DistributedSampler so that each rank reads its own 1/N shard (TODO TP2.2)")
    if problems:
        return failed(problems[0], problems[1:] + details)
    if max(sizes) == 1:
        return not_applicable("only one process ran (one GPU, or one CPU process, on this node): data parallelism "
                              "needs two or more; ask for more with n_gpu", details)
    return passed(f"{max(sizes)} processes trained one model: DDP on, each rank on its own shard, weights identical "
                  "on every rank", details)


@check("TP2.3 SyncBatchNorm")
def sync_bn(job_ids):
    """GPU runs that asked for --sync-bn really had SyncBatchNorm layers. Not applicable on CPU-only runs:
    PyTorch's SyncBatchNorm synchronises only GPU (or XPU/HPU) tensors."""
    runs, problem = load_completed(job_ids)
    if problem:
        return problem
    details = [f"run {r.run_id} ({hardware_words(r)}): --sync-bn {r.config.get('sync_bn')}, SyncBatchNorm layers "
               f"{observed(r).get('sync_bn')}, {r.world_size} processes" for r in runs]
    judged = [r for r in runs if r.on_gpu and r.world_size > 1]
    if not judged:
        why = ("SyncBatchNorm exchanges batch statistics between GPUs; PyTorch refuses it on CPU tensors, so a "
               "CPU-only run keeps plain BatchNorm" if not any(r.on_gpu for r in runs) else
               "every run had a single process: there is no other rank to synchronise with")
        return not_applicable(why, details)
    bad = [r.run_id for r in judged if r.config.get("sync_bn") and not observed(r).get("sync_bn")]
    if bad:
        return failed(f"run(s) {', '.join(bad)} asked for --sync-bn but kept plain BatchNorm: convert with "
                      "nn.SyncBatchNorm.convert_sync_batchnorm before wrapping in DDP", details)
    from dlokit.analysis.batchnorm import running_stats_table

    apart = running_stats_table([r.run_id for r in judged], judged[0].path.parent).groupby("run_id")["from_rank0"].max()
    details += [f"run {r.run_id} ({'SyncBatchNorm' if r.config.get('sync_bn') else 'BatchNorm'}): the ranks' running "
                f"statistics lie {apart[r.run_id]:.1e} apart (relative)" for r in judged if r.run_id in apart]
    parted = [r.run_id for r in judged if r.config.get("sync_bn") and apart.get(r.run_id, 0.0) > SYNCED_BUFFERS_APART]
    if parted:
        return failed(f"under SyncBatchNorm the ranks of run(s) {', '.join(parted)} kept different running statistics "
                      f"(up to {max(apart[i] for i in parted):.1e} apart): the layers did not synchronise", details)
    words = {sync: [f"{apart[r.run_id]:.1e}" for r in judged if bool(r.config.get("sync_bn")) == sync
                    and r.run_id in apart] for sync in (True, False)}
    said = ", ".join(f"{'SyncBatchNorm' if sync else 'plain BatchNorm'}: the ranks' running statistics "
                     f"{' and '.join(values)} apart" for sync, values in words.items() if values)
    return passed("BatchNorm layers are what each run asked for" + (f"; {said}" if said else ""), details)


SYNCED_BUFFERS_APART = 1e-5  # SyncBatchNorm: every rank computes the same global statistics; BatchNorm: ~0.1 apart


GLOBAL_STATISTICS_TOLERANCE = 1e-4  # float32 sums of a few thousand values: ~1e-7 apart; a rank's own batch: ~0.5


@check("TP2.3 what SyncBatchNorm computes")
def bn_statistics(job_id):
    """bn_statistics.py on several ranks: every rank's synchronised mean and variance are the whole batch's (rank 0
    computes those in one piece), while its own batch's differ from them."""
    run, problem = load(job_id)
    if problem:
        return failed(problem)
    apart = run.summary.get("largest_difference") or {}
    synced, own = apart.get("synced_vs_whole"), apart.get("local_vs_whole")
    details = [f"run {run.run_id}: {run.world_size} ranks; largest difference from the whole batch's statistics: "
               f"synchronised {synced}, each rank's own {own}"]
    if run.world_size < 2:
        return not_applicable("one process: its batch is the global batch, there is nothing to synchronise; run it "
                              "on 2 or more", details)
    if synced is None or own is None:
        return failed(f"run {run.run_id} recorded no comparison with the whole batch (rank 0's summary)", details)
    if synced > GLOBAL_STATISTICS_TOLERANCE:
        return failed(f"the synchronised statistics are {synced:.2g} away from the global batch's (each rank's own: "
                      f"{own:.2g}): add up every rank's counts and sums with one all-reduce (TODO TP2.3)", details)
    return passed(f"every rank normalises with the global batch's statistics ({synced:.1e} apart), not its own "
                  f"({own:.2g} apart): what SyncBatchNorm's extra collective buys", details)


def _asked_augmentations(run) -> list[str]:
    value = run.config.get("augment") or "none"
    names = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return [str(n).strip().lower() for n in names if str(n).strip().lower() not in ("", "none")]


@check("TP2.4 augmentation on the device")
def augmentation(job_ids, baseline_id=None):
    """Each run did the augmentation it was started with: mixup/cutmix mixed whole batches on the
    training device (observed `augment_on_device`: soft targets came out), RandAugment was in the
    per-image transform (observed `augment`). At least one run must use mixup or cutmix. With a
    baseline, the throughput against it (not applicable on a CPU-only run, where the device and the
    loader workers share the same cores)."""
    runs, problem = load_completed(job_ids)
    if problem:
        return problem
    bases = load_completed(baseline_id)[0] if baseline_id is not None else []
    base = bases[0] if bases else None
    details, problems = [], []
    for run in runs:
        seen, asked = observed(run), _asked_augmentations(run)
        details.append(f"run {run.run_id} ({hardware_words(run)}): --augment {','.join(asked) or 'none'}; observed "
                       f"augmentations {seen.get('augment')}, batch mixed on the device {seen.get('augment_on_device')}"
                       f", RandAugment in loader workers {seen.get('randaugment_in_workers')}" + (
                           f"; {compare_text('throughput', run, base, 'throughput_train', 'img/s')}" if base else ""))
        done = seen.get("augment")
        done = [str(d) for d in done] if isinstance(done, (list, tuple)) else []
        on_batches = [a for a in asked if a in BATCH_AUGMENTATIONS]
        if "augment" not in seen and "augment_on_device" not in seen:
            problems.append(f"run {run.run_id}: its record says nothing about augmentation (made by an older "
                            "train_classifier.py?): submit it again with the current script")
        elif not asked:
            problems.append(f"run {run.run_id} was started without --augment: it has no augmentation to check")
        elif on_batches and not seen.get("augment_on_device"):
            problems.append(f"run {run.run_id} asked for {', '.join(on_batches)} but its batches were not mixed: "
                            "apply the mixer to the whole batch once it is on the device, and compute the loss on "
                            "the soft targets it returns (TODO TP2.4)")
        elif "randaugment" in asked and "randaugment" not in done:
            problems.append(f"run {run.run_id} asked for randaugment but the images were not transformed by it")
    if not problems and not any(set(_asked_augmentations(r)) & set(BATCH_AUGMENTATIONS) for r in runs):
        problems.append("none of these runs was started with --augment mixup or cutmix: the on-device part of "
                        "TP2.4 has nothing to show")
    code = part("code", FAILED, problems[0]) if problems else part(
        "code", PASSED, "each run did the augmentation it asked for; mixup/cutmix mixed whole batches on the "
        "training device")
    # the lesson compares batched mixing on the device with per-image RandAugment in the workers
    per_image = [r for r in runs if "randaugment" in _asked_augmentations(r)] or bases
    arms = {a: [r for r in runs if a in _asked_augmentations(r)] for a in BATCH_AUGMENTATIONS}
    speed = effect_part("speed", "augment_on_device", per_image, {a: rs for a, rs in arms.items() if rs},
                        on_gpu_run=any(r.on_gpu for r in runs),
                        what="{label} against " + ("RandAugment" if per_image is not bases else "no augmentation"))
    return from_parts([code, speed], "each run did the augmentation it asked for; mixup/cutmix mixed whole batches "
                      "on the training device", details)


UNUSED_ERROR = "Expected to have finished reduction in the prior iteration"  # PyTorch's words, DDP's reducer


@check("TP2.3 unused parameters")
def unused_parameters(without_id, with_id):
    """--layer-drop skips whole residual blocks for a batch on N ranks: without --find-unused-parameters the job
    fails with PyTorch's reducer error (the skipped blocks' gradients never came); with it, the same training
    completes, and its record says blocks were skipped and DDP looked for unused parameters."""
    from dlokit.analysis import load_run
    from dlokit.submission.profiles import current_profile

    runs = current_profile().runs
    without, fixed = load_run(str(ids(without_id)[-1]), runs), load_run(str(ids(with_id)[-1]), runs)
    error = without.error or ""
    details = [f"run {without.run_id} (no flag): {without.state}" + (f": {_first_sentence(error)}" if error else ""),
               f"run {fixed.run_id} (--find-unused-parameters): {fixed.state}, blocks skipped "
               f"{fixed.summary.get('layer_drop_skipped')}, DDP find_unused "
               f"{observed(fixed).get('ddp_find_unused_parameters')}"]
    for run in (without, fixed):
        if run.state == "missing" or run.state.startswith("unreadable"):
            return failed(why_not_finished(run.run_id, run), details)
    if without.world_size < 2 or fixed.world_size < 2:
        return not_applicable("one process: DDP has no other rank to wait for; run them on 2 or more", details)
    if without.state == "completed":
        if not observed(without).get("ddp_wrapped"):
            return failed(f"run {without.run_id} trained without DDP, so nothing waited for the skipped blocks: "
                          "wrap the model in DistributedDataParallel (TODO TP2.2)", details)
        return failed(f"run {without.run_id} completed without the flag: were blocks skipped "
                      f"({without.summary.get('layer_drop_skipped')})? Raise --layer-drop", details)
    if UNUSED_ERROR not in error:
        return failed(f"run {without.run_id} ended {without.state}, but not with DDP's unused-parameter error", details)
    if fixed.state != "completed":
        return failed(f"run {fixed.run_id} with --find-unused-parameters did not complete: "
                      f"{why_not_finished(fixed.run_id, fixed)}", details)
    if not observed(fixed).get("ddp_find_unused_parameters") or not fixed.summary.get("layer_drop_skipped"):
        return failed(f"run {fixed.run_id} completed, but its record shows no unused parameter to find (DDP "
                      "find_unused_parameters off, or no block skipped)", details)
    return passed(f"without the flag DDP stopped at the step after a skipped block ({UNUSED_ERROR}); with "
                  f"--find-unused-parameters the same training completed, {fixed.summary['layer_drop_skipped']} "
                  "blocks skipped on rank 0", details)


def sync_bn_or_why(job_ids, had_gpu: bool):
    """sync_bn of TP2.3's BatchNorm and SyncBatchNorm trainings, or, where none ran, why: its 'not applicable'."""
    if job_ids:
        return sync_bn(job_ids)
    why = ("one GPU: SyncBatchNorm synchronises the statistics of several ranks" if had_gpu else
           "PyTorch runs SyncBatchNorm on GPUs only, and these jobs had none")
    return show(CheckResult(CHECKS["sync_bn"], NOT_APPLICABLE, NOT_APPLICABLE_PREFIX + why))


def _first_sentence(text: str, most: int = 240) -> str:
    """An error message's first sentence (PyTorch's reducer error runs to a page), at most `most` characters."""
    head = text.split(". ", 1)[0].rstrip(".")
    return head + "." if len(head) <= most else head[:most - 1] + "…"
