"""What each lesson of the course expects, and the record facts that show its treatment happened.

LESSONS: per effect, the expectation, the public figure, why only a GPU shows it, the metric, and `evidence` (the
facts of a run record that differ when the treatment happened: the logits' dtype, the memory format, the device,
the DataLoader workers in use, whether a variant compiled). untreated() says when two arms' records show the same
facts, i.e. the arms computed the same thing. dlokit.lessons turns a measured ratio into a verdict; compare_runs
and the checks ask untreated() first, so no bar, verdict or ✅ shows an effect the records say did not happen.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lesson:
    expectation: str          # what the effect should do, in words
    expects_gain: bool        # the lesson predicts ratio > 1; False: ratio < 1 (a cost, or less waiting)
    public: str               # a public GPU figure and its source
    gpu_only: str = ""        # why only a GPU can show it: a CPU-only run is "not applicable"
    metric: str = "throughput_train"
    measured: str = "throughput"  # the metric in words
    evidence: tuple = ()      # record facts (a run's `observed`, a row's columns) that differ when the treatment happened
    shows: str = ""           # those facts in words, formatted with them
    asked: str = ""           # the option (a run's config, a row's column) that asks for the treatment
    todo: str = ""            # where the student makes it happen


LESSONS = {
    "gpu_vs_cpu": Lesson(
        "a GPU trains many times faster than the CPU", True,
        "ResNet-50, 1×A100-80GB, AMP: 2,470 img/s (NVIDIA DeepLearningExamples); the same model on this "
        "project's 2-core CPU: ≈5.5 img/s at 224 px",
        "without a GPU both runs computed on the CPU: there is no GPU run to compare",
        evidence=("device", "model_device"), shows="batches on {device}, weights on {model_device}",
        asked="device_type", todo="TODO TP1.1"),
    "amp": Lesson(
        "16-bit autocast speeds training up on tensor cores and halves activation memory", True,
        "ResNet-50, 1×A100-80GB: 2,470 img/s with AMP vs 938 img/s in TF32 (NVIDIA DeepLearningExamples)",
        "the speed-up it teaches comes from tensor cores, which only GPUs have; what bf16 autocast does on a CPU "
        "is another effect, set by the CPU's bf16 instructions (AVX512-BF16, AMX) or their absence",
        metric="throughput_compute", measured="compute throughput",
        evidence=("amp_dtype", "tf32"), shows="logits in {amp_dtype}", asked="amp", todo="TODO TP1.2"),
    "channels_last": Lesson(
        "NHWC convolutions avoid layout conversions around tensor-core kernels", True,
        "ResNet-50 on A100, timm with AMP + channels_last: ≈2,600 img/s (pytorch-image-models issue 1491), "
        "vs 2,470 img/s AMP in NVIDIA's reference",
        "the conversions it removes are those of cuDNN's tensor-core kernels; CPU convolutions have no such "
        "kernels to feed", metric="throughput_compute", measured="compute throughput",
        evidence=("channels_last_weights", "channels_last_input"),
        shows="NHWC weights {channels_last_weights}, NHWC images {channels_last_input}", asked="channels_last",
        todo="TODO TP1.3"),
    "tf32": Lesson(
        "TF32 tensor cores speed up fp32 matrix products and convolutions", True,
        "A100: 156 TFLOPS in TF32 vs 19.5 TFLOPS in strict fp32 (NVIDIA's A100 datasheet)",
        "TF32 is a tensor-core format of NVIDIA GPUs (Ampere and later); a CPU computes fp32 in fp32",
        metric="throughput_compute", measured="compute throughput",
        evidence=("tf32",), shows="TF32 allowed {tf32}", asked="tf32", todo="set_tf32 in common/device_setup.py"),
    "dataloader": Lesson(
        "worker processes and prefetching hide the data loading behind the computation: the training loop "
        "waits less for each batch", False,
        "DLO-JZ, ResNet-152 batch 512 on 1×A100: 226 img/s with every DataLoader option off, 1,164 img/s tuned",
        metric="t_data", measured="time waiting for the batch",
        evidence=("loader_num_workers", "batch_pinned"),
        shows="{loader_num_workers} DataLoader workers, pinned batches {batch_pinned}", asked="num_workers",
        todo="TODO TP2.1"),
    "ddp": Lesson(
        "N data-parallel ranks train close to N times faster (weak scaling)", True,
        "DLO-JZ, ResNet-152: 4,455 img/s on 4×A100 (≈96 % efficiency), 26.2k img/s on 32×A100 (≈70 %)"),
    "sync_bn": Lesson(
        "SyncBatchNorm costs time (a collective per BatchNorm layer) for steadier statistics", False,
        "DLO-JZ, ResNet-152 on 4 GPUs: 3,471 img/s with SyncBatchNorm vs 4,455 img/s without",
        "PyTorch runs SyncBatchNorm on GPUs only"),
    "metric_step": Lesson(
        "synchronising the metrics less often removes a host-device stall per step", True,
        "no public figure: the gain is the stall removed, largest for short GPU steps",
        "the stall it removes is the host waiting for the GPU's queue of kernels; a CPU computes in the "
        "host's own thread, with no queue to drain"),
    "find_unused": Lesson(
        "find_unused_parameters costs a graph traversal per step", False,
        "no public figure: the cost grows with the number of autograd nodes"),
    "compile": Lesson(
        "after a one-off compile time, compiled code runs each step faster (fused kernels, fewer memory trips)", True,
        "Llama-3.1-8B on 8×H100 with torchtitan: 5,762 tokens/s/GPU eager, 6,667 with torch.compile",
        metric="t_step", measured="speed-up (eager's step time over the compiled one's)",
        evidence=("compiled",), shows="compiled {compiled}, compile time {t_compile:.1f} s", asked="variant",
        todo="TODO TP3.3 in compile_bench.py"),
    "fused_optimizer": Lesson(
        "an optimizer step fused per tensor (Adam(fused=True), PyTorch's own) beats the for-each implementation, "
        "which reads and writes every parameter once per operation", True,
        "no single public figure: PyTorch's optimizer docs rank the implementations fused, then foreach, then the "
        "for-loop", metric="t_step", measured="speed-up (the for-each step time over the fused one's)"),
    "augment_on_device": Lesson(
        "a training with batched mixup on the device runs faster than one with per-image RandAugment in the "
        "loader workers", True,
        "no single public figure: per-image RandAugment cost grows with image size and needs CPU cores per GPU",
        "the device that mixes the batches is the GPU, beside the CPU cores the workers use; on a CPU-only run "
        "both compete for the same cores (the per-image and per-batch costs are measured below instead)"),
    "augment_cost": Lesson(
        "batched mixup/cutmix costs far less per image than per-image RandAugment", True,
        "no single public figure: per-image RandAugment cost grows with image size and needs CPU cores per GPU",
        measured="cost per image (RandAugment / mixup)"),
}


def untreated(effects, base, other) -> str:
    """'' unless the records of both arms (lists of Runs, or of dicts such as compile_table rows) show the same
    facts for every lesson of `effects` (a name or several): then what they show, and when the other arm asked for
    the treatment and its records show it did not happen, the TODO that makes it happen. A fact missing from a
    record proves nothing: ''."""
    said = []
    for effect in [effects] if isinstance(effects, str) else effects:
        lesson = LESSONS[effect]
        facts = [_facts(item, lesson) for item in (*base, *other)]
        if not lesson.evidence or not facts or None in facts or len(set(facts)) > 1:
            return ""
        shows = lesson.shows.format(**_seen(other[0]))
        wanted, had = _asked(other[0], lesson), _asked(base[0], lesson)
        said.append(f"both arms' records show {shows}" if wanted == had else
                    f"the arm that asked for {lesson.asked} {wanted} shows {shows}, as its baseline does: {lesson.todo}")
    return "; ".join(said)


def _seen(item) -> dict:
    """What a run observed (run.json `observed`), or a row as it is."""
    if isinstance(item, dict):
        return item
    return item.info.get("observed") or item.summary.get("observed") or {}


def _asked(item, lesson: Lesson):
    return item.get(lesson.asked) if isinstance(item, dict) else item.config.get(lesson.asked)


def _facts(item, lesson: Lesson) -> tuple | None:
    seen = _seen(item)
    if any(key not in seen for key in lesson.evidence):
        return None
    return tuple(str(seen[key]) for key in lesson.evidence)
