"""Side-by-side throughput of train_classifier.py configurations, in one run, as a table.

Each configuration is a short `--test` run of the real training script (a subprocess, so every row
pays the same start-up and reads its numbers from the run record's summary.json):

    python bench/bench_image.py                  # CPU: fp32 vs bf16 vs channels_last; DDP weak scaling,
                                                 #   1 rank on 1 core vs 2 gloo ranks on 1 core each
    python bench/bench_image.py --gpu            # GPU matrix: ResNet-50 fp32, TF32, bf16, +channels_last,
                                                 #   +compile on on-device data; JPEGs with 0/4/8/16 workers

Ratios compare each row with the first row of its group. The GPU path has not been run on a GPU yet.

DDP on the CPU follows "one rank = one device": each rank owns its share of the cores (1 core by
default, pinned with bench/pin_rank.py) and keeps the same per-rank batch as the 1-rank row, so the
group measures weak scaling: efficiency = img/s(2 ranks) / (2 x img/s(1 rank)). Below the table, the
all-reduce share of a 2-rank step is measured apart by bench/ddp_cpu_efficiency.py (same model, image
size and per-rank batch: a DDP step against the same step under no_sync, i.e. without communication).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tp_scripts" / "solutions" / "train_classifier.py"
GENERATOR = REPO / "data" / "make_synthetic_imagenet.py"
PIN = Path(__file__).resolve().with_name("pin_rank.py")
WEAK = "DDP weak scaling"  # groups whose ranks keep the per-rank batch of the 1-rank row


@dataclass
class Config:
    group: str
    name: str
    args: list[str]
    processes: int = 1
    pin: bool = False            # rank r on its own cores (bench/pin_rank.py): one rank = one device
    threads: int | None = None   # threads (= cores) per process, overriding --threads
    result: dict = field(default_factory=dict)


def cpu_matrix(a, jpeg_root: Path) -> list[Config]:
    base = ["--model", a.cpu_model, "--image-size", str(a.cpu_image_size), "--data", "synthetic",
            "--num-classes", "100", "--synthetic-steps", str(a.steps)]
    batch = ["--batch-size", str(a.cpu_batch)]
    jpeg = ["--model", a.cpu_model, "--image-size", str(a.cpu_image_size), "--data", str(jpeg_root), *batch]
    rows = [
        Config("precision and layout (on-device data)", "fp32", base + batch),
        Config("precision and layout (on-device data)", "bf16 autocast", base + batch + ["--amp", "bf16"]),
        Config("precision and layout (on-device data)", "channels_last", base + batch + ["--channels-last"]),
        Config("precision and layout (on-device data)", "bf16 + channels_last",
               base + batch + ["--amp", "bf16", "--channels-last"]),
    ]
    # one rank = one device: each rank owns `cores` cores, the 1-rank row too; same batch per rank
    cores = a.threads or max(1, (os.cpu_count() or 2) // 2)
    extra = shlex.split(a.ddp_args)
    for per_rank in a.ddp_batch:
        group = f"{WEAK}, {per_rank} img/rank, {cores} core(s)/rank (on-device data)"
        b = ["--batch-size", str(per_rank)]
        rows.append(Config(group, f"1 rank on {cores} core(s)", base + b, pin=True, threads=cores))
        rows.append(Config(group, f"2 gloo ranks on {cores} core(s) each", base + b + extra, processes=2, pin=True,
                           threads=cores))
    rows += [
        Config("data loading (generated JPEGs, fp32)", "on-device data", base + batch),
        Config("data loading (generated JPEGs, fp32)", "JPEG, 0 workers", jpeg + ["--num-workers", "0"]),
        Config("data loading (generated JPEGs, fp32)", "JPEG, 1 worker",
               jpeg + ["--num-workers", "1", "--persistent-workers"]),
    ]
    return rows


def gpu_matrix(a, jpeg_root: Path) -> list[Config]:
    base = ["--model", "resnet50", "--image-size", "224", "--batch-size", str(a.gpu_batch), "--cudnn-benchmark"]
    synthetic = base + ["--data", "synthetic", "--synthetic-steps", str(a.steps)]
    fast = ["--amp", "bf16", "--channels-last"]
    group = f"ResNet-50, 224 px, batch {a.gpu_batch} (on-device data)"
    rows = [
        Config(group, "fp32", synthetic),
        Config(group, "TF32", synthetic + ["--tf32"]),
        Config(group, "bf16 autocast", synthetic + ["--amp", "bf16"]),
        Config(group, "bf16 + channels_last", synthetic + fast),
        Config(group, "bf16 + channels_last + compile", synthetic + fast + ["--compile"]),
    ]
    loader = ["--pin-memory", "--non-blocking", "--persistent-workers", "--prefetch-factor", "2"]
    group = "same, generated JPEGs (bf16 + channels_last)"
    rows.append(Config(group, "on-device data", synthetic + fast))
    for workers in (0, 4, 8, 16):
        rows.append(Config(group, f"JPEG, {workers} workers", base + fast + ["--data", str(jpeg_root),
                                                                            "--num-workers", str(workers), *loader]))
    gpus = gpu_count()
    if gpus > 1:
        group = f"{WEAK}, {a.gpu_batch} images per GPU (on-device data, bf16 + channels_last)"
        rows.append(Config(group, "1 GPU", synthetic + fast))
        rows.append(Config(group, f"{gpus} GPUs", synthetic + fast, processes=gpus))
    return rows


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def run(config: Config, runs_dir: Path, steps: int, timeout: int, threads_per_process: int) -> None:
    run_id = f"bench-{int(time.time() * 1000)}"
    threads = config.threads or threads_per_process or max(1, (os.cpu_count() or 1) // config.processes)
    env = {**os.environ, "DLOKIT_RUN_ID": run_id, "OMP_NUM_THREADS": str(threads)}
    launcher = [sys.executable] if config.processes == 1 else [
        str(Path(sys.executable).with_name("torchrun")), "--standalone", f"--nproc_per_node={config.processes}"]
    target = [str(PIN), str(SCRIPT)] if config.pin else [str(SCRIPT)]  # pin_rank.py: rank r on cores [r*t, (r+1)*t)
    cmd = [*launcher, *target, *config.args, "--test", "--test-nsteps", str(steps), "--runs-dir", str(runs_dir),
           "--print-every", "100000"]
    load_start = os.getloadavg()[0]
    started = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        config.result = {"error": f"timed out after {timeout} s"}
        return
    summary_path = runs_dir / run_id / "rank0" / "summary.json"
    if done.returncode != 0 or not summary_path.exists():
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        config.result = {"error": f"exit {done.returncode}: {last[:150]}"}
        return
    config.result = {**json.loads(summary_path.read_text()), "wall_s": time.perf_counter() - started,
                     "threads": threads, "pinned": config.pin, "load_start": load_start, "load_end": os.getloadavg()[0]}


def allreduce_share(a, per_rank: int, cores: int) -> dict:
    """The all-reduce share of a 2-rank DDP step, measured apart (bench/ddp_cpu_efficiency.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import dataclasses

    import ddp_cpu_efficiency as d

    variant = dataclasses.replace(d.VARIANTS[a.ddp_variant], threads=cores)
    cfg = {"model": a.cpu_model, "size": a.cpu_image_size, "classes": 100, "batch": per_rank, "seconds": 4.0,
           "warmup": 3}
    return d.run_once(variant, 2, cfg)


def weak_scaling_lines(configs: list[Config], shares: dict) -> list[str]:
    """One paragraph per weak-scaling group: efficiency, and what the all-reduce takes of a step."""
    lines = []
    groups = {}
    for c in configs:
        if c.group.startswith(WEAK):
            groups.setdefault(c.group, []).append(c)
    for group, (one, *more) in groups.items():
        for many in more:
            r1, rn = one.result, many.result
            if "error" in r1 or "error" in rn:
                continue
            speedup = rn["throughput_train"] / r1["throughput_train"]
            eff = speedup / (many.processes / one.processes)
            text = (f"{group}: {many.processes} ranks give {speedup:.2f}x the throughput of 1 rank, weak-scaling "
                    f"efficiency {eff:.0%} (same batch per rank; ideal {many.processes / one.processes:.0f}x = 100%)")
            if r1.get("t_backward") and rn.get("t_backward"):
                extra = rn["t_backward"] - r1["t_backward"]
                text += (f"; backward with DDP communication {rn['t_backward'] * 1e3:.0f} ms vs {r1['t_backward'] * 1e3:.0f}"
                         f" ms without: +{extra * 1e3:.0f} ms = {max(0.0, extra) / rn['t_step']:.0%} of the 2-rank step")
            text += (f" [load average: 1-rank row {r1['load_start']:.1f}->{r1['load_end']:.1f}, "
                     f"{many.processes}-rank row {rn['load_start']:.1f}->{rn['load_end']:.1f}; on a machine shared "
                     f"with other work, rerun when it is quiet]")
            lines.append(text)
        s = shares.get(group)
        if s is None:
            continue
        if "error" in s:
            lines.append(f"  all-reduce share: not measured ({s['error']})")
        else:
            lines.append(
                f"  all-reduce share of a 2-rank step (bench/ddp_cpu_efficiency.py, DDP kwargs '{s['variant']}'): "
                f"{s['allreduce_share']:.0%} (DDP step {s['step_ms']:.0f} ms, same step under no_sync "
                f"{s['local_step_ms']:.0f} ms; all-reduce of all {s['grad_mb']:.1f} MiB of gradients alone "
                f"{s['raw_allreduce_ms']:.0f} ms; other processes used {s['extra_load_timed']:.2f} core(s) meanwhile)")
    return lines


def table(configs: list[Config]) -> str:
    lines = ["| group | configuration | processes | img/s train | img/s compute | ratio (train) | per-process efficiency "
             "| data ms/step | step ms |", "|---|---|---|---|---|---|---|---|---|"]
    baseline = {}
    for c in configs:
        r = c.result
        if "error" in r:
            lines.append(f"| {c.group} | {c.name} | {c.processes} | error: {r['error']} | | | | | |")
            continue
        first_throughput, first_processes = baseline.setdefault(c.group, (r["throughput_train"], c.processes))
        ratio = r["throughput_train"] / first_throughput
        efficiency = ratio / (c.processes / first_processes)  # DDP: speed-up per added process
        lines.append(f"| {c.group} | {c.name} | {c.processes} | {r['throughput_train']:.1f} | "
                     f"{r['throughput_compute']:.1f} | {ratio:.2f}x | {efficiency:.0%} | {r['t_data'] * 1e3:.1f} | "
                     f"{r['t_step'] * 1e3:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--gpu", action="store_true", help="run the GPU matrix instead of the CPU one")
    p.add_argument("--steps", type=int, default=12, help="steps per configuration (the first 2 are not timed)")
    p.add_argument("--cpu-model", default="resnet18")
    p.add_argument("--cpu-image-size", type=int, default=64)
    p.add_argument("--cpu-batch", type=int, default=16, help="batch of every single-process CPU row")
    p.add_argument("--ddp-batch", type=int, nargs="+", default=[16, 128],
                   help="per-rank batch(es) of the CPU DDP weak-scaling groups, one group each: 16 is the notebook "
                        "default (~70%% on one core per rank); resnet18 at 64 px reaches >= 85%% from about 128 per "
                        "rank (64: ~84%%, borderline). See bench/ddp_cpu_efficiency.py")
    p.add_argument("--ddp-args", default="", help="extra training-script options for the 2-rank rows (quoted)")
    p.add_argument("--ddp-variant", default="default",
                   help="DDP settings of the separate all-reduce-share measurement (python bench/ddp_cpu_efficiency.py "
                        "--list); 'none' skips it")
    p.add_argument("--gpu-batch", type=int, default=256, help="batch per GPU")
    p.add_argument("--jpeg-images-per-class", type=int, default=None, help="[default: 8 on CPU, 40 on GPU]")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads per process (0 = cores / processes; in the DDP rows 0 = cores / 2 for the 1-rank "
                        "row too). One thread per rank plays the role of one GPU per rank, and stays honest on a busy "
                        "machine where OpenMP threads oversubscribe")
    p.add_argument("--repeat", type=int, default=1, help="run each row this many times, keep the fastest")
    p.add_argument("--timeout", type=int, default=600, help="seconds per configuration")
    p.add_argument("--out", default=None, help="also write the table (markdown) and raw results (json) here")
    a = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="dlokit-bench-") as tmp:
        tmp = Path(tmp)
        per_class = a.jpeg_images_per_class or (40 if a.gpu else 8)
        classes, size = (100, 256) if a.gpu else (10, a.cpu_image_size + 8)
        subprocess.run([sys.executable, str(GENERATOR), "--out", str(tmp / "jpeg"), "--classes", str(classes),
                        "--train-per-class", str(per_class), "--val-per-class", "0", "--size", str(size), "--quiet"],
                       check=True)
        configs = gpu_matrix(a, tmp / "jpeg") if a.gpu else cpu_matrix(a, tmp / "jpeg")
        started = time.perf_counter()
        for c in configs:
            print(f"running {c.group} / {c.name} ...", flush=True)
            best = {}
            for _ in range(a.repeat):
                run(c, tmp / "runs", a.steps, a.timeout, a.threads)
                if "error" in c.result or c.result["throughput_train"] > best.get("throughput_train", 0):
                    best = c.result
            c.result = best
        shares = {}
        if not a.gpu and a.ddp_variant != "none":
            for c in configs:
                if c.group.startswith(WEAK) and c.processes > 1 and c.group not in shares:
                    print(f"measuring the all-reduce share for {c.group} ...", flush=True)
                    batch_arg = c.args[c.args.index("--batch-size") + 1]
                    shares[c.group] = allreduce_share(a, int(batch_arg), c.threads or 1)
        elapsed = time.perf_counter() - started

    hardware = f"{cpu_name()}, {os.cpu_count()} cores"
    if a.gpu:
        import torch

        hardware = f"{torch.cuda.get_device_name(0)} x{gpu_count()}, {hardware}"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    threads = a.threads or "cores/processes"
    header = (f"bench_image.py on {time.strftime('%Y-%m-%d')} | {hardware} | {threads} thread(s) per process | "
              f"{a.steps} steps per row, best of {a.repeat} "
              f"(2 untimed) | load average {load:.1f} | {elapsed:.0f} s")
    text = header + "\n\n" + table(configs)
    weak = weak_scaling_lines(configs, shares)
    if weak:
        text += "\n\n" + "\n".join(weak)
    print("\n" + text, flush=True)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_image.md").write_text(text + "\n")
        (out / "bench_image.json").write_text(json.dumps(
            [{"group": c.group, "name": c.name, "processes": c.processes, **c.result} for c in configs]
            + [{"group": g, "name": "all-reduce share (ddp_cpu_efficiency.py)", **s} for g, s in shares.items()],
            indent=2))
    return 0 if all("error" not in c.result for c in configs) else 1


if __name__ == "__main__":
    sys.exit(main())
