"""Text that follows measurement: after a comparison, say what THIS run measured, whether it agrees
with the lesson, and — on a CPU — the public GPU figure beside it (../shared/reference/figures.md,
quoted with its source, never presented as ours).

    lessons.verdict("amp", ratio=0.81, on_gpu=False, what="bf16 vs fp32 compute throughput")
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Lesson:
    expectation: str          # what the effect should do, in words
    expects_gain: bool        # the lesson predicts ratio > 1 (a speed-up); False: a cost (ratio < 1)
    public: str               # a public GPU figure and its source
    cpu_note: str = ""        # why a CPU may disagree


LESSONS = {
    "gpu_vs_cpu": Lesson(
        "a GPU trains many times faster than the CPU", True,
        "ResNet-50, 1×A100-80GB, AMP: 2,470 img/s (NVIDIA DeepLearningExamples); the same model on this "
        "project's 2-core CPU: ≈5.5 img/s at 224 px",
        "without a GPU both runs used the CPU: there is nothing to compare"),
    "amp": Lesson(
        "16-bit autocast speeds training up on tensor cores and halves activation memory", True,
        "ResNet-50, 1×A100-80GB: 2,470 img/s with AMP vs 938 img/s in TF32 (NVIDIA DeepLearningExamples)",
        "CPU autocast to bf16 adds conversions and most CPUs have no bf16 matrix units, so it is often slower"),
    "channels_last": Lesson(
        "NHWC convolutions avoid layout conversions around tensor-core kernels", True,
        "ResNet-50 on A100, timm with AMP + channels_last: ≈2,600 img/s (pytorch-image-models issue 1491), "
        "vs 2,470 img/s AMP in NVIDIA's reference",
        "CPU convolution kernels gain little or nothing from NHWC"),
    "dataloader": Lesson(
        "worker processes, pinning and prefetching hide the data loading behind the computation", True,
        "DLO-JZ, ResNet-152 batch 512 on 1×A100: 226 img/s with every DataLoader option off, 1,164 img/s tuned",
        "on a CPU the workers take cores from the computation: the data wait drops, the total may not"),
    "ddp": Lesson(
        "N data-parallel ranks train close to N times faster (weak scaling)", True,
        "DLO-JZ, ResNet-152: 4,455 img/s on 4×A100 (≈96 % efficiency), 26.2k img/s on 32×A100 (≈70 %)",
        "CPU ranks exchange gradients through gloo over shared memory; each rank owns its share of the cores"),
    "sync_bn": Lesson(
        "SyncBatchNorm costs time (a collective per BatchNorm layer) for steadier statistics", False,
        "DLO-JZ, ResNet-152 on 4 GPUs: 3,471 img/s with SyncBatchNorm vs 4,455 img/s without",
        "PyTorch runs SyncBatchNorm on GPUs only"),
    "metric_step": Lesson(
        "synchronising the metrics less often removes a host-device stall per step", True,
        "no public figure: the gain is the stall removed, largest for short GPU steps",
        "a CPU has no asynchronous device queue to stall: expect no difference"),
    "find_unused": Lesson(
        "find_unused_parameters costs a graph traversal per step", False,
        "no public figure: the cost grows with the number of autograd nodes", ""),
    "compile": Lesson(
        "after a one-off compile time, compiled code runs each step faster (fused kernels, fewer memory trips)", True,
        "Llama-3.1-8B on 8×H100 with torchtitan: 5,762 tokens/s/GPU eager, 6,667 with torch.compile",
        "on a CPU inductor fuses elementwise chains into C++ loops, but convolutions stay in the same oneDNN "
        "kernels: expect a gain on the function, little or none on a CNN's training step"),
    "augment_on_device": Lesson(
        "batched mixup/cutmix on the device costs far less than per-image augmentation in the workers", True,
        "no single public figure: per-image RandAugment cost grows with image size and needs CPU cores per GPU", ""),
}


def agrees(lesson: Lesson, ratio: float, tolerance: float = 0.03) -> bool:
    return ratio > 1 + tolerance if lesson.expects_gain else ratio < 1 - tolerance


def verdict_text(effect: str, ratio: float | None, on_gpu: bool, what: str) -> str:
    lesson = LESSONS[effect]
    if ratio is None or not math.isfinite(ratio):
        return f"{what}: no measurement to compare (a run failed or is missing). The lesson: {lesson.expectation}."
    where = "on a GPU" if on_gpu else "on the CPU"
    text = f"This run measured ×{ratio:.2f} for {what}, {where}. The lesson: {lesson.expectation}. "
    if agrees(lesson, ratio):
        text += "This measurement agrees."
    else:
        text += "This measurement does NOT show it"
        text += f" — {lesson.cpu_note}." if not on_gpu and lesson.cpu_note else "."
    if not on_gpu:
        text += f" For comparison, a public GPU figure (not ours): {lesson.public}."
    return text


class Verdict(str):
    def _repr_markdown_(self) -> str:
        return f"> {html.escape(self)}"


def verdict(effect: str, ratio: float | None, on_gpu: bool, what: str) -> Verdict:
    """One paragraph for the cell after a comparison (shown as a quote in Jupyter, text elsewhere)."""
    return Verdict(verdict_text(effect, ratio, on_gpu, what))
