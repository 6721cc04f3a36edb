"""The doctor's findings: one line per check (✅, ❌ with the fix, or "not checked: why"), then which TPs of which
day will work on the site."""
from __future__ import annotations

from dataclasses import dataclass

PASSED, FAILED, NOT_CHECKED = "passed", "failed", "not checked"
SYMBOL = {PASSED: "✅", FAILED: "❌", NOT_CHECKED: "➖"}


@dataclass(frozen=True)
class Finding:
    check: str     # a name from CHECKS
    status: str
    message: str
    fix: str = ""  # what to change (in the profile, on the site) when it failed

    def line(self) -> str:
        text = f"{SYMBOL[self.status]} {self.check}: " + (
            f"not checked: {self.message}" if self.status == NOT_CHECKED else self.message)
        return text + (f"\n     fix: {self.fix}" if self.status == FAILED and self.fix else "")


def passed(check, message):
    return Finding(check, PASSED, message)


def failed(check, message, fix=""):
    return Finding(check, FAILED, message, fix)


def not_checked(check, why):
    return Finding(check, NOT_CHECKED, why)


# What each check proves (docs/instructors.md lists the same), in the order they print.
CHECKS = {
    "profile": "the profile loads: its settings are known, the required ones (account...) are set",
    "cluster limits": "scontrol answers with the partitions and nodes the kit sizes jobs from; the profile's "
                      "partition exists and its gpus_per_node matches the nodes",
    "accounts": "sacctmgr lists the user's accounts and the profile's account is one of them",
    "job": "a 1-task job is accepted (account, partition, QOS, constraint), starts and completes",
    "setup lines": "the profile's setup lines (module load...) ran without an error on the node",
    "python on the nodes": "the nodes' python imports torch, dlokit and submitit, at the login node's versions",
    "log folder": "the job's log folder is the same files from the login node and from the node",
    "runs folder": "the runs folder (run records) is the same files from the login node and from the node",
    "accounting": "sacct answers about a finished job (how dlokit.job_outcome names its end)",
    "2 tasks": "a 2-task job's ranks reach each other and all-reduce (gloo on CPUs, NCCL on GPUs, with its "
               "bandwidth)",
    "2 nodes": "a job over 2 nodes all-reduces across them",
    "cancel": "a cancelled job ends and is named CANCELLED",
    "time limit": "a job past its time limit is stopped and named TIMEOUT",
    "GPU device": "a tensor computes on each visible GPU, and the task's GPU is one the scheduler gave it",
    "mixed precision": "autocast fp16 with GradScaler, and bf16 where the GPU has it",
    "channels_last": "a convolution keeps the channels_last layout on the GPU",
    "profiler trace": "a CUDA trace read by the kit's trace reader holds kernels with a duration",
    "GPU energy": "NVML's energy counter of the task's own physical GPU is readable",
    "FSDP2": "fully_shard on 2 GPUs: each rank holds half of every weight, and a step runs",
    "compile": "torch.compile of a small function gives eager's answer on the job's device (a GPU: Triton; a CPU: "
               "the C++ compiler; the user's cache)",
    "data": "the data set has the ImageNet layout, or the generated one can be written where the notebooks put it",
}

BASICS = ["job", "setup lines", "python on the nodes", "log folder", "runs folder"]
GPU_PATHS = {"GPU device", "mixed precision", "channels_last", "profiler trace", "GPU energy", "FSDP2"}
# What each part of the course needs; a GPU check "not checked" because the nodes have none means the part
# runs on CPU processes instead.
COURSE = [
    ("Day 1 TP1.1–TP1.4 (one device, AMP, channels_last, profiler)",
     BASICS + ["data", "GPU device", "mixed precision", "channels_last", "profiler trace", "GPU energy"]),
    ("Day 2 TP2.1 (DataLoader)", BASICS + ["data"]),
    ("Day 2 TP2.2–TP2.4 (DDP, SyncBatchNorm, augmentation)", BASICS + ["data", "2 tasks"]),
    ("Day 3 TP3.1, TP3.2, TP3.4, TP3.5 (large batches, LR finder, formats, HPO)", BASICS + ["data", "cancel"]),
    ("Day 3 TP3.3 (compilation)", BASICS + ["compile"]),
    ("Day 4 TP4.1–TP4.7 (FSDP2, pipeline, tensor and context parallel)", BASICS + ["2 tasks", "FSDP2"]),
    ("multi-node runs (Day 2 scaling past one node, the race on many nodes)", BASICS + ["2 nodes"]),
    ("the Imagenet Race (checkpoints, requeue at the time limit)", BASICS + ["data", "time limit"]),
]


def course_summary(findings: list[Finding]) -> list[str]:
    by_check = {f.check: f for f in findings}
    lines = []
    for part, needs in COURSE:
        broken = [c for c in needs if c in by_check and by_check[c].status == FAILED]
        unknown = [c for c in needs if c not in GPU_PATHS and (c not in by_check or by_check[c].status == NOT_CHECKED)]
        on_cpu = any(c in GPU_PATHS and c in by_check and by_check[c].status == NOT_CHECKED for c in needs)
        if broken:
            lines.append(f"❌ {part}: blocked by {', '.join(broken)}")
        elif unknown:
            lines.append(f"➖ {part}: unknown, not checked: {', '.join(unknown)}")
        else:
            lines.append(f"✅ {part}: will work" + (" (on CPU processes: no GPU checked)" if on_cpu else ""))
    return lines
