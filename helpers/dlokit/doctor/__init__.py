"""`dlokit doctor`: the preflight an instructor runs before class, on the site the course will use.

    dlokit doctor --profile local-slurm
    dlokit doctor --profile jean-zay --account abc@a100 --gpus 2 --data /path/to/imagenet
    python -m dlokit doctor --profile NAME

It submits a handful of tiny jobs through the profile, exactly as the notebooks do, and prints one line per
check (✅, ❌ with what to change, or "not checked: why"; report.CHECKS says what each proves), then which TPs of
which day will work there. Exit status 0 when nothing failed.
"""
from __future__ import annotations

import time
from pathlib import Path

from ..submission import jobs
from . import probe_jobs, scheduler
from .probe_jobs import Refused, said, submit_probe, wait
from .report import CHECKS, FAILED, course_summary, failed, not_checked

GENERATED = Path(__file__).resolve().parents[3] / "data" / "generated"  # where the notebooks generate their data
NO_GPU = "no GPU on this node"


def run(profile_name: str | None = None, gpus: int = 2, account: str | None = None, data: str = "",
        out=print) -> int:
    started, findings = time.time(), []

    def show(*found):
        for finding in found:
            findings.append(finding)
            out(finding.line())

    profile, finding = scheduler.load_profile(profile_name, account)
    show(finding)
    if profile is not None:
        show(*scheduler.cluster(profile))
        _jobs(profile, gpus, data, show, out)
    seen = {f.check for f in findings}
    show(*(not_checked(check, "after the ❌ above: fix it first") for check in CHECKS if check not in seen))
    out("")
    for line in course_summary(findings):
        out(line)
    out(f"({len(findings)} checks in {time.time() - started:.0f} s; what each proves: docs/instructors.md)")
    return 1 if any(f.status == FAILED for f in findings) else 0


def _jobs(profile, gpus: int, data: str, show, out) -> None:
    try:
        token, paths = probe_jobs.write_tokens(profile)
    except OSError as err:
        show(failed("log folder", f"cannot write here: {err}", "set log_dir and runs_dir in the profile to folders "
                                                                "you can write, on a filesystem the nodes share"))
        return
    out(f"… a 1-task job through {profile.name}")
    try:
        card = submit_probe(profile, "env", *map(str, paths))
    except Refused as err:
        show(failed("job", f"not accepted: {err}", probe_jobs.refusal_fix(str(err), profile.name)))
        return
    sleeper = _time_limit_job(profile)  # it takes a minute: the 1-task job and the others run during it
    [outcome] = wait([card])
    env = probe_jobs.env_findings(profile, card, outcome, token, paths)
    show(*env)
    if outcome.state != "COMPLETED" or any(f.status == FAILED for f in env):
        if isinstance(sleeper, jobs.JobCard) and not jobs.job_outcome(sleeper.job_id).finished:
            jobs.cancel(sleeper.job_id)  # (a 1-task job queued past the time limit: the sleeper already ended)
        return  # every other job would meet the same problem
    show(scheduler.accounting(profile, card.scheduler_id))
    job_gpus = said(card)[0].get("gpus", 0)  # what the 1-task job saw
    _the_rest(profile, gpus, data, job_gpus, sleeper, show, out)


def time_limit(profile) -> str:
    return "00:01:00" if profile.backend == "slurm" else "00:00:15"  # Slurm counts whole minutes


def _time_limit_job(profile):
    """A job that sleeps past its time limit, submitted right after the 1-task job (not behind it); its finding when
    it is not accepted."""
    try:
        return submit_probe(profile, "sleep", "600", n_gpu=1, time_max=time_limit(profile))
    except Refused as err:
        return failed("time limit", f"not accepted: {err}", probe_jobs.refusal_fix(str(err), profile.name))


def _the_rest(profile, gpus: int, data: str, job_gpus: int, sleeper, show, out) -> None:
    """Every other job at once, while the time limit's job (`sleeper`, already submitted) sleeps its minute;
    findings in report.CHECKS' order."""
    limit = time_limit(profile)
    nodes = scheduler.nodes_in_partition(profile) if profile.backend == "slurm" else 1
    plans = {"cancel": ("sleep", ["600"], 1, "00:05:00"),
             "2 tasks": ("ranks", [], gpus, "00:05:00"), "compile": ("compile", [], 1, "00:10:00"),
             "data": ("data", [data, str(GENERATED)], 1, "00:05:00")}
    cards, found = ({"time limit": sleeper}, {}) if isinstance(sleeper, jobs.JobCard) else ({}, {"time limit": sleeper})
    machine = profile.node_gpus() if profile.backend != "slurm" else None  # this machine's GPUs, or CPU processes
    if machine is not None and machine < gpus:  # nothing to ask: the job could never start here
        del plans["2 tasks"]
        found["2 tasks"] = not_checked("2 tasks", f"this machine offers {machine} device(s) (GPUs, or CPU processes "
                                       f"without one), the check {gpus}: the multi-rank TPs need a second one")
    if nodes >= 2:
        plans["2 nodes"] = ("ranks", [], 2 * profile.node_gpus(), "00:05:00")
    gpu_probes = {"GPU device": "gpu-device", "mixed precision": "gpu-amp", "channels_last": "gpu-channels-last",
                  "profiler trace": "gpu-profiler", "GPU energy": "gpu-energy", "FSDP2": "fsdp"}
    if job_gpus:
        for check, kind in gpu_probes.items():
            plans[check] = (kind, [], 2 if kind == "fsdp" else 1, "00:05:00")
        if profile.node_gpus() < 2:
            del plans["FSDP2"]
            found["FSDP2"] = not_checked("FSDP2", f"a node has {profile.node_gpus()} GPU: FSDP2 shards over 2")
    for check, (kind, args, n, time_max) in plans.items():
        try:
            cards[check] = submit_probe(profile, kind, *args, n_gpu=n, time_max=time_max)
        except Refused as err:
            found[check] = failed(check, f"not accepted: {err}", probe_jobs.refusal_fix(str(err), profile.name))
    out(f"… {len(cards)} jobs at once; the one that sleeps past its {limit} time limit (submitted with the first) "
        "ends last")
    if "cancel" in cards:
        found["cancel"] = probe_jobs.cancel_finding(cards.pop("cancel"))
    outcomes = dict(zip(cards, wait(list(cards.values()))))
    for check, card in cards.items():
        found[check] = _judge(check, card, outcomes[check], limit, data)
    if nodes < 2:
        found["2 nodes"] = not_checked("2 nodes", f"the partition has {nodes} node" if profile.backend == "slurm"
                                       else "the local backend is one machine")
    if not job_gpus:
        for check in gpu_probes:
            found[check] = not_checked(check, NO_GPU)
    show(*(found[check] for check in CHECKS if check in found))


def _judge(check, card, outcome, limit, data):
    if check in ("2 tasks", "2 nodes"):
        return probe_jobs.all_reduce_finding(check, card, outcome, across_nodes=check == "2 nodes")
    if check == "time limit":
        return probe_jobs.timeout_finding(outcome, limit)
    if check == "compile":
        return probe_jobs.compile_finding(card, outcome)
    if check == "data":
        return probe_jobs.data_finding(card, outcome, data)
    return probe_jobs.gpu_finding(check, card, outcome, GPU_JUDGES[check])


def _device(lines):
    line = lines[0]
    index, given = line["cuda0_nvml_index"], [v for v in line["cuda_visible_devices"].split(",") if v]
    mine = isinstance(index, int) and (not given or str(index) in given or any(not v.isdigit() for v in given))
    return mine, (f"{len(line['gpus'])} GPU(s) ({', '.join(sorted(set(line['gpus'])))}); cuda:0 is NVML's GPU {index}"
                  f", CUDA_VISIBLE_DEVICES={line['cuda_visible_devices'] or '(unset)'}"
                  + ("" if mine else ": the task computes on a GPU the scheduler did not give it"))


GPU_JUDGES = {
    "GPU device": _device,
    "mixed precision": lambda lines: (lines[0]["fp16"] == "torch.float16" and lines[0]["finite"],
                                      f"fp16 autocast gives {lines[0]['fp16']}, GradScaler scale {lines[0]['scale']}"
                                      f"; bf16: {lines[0]['bf16'] or 'not supported by this GPU'}"),
    "channels_last": lambda lines: (lines[0]["channels_last"], "the convolution's output is channels_last"
                                    if lines[0]["channels_last"] else "the output lost the channels_last layout"),
    "profiler trace": lambda lines: (lines[0]["kernels"] > 0 and lines[0]["kernel_us"] > 0,
                                     f"{lines[0]['kernels']} GPU events, {lines[0]['kernel_us']} µs of kernels"),
    "GPU energy": lambda lines: (bool(lines[0]["gpu_uuid"]) and not lines[0]["unavailable"],
                                 f"NVML reads {lines[0]['gpu_uuid']}" if lines[0]["gpu_uuid"] else
                                 f"no energy reading: {lines[0]['unavailable']}"),
    "FSDP2": lambda lines: (all(abs(line["local_share"] - 1 / line["world_size"]) < 0.01 for line in lines),
                            f"{len(lines)} ranks hold {', '.join(str(line['local_share']) for line in lines)} of the "
                            "weights"),
}
