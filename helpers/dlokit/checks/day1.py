"""Day 1 checks: the job ran (TP1.0), device placement (TP1.1), mixed precision and TF32 (TP1.2),
channels_last (TP1.3), the profiler (TP1.4).

Each check judges what the training script observed (run.json `observed`, summary.json, traces), and
reports a measured speed effect as numbers, with whether it agrees with the lesson. Effects that this
hardware cannot show (tensor cores on a CPU-only run) are "not applicable on this hardware".
"""
from __future__ import annotations

from pathlib import Path

from dlokit.analysis.profiler import profiler_steps, read_trace, span_names, trace_files
from dlokit.analysis.table import as_number

from .framework import FAILED, PASSED, check, failed, from_parts, not_applicable, part, passed, same_computation
from .records import (arms_by, compare_text, divergence, effect_part, hardware_words, load_completed, memory_key,
                      observed)

AMP_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
PHASE_LABELS = ("data", "forward", "backward", "optimizer")


@check("job completed")
def completed(job_ids):
    """The jobs ended well and wrote a complete run record (TP1.0 and any baseline)."""
    runs, problem = load_completed(job_ids)
    if problem:
        return problem
    details = [f"run {r.run_id}: {r.summary.get('steps')} steps, "
               f"{as_number(r.summary.get('throughput_train')) or float('nan'):.1f} img/s on "
               f"{observed(r).get('device', '?')}" for r in runs]
    return passed(*with_divergence(f"{len(runs)} run(s) completed", runs, details))


def with_divergence(message: str, runs, details) -> tuple[str, list]:
    """(message, details) naming the runs whose loss was above chance after the warm-up: the first in the message."""
    notes = [note for note in map(divergence, runs) if note]
    return message + (f", but {notes[0]}" if notes else ""), notes[1:] + list(details)


@check("TP1.1 model and batches on the device")
def on_device(job_ids):
    """Weights and batches were where the run was meant to compute.

    On a GPU run both must be on cuda. On a CPU-only run they are on the CPU whatever the script does;
    there the check reads `model_to_device` / `batch_to_device` (the script moved them with .to(device))
    when the record has them, and is not applicable when it does not.
    """
    runs, problem = load_completed(job_ids)
    if problem:
        return problem
    details, failures, unknown = [], [], []
    for run in runs:
        seen = observed(run)
        batch, weights, wanted = str(seen.get("device")), str(seen.get("model_device")), run.device_type
        moved = {what: seen.get(f"{what}_to_device") for what in ("model", "batch")}
        memory = run.summary.get("gpu_mem_peak_mb") or run.summary.get("host_rss_peak_mb")
        where = "GPU" if run.summary.get("gpu_mem_peak_mb") is not None else "host"
        held = as_number(run.summary.get("tensor_held_mib"))
        details.append(f"run {run.run_id} (batch {run.config.get('batch_size')}, device {wanted}): batch on "
                       f"{batch}, weights on {weights}, {where} peak {as_number(memory) or float('nan'):.0f} MiB"
                       + (f", tensors held by a step {held:.0f} MiB" if held is not None else ""))
        not_moved = [what for what, value in moved.items() if value is False]
        if not (batch.startswith(wanted) and weights.startswith(wanted)):
            failures.append(f"run {run.run_id} was to compute on {wanted} but the batch was on {batch} and the "
                            f"weights on {weights}: move both with .to(device) (TODO TP1.1)")
        elif not_moved:
            failures.append(f"run {run.run_id} never moved its {' and its '.join(not_moved)} with .to(device): "
                            f"unnoticed here, where the device is the {wanted}, but on a GPU the training would stay "
                            "on the CPU (TODO TP1.1)")
        elif batch != weights:
            failures.append(f"run {run.run_id}: batch on {batch} but weights on {weights}")
        elif wanted == "cpu" and None in moved.values():
            unknown.append(run.run_id)
    if failures:
        return failed(failures[0], failures[1:] + details)
    if any(r.on_gpu for r in runs):
        return passed("weights and batches were on the GPU", details)
    if unknown:
        return not_applicable(f"run(s) {', '.join(unknown)} computed on the CPU, the only device here: weights and "
                              "batches are on it whether or not the script moves them, and these records do not say "
                              "whether .to(device) ran (on a GPU node this check sees where they were)", details)
    return passed("the script moved the weights and every batch to the device with .to(device) (the CPU here; "
                  "on a GPU node they land on cuda)", details)


@check("TP1.2 mixed precision")
def amp(baseline_ids, amp_ids):
    """AMP runs computed their logits in 16 bits (fp16 with a GradScaler); on a GPU, faster than the fp32
    baseline as dlokit.lessons judges it (runs of one --amp mode, repeated, form one arm; so do the baseline's).
    On a CPU-only run the speed part is not applicable."""
    bases, problem = _baselines(baseline_ids)
    if problem:
        return problem
    runs, problem = load_completed(amp_ids)
    if problem:
        return problem
    base = bases[0]
    details, problems = [], []
    for run in runs:
        wanted = AMP_DTYPES.get(run.config.get("amp"))
        seen = observed(run)
        got = seen.get("amp_dtype")
        details.append(f"run {run.run_id} --amp {run.config.get('amp')}: logits in {got}, GradScaler "
                       f"{seen.get('grad_scaler')}; "
                       f"{compare_text('compute throughput', run, base, 'throughput_compute', 'img/s')}; "
                       f"{memory_text(run, base)}")
        if wanted is None:
            problems.append(f"run {run.run_id} was not started with --amp bf16 or --amp fp16")
        elif got != wanted:
            problems.append(f"run {run.run_id} asked for {wanted} but its logits came out in {got}: run the forward "
                            "pass and the loss inside torch.autocast(device.type, dtype=...) (TODO TP1.2)")
        elif wanted == "float16" and not seen.get("grad_scaler"):
            problems.append(f"run {run.run_id} computed in float16 without a GradScaler: small gradients flush to "
                            "zero; create torch.amp.GradScaler(enabled=args.amp == 'fp16') and use "
                            "scale/step/update (TODO TP1.2)")
    dtypes = sorted({str(observed(r).get("amp_dtype")) for r in runs})
    code = part("code", FAILED, problems[0]) if problems else part(
        "code", PASSED, f"the forward pass and the loss ran under autocast ({', '.join(dtypes)})"
        + (", float16 with a GradScaler" if "float16" in dtypes else ""))
    effect = same_computation("speed", "amp", bases, arms_by(runs, "amp")) or effect_part(
        "speed", "amp", bases, arms_by(runs, "amp"), on_gpu_run=any(r.on_gpu for r in runs),
        what="{label} against fp32", gpu_failure="the dtype is right but the step did not get faster "
        "than the fp32 baseline: is the batch big enough to keep the tensor cores busy?")
    return from_parts([code, effect], *with_divergence("16-bit compute observed" + (
        "" if effect is None or effect.status != PASSED else ", and the step got faster"), runs, details))


def memory_text(run, base) -> str:
    """The activations autograd saved for backward, counted from the tensors (the same every run: 16-bit ones take
    about half the bytes; autocast's 16-bit copies of the weights, which do not grow with the batch, apart), when
    both records have them; else the process's peak memory."""
    if all(as_number(r.summary.get("tensor_activations_mib")) is not None for r in (run, base)):
        copies = as_number(run.summary.get("tensor_weight_copies_mib")) or 0.0
        return (compare_text("activations saved for backward (tensors)", run, base, "tensor_activations_mib", "MiB")
                + (f", besides {copies:.3g} MiB of autocast's 16-bit weight copies" if copies else ""))
    return compare_text(memory_key(run), run, base, memory_key(run), "MiB")


def _baselines(baseline_ids):
    """The baseline's completed runs (one id, or the repeats of one command), or a failed result."""
    runs, problem = load_completed(baseline_ids)
    if problem:
        return runs, failed(f"baseline: {problem.message}", problem.details)
    return runs, None


@check("TF32 tensor cores")
def tf32(baseline_ids, tf32_ids):
    """fp32 runs with TF32 allowed (observed torch flags); on a GPU, faster than the strict fp32 baseline.
    TF32 exists only on NVIDIA tensor cores (Ampere and later): not applicable on a CPU-only run."""
    bases, problem = _baselines(baseline_ids)
    if problem:
        return problem
    base = bases[0]
    runs, problem = load_completed(tf32_ids)
    if problem:
        return problem
    details = [f"run {r.run_id} ({hardware_words(r)}): TF32 allowed {observed(r).get('tf32')}; "
               f"{compare_text('compute throughput', r, base, 'throughput_compute', 'img/s')}" for r in runs]
    gpu_runs = [r for r in runs if r.on_gpu]
    if not gpu_runs:
        return not_applicable("TF32 is a tensor-core format of NVIDIA GPUs (Ampere and later); a CPU computes fp32 "
                              "in fp32 whatever the flag says", details)
    problems = [f"run {r.run_id} was not started with --tf32" if not r.config.get("tf32") else
                f"run {r.run_id} asked for --tf32 but fp32 matmuls and convolutions were not allowed TF32 (see "
                "set_tf32 in tp_scripts/common/device_setup.py)" for r in gpu_runs if not observed(r).get("tf32")]
    code = part("code", FAILED, problems[0]) if problems else part(
        "code", PASSED, "TF32 was allowed for fp32 matmuls and convolutions")
    effect = effect_part("speed", "tf32", bases, {"tf32": gpu_runs}, on_gpu_run=True, what="TF32 against strict fp32")
    return from_parts([code, effect], "TF32 allowed" + (", and fp32 got faster" if effect and effect.status == PASSED
                                                         else ""), details)


@check("TP1.3 channels_last")
def channels_last(job_ids, baseline_id=None):
    """Weights and images in NHWC (observed); with a baseline (one id or the repeats of one command), the speed
    effect as dlokit.lessons judges it (GPU tensor cores; not applicable on a CPU-only run)."""
    runs, problem = load_completed(job_ids)
    if problem:
        return problem
    bases = _baselines(baseline_id)[0] if baseline_id is not None else []
    base = bases[0] if bases else None
    details, problems = [], []
    for run in runs:
        seen = observed(run)
        details.append(f"run {run.run_id}: NHWC images {seen.get('channels_last_input')}, NHWC weights "
                       f"{seen.get('channels_last_weights')}" + (
                           f"; {compare_text('compute throughput', run, base, 'throughput_compute', 'img/s')}"
                           if base else ""))
        if not run.config.get("channels_last"):
            problems.append(f"run {run.run_id} was not started with --channels-last")
        elif not seen.get("channels_last_weights"):
            problems.append(f"run {run.run_id}: the convolution weights are still NCHW; convert the model with "
                            "model.to(memory_format=torch.channels_last) (TODO TP1.3)")
        elif not seen.get("channels_last_input"):
            problems.append(f"run {run.run_id}: the images are still NCHW; convert each batch with "
                            "images.contiguous(memory_format=torch.channels_last) (TODO TP1.3)")
    code = part("code", FAILED, problems[0]) if problems else part(
        "code", PASSED, "weights and images were in channels_last (NHWC) layout")
    effect = same_computation("speed", "channels_last", bases, {"channels_last": runs}) or effect_part(
        "speed", "channels_last", bases, {"channels_last": runs}, on_gpu_run=any(r.on_gpu for r in runs),
        what="channels_last against NCHW")
    return from_parts([code, effect], "weights and images were in channels_last (NHWC) layout", details)


def run_traces(run) -> list[Path]:
    """The profiler traces a run wrote under its folder's profile/, oldest first."""
    folder = Path(run.path) / "profile"
    return trace_files(folder) if folder.is_dir() else []


@check("TP1.4 profiler trace")
def profiler(job_ids):
    """Each run left a readable trace file showing the labelled phases (record_function) of its steps."""
    runs, problem = load_completed(job_ids)
    if problem:
        return problem
    details, problems = [], []
    for run in runs:
        if not run.config.get("profile"):
            problems.append(f"run {run.run_id} was not started with --profile")
            continue
        files = run_traces(run)
        if not files:
            problems.append(f"run {run.run_id} wrote no trace under {run.path}/profile: create a torch.profiler."
                            "profile with a schedule and tensorboard_trace_handler, start it, and call "
                            "profiler.step() every step (TODO TP1.4)")
            continue
        try:
            events = read_trace(files[-1])
        except ValueError as error:
            problems.append(f"run {run.run_id}: {error}")
            continue
        names = span_names(events)
        labels = [label for label in PHASE_LABELS if label in names]
        steps = len(profiler_steps(events))
        details.append(f"run {run.run_id}: {len(files)} trace file(s), {steps} profiled step(s), "
                       f"labelled spans: {', '.join(labels) or 'none'}")
        if len(labels) < len(PHASE_LABELS):
            missing = [label for label in PHASE_LABELS if label not in labels]
            problems.append(f"run {run.run_id}: the trace has no span named {', '.join(missing)}: wrap each phase "
                            "in torch.profiler.record_function(name) (TODO TP1.4)")
    if problems:
        return failed(problems[0], problems[1:] + details)
    return passed("trace files written, with data/forward/backward/optimizer spans", details)


from .framework import INFO, NOT_APPLICABLE  # noqa: E402  (TP1.5's parts: measured, or nothing to judge)


@check("TP1.5 when the batch does not fit")
def fit_levers(measure_ids, scan_ids=()):
    """fit_levers.py's records: the accumulated step ran k micro-batches and is the large batch's maths where nothing
    depends on the batch (GroupNorm), not with BatchNorm; each checkpointed block ran twice; both levers hold less
    memory than the plain step (the interval says so); the scan under one limit (plain out of memory, the levers
    fit) and the step times are shown, not judged (the first is this machine's allocator, the second its noise)."""
    from dlokit.analysis import fit_levers as view

    from .records import load_last

    run, problem = load_last(measure_ids)
    if problem:
        return problem
    steps, k = view.lever_steps(run), int(run.config.get("micro_batches") or 1)
    batch = int(run.config.get("batch_size") or 0)
    parts = [_accumulated(steps, k, batch), _checkpointed(steps)]
    moved = view.ratios(run)
    for lever, ratio in moved.items():
        same = view.untreated(steps, lever)
        if same:
            parts.append(part(f"memory and time, {lever}", INFO, f"same computation as the plain step, no effect to "
                                                                 f"judge: {same}"))
            continue
        memory = ratio["memory"]
        said = f"{view.NAMES[lever]} holds {memory.text()} the plain step's tensors"
        parts.append(part(f"memory, {lever}", PASSED if view.verdict(memory, "falls") == "agrees" else FAILED,
                          said + ("" if view.verdict(memory, "falls") == "agrees" else
                                  f": not less ({view.verdict(memory, 'falls')}; TODO TP1.5)")))
        time = ratio["time"]
        parts.append(part(f"time, {lever}", INFO, f"{view.NAMES[lever]} steps take {time.text()} the plain step's: "
                                                 f"'time rises' {view.verdict(time, 'rises')}"))
    parts.append(_norm_lesson(view.norm_summary(view.norm_table(run))))
    if scan_ids:
        parts.append(_scan(view.scan_table(scan_ids), [lever for lever in moved if view.untreated(steps, lever)]))
    return from_parts(parts, "k micro-batches are the large batch's maths where nothing depends on the batch, "
                             "checkpointing recomputes each block, and both hold less memory",
                      details=[f"run {run.run_id}: batch {batch}, {k} micro-batches"])


def _accumulated(steps, k: int, batch: int):
    passes = steps.loc[steps["lever"] == "accumulate", "forward_images"].tolist()
    if not passes:
        return part("accumulation", NOT_APPLICABLE, "no accumulated step in this run")
    wanted = [batch // k] * k
    wrong = [p for p in passes if list(p) != wanted]
    if wrong:
        return part("accumulation", FAILED, f"the accumulated step ran forward passes of {list(wrong[0])} images, "
                                            f"not {k} micro-batches of {batch // k}: split the batch with "
                                            "images.chunk(k) in accumulate_step (TODO TP1.5)")
    return part("accumulation", PASSED, f"each step: {k} forward-backward passes of {batch // k} images, one "
                                        "optimizer step")


def _checkpointed(steps):
    rows = steps[steps["lever"] == "checkpoint"]
    if rows.empty:
        return part("checkpointing", NOT_APPLICABLE, "no checkpointed step in this run")
    ran, blocks = int(rows["block_forwards"].min()), int(rows["blocks"].max())
    if ran < 2 * blocks:
        return part("checkpointing", FAILED, f"the {blocks} checkpointed blocks ran forward {ran} times a step, "
                                             "once each: nothing was recomputed in backward, every activation was "
                                             "kept; run the block through torch.utils.checkpoint in "
                                             "Checkpointed.forward (TODO TP1.5)")
    return part("checkpointing", PASSED, f"each of the {blocks} blocks ran forward twice a step (forward, then "
                                         "recomputed in backward)")


def _norm_lesson(summary):
    from dlokit.analysis.fit_levers import ROUNDING

    found = {row.norm: row for row in summary.itertuples()}
    if "group" not in found or "batch" not in found:
        return part("BatchNorm lesson", NOT_APPLICABLE, "the run compared no BatchNorm and GroupNorm "
                                                        "(--norm-lesson batch,group)")
    group, batch = found["group"], found["batch"]
    if group.largest_apart > ROUNDING:
        return part("BatchNorm lesson", FAILED, f"with GroupNorm (nothing depends on the batch) the accumulated step "
                                                f"is {group.largest_apart:.2g} apart from the large batch (relative), "
                                                f"beyond fp32 rounding ({ROUNDING:g}): scale each micro-batch's loss "
                                                "by 1/k and step the optimizer once (TODO TP1.5)")
    if batch.smallest_apart <= ROUNDING:
        return part("BatchNorm lesson", FAILED, f"with BatchNorm the accumulated step is within rounding of the "
                                                f"large batch ({batch.smallest_apart:.2g}): its micro-batches were "
                                                "not normalised apart, was the batch split? (TODO TP1.5)")
    return part("BatchNorm lesson", PASSED, f"GroupNorm: accumulation is the large batch (at most "
                                            f"{group.largest_apart:.1g} apart, rounding); BatchNorm: "
                                            f"{batch.smallest_apart:.2g} to {batch.largest_apart:.2g} apart, each "
                                            "micro-batch normalised by its own statistics")


def _scan(table, untreated):
    from dlokit.analysis.fit_levers import describe

    outcome = dict(zip(table["lever"], table["outcome"]))
    shown = outcome.get("plain") == "out of memory" and all(
        outcome.get(lever) == "fits" for lever in ("accumulate", "checkpoint"))
    why = (f"the {' and '.join(untreated)} lever{'s' if len(untreated) > 1 else ''} ran the plain step (TODO TP1.5)"
           if untreated else
           "the allocator's own room beside the tensors varies with the machine")
    return part("scan", INFO, describe(table) + ("" if shown else f": not the demonstration this limit was chosen "
                                                 f"for ({why})"))
