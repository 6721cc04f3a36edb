"""Day-4 benchmark: tokens/s and MFU of train_llm.py under each parallelism, in one table.

    python bench/bench_llm.py                 # CPU: tiny config, 2 gloo processes per mode (~1 min)
    python bench/bench_llm.py --gpu           # every visible GPU: ~1B config in bf16, FSDP2 variants

The GPU path has not been run on a GPU yet (none was available when it was written): it only
composes options that the CPU tests exercise, plus --compile and bf16 on CUDA.
Each row is one launch of train_llm.py; the numbers come from its run record (rank 0 summary,
warm-up steps excluded), its status from every rank's: a run where any rank ran out of memory
shows as "OOM (rank r)".
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tp_scripts" / "llm" / "solutions" / "train_llm.py"

CPU_ROWS = [  # (label, processes, options)
    ("single", 1, ["--mode", "single"]),
    ("ddp", 2, ["--mode", "ddp"]),
    ("zero1", 2, ["--mode", "zero1"]),
    ("fsdp", 2, ["--mode", "fsdp"]),
    ("fsdp no-reshard", 2, ["--mode", "fsdp", "--no-reshard-after-forward"]),
    ("fsdp +AC", 2, ["--mode", "fsdp", "--activation-checkpointing"]),
    ("tp-scratch", 2, ["--mode", "tp-scratch"]),
    ("tp (DTensor)", 2, ["--mode", "tp"]),
    ("pp naive", 2, ["--mode", "pp", "--pp-schedule", "naive"]),
    ("pp gpipe m=4", 2, ["--mode", "pp", "--pp-schedule", "gpipe", "--microbatches", "4"]),
    ("pp 1f1b m=8", 2, ["--mode", "pp", "--pp-schedule", "1f1b", "--microbatches", "8"]),
    ("cp (all-gather K/V)", 2, ["--mode", "cp"]),
]


def gpu_rows(n_gpus: int):
    if n_gpus == 1:  # nothing to shard over: compile and checkpointing on one device
        return [("single bf16", 1, ["--mode", "single"]),
                ("single bf16 +compile", 1, ["--mode", "single", "--compile"]),
                ("single bf16 +AC", 1, ["--mode", "single", "--activation-checkpointing"]),
                ("single bf16 +AC +compile", 1, ["--mode", "single", "--activation-checkpointing", "--compile"])]
    fsdp = ["--mode", "fsdp", "--meta-init"]
    return [
        ("ddp bf16-autocast", n_gpus, ["--mode", "ddp"]),
        ("zero1 bf16-autocast", n_gpus, ["--mode", "zero1"]),
        ("fsdp bf16", n_gpus, fsdp),
        ("fsdp bf16 no-reshard", n_gpus, fsdp + ["--no-reshard-after-forward"]),
        ("fsdp bf16 +compile", n_gpus, fsdp + ["--compile"]),
        ("fsdp bf16 +AC", n_gpus, fsdp + ["--activation-checkpointing"]),
        ("fsdp bf16 +AC +compile", n_gpus, fsdp + ["--activation-checkpointing", "--compile"]),
    ]


def run_one(label, nproc, options, common, runs_dir, timeout):
    run_id = f"bench-{int(time.time())}-{label.replace(' ', '_').replace('+', '').replace('=', '')}"
    env = {**os.environ, "DLOKIT_RUN_ID": run_id}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    launcher = ([sys.executable] if nproc == 1 else
                [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"])
    started = time.time()
    result = subprocess.run(launcher + [str(SCRIPT), *options, *common, "--runs-dir", str(runs_dir)],
                            env=env, capture_output=True, text=True, timeout=timeout)
    summary = read_run(runs_dir / run_id, nproc, result.returncode)
    if summary["status"] not in ("completed", "skipped") and not summary["status"].startswith("OOM"):
        print(result.stderr[-2000:], file=sys.stderr)
    summary["wall_s"] = time.time() - started
    return summary


def read_run(folder: Path, nproc: int, returncode: int) -> dict:
    """Rank 0's summary for the numbers, and a status from EVERY rank: an out-of-memory error on
    rank 1 shows as "OOM (rank 1)", not as rank 0's "aborted" or the launcher's "failed rc=1"."""
    summaries = {}
    for rank in range(nproc):
        path = folder / f"rank{rank}" / "summary.json"
        summaries[rank] = json.loads(path.read_text()) if path.exists() else {}
    summary = dict(summaries[0])
    oom = [rank for rank, s in summaries.items() if s.get("status") == "oom"]
    failed = [rank for rank, s in summaries.items() if s.get("status") == "failed"]
    missing = [rank for rank, s in summaries.items() if not s]
    if oom:
        summary["status"] = f"OOM (rank {', '.join(map(str, oom))})"
        summary["error"] = summaries[oom[0]].get("error")
    elif failed:
        summary["status"] = f"failed (rank {', '.join(map(str, failed))})"
        summary["error"] = summaries[failed[0]].get("error")
    elif missing:
        summary["status"] = f"failed rc={returncode} (no record from rank {', '.join(map(str, missing))})"
    elif returncode != 0:
        summary["status"] = f"failed rc={returncode}"
    else:
        summary.setdefault("status", "?")
    return summary


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--config", default=None, help="default: tiny on CPU, 1b on GPU")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None, help="global batch in sequences")
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--runs-dir", default=str(ROOT / "runs" / "bench_llm"))
    args = p.parse_args()

    if args.gpu:
        import torch
        n_gpus = torch.cuda.device_count()
        if n_gpus == 0:
            sys.exit("bench_llm.py --gpu: no GPU visible")
        rows = gpu_rows(n_gpus)
        common = ["--config", args.config or "1b", "--dtype", "bf16", "--steps", str(args.steps or 12),
                  "--warmup", "4", "--batch-size", str(args.batch_size or 4 * n_gpus),
                  "--seq-len", str(args.seq_len or 2048)]
        timeout = 900
    else:
        rows = CPU_ROWS
        common = ["--config", args.config or "tiny", "--steps", str(args.steps or 10), "--warmup", "3",
                  "--batch-size", str(args.batch_size or 16), "--seq-len", str(args.seq_len or 64)]
        timeout = 300
    runs_dir = Path(args.runs_dir)
    print(f"train_llm.py {' '.join(common)}")
    header = (f"{'mode':<26}{'procs':>6}{'tokens/s':>12}{'MFU':>8}{'t_step ms':>11}{'states MiB':>12}{'act MiB':>9}"
              f"{'peak MiB':>10}{'comm ms':>9}{'idle meas/theory':>20}  status")
    print(header)
    print("-" * len(header))
    for label, nproc, options in rows:
        s = run_one(label, nproc, options, common, runs_dir, timeout)
        held = s.get("memory_bytes") or {}
        states = (sum(held.get(k) or 0 for k in ("params", "grads", "optimizer")) / 2**20) if held else None
        activations = held.get("activations_peak") and held["activations_peak"] / 2**20
        memory = s.get("gpu_mem_peak_mb") or s.get("host_rss_peak_mb")
        bubble = (f"{s['pp_idle_fraction_measured']:.2f}/{s['pp_idle_fraction_theory']:.2f}"
                  if s.get("pp_idle_fraction_measured") is not None else "-")
        comm = s.get("comm_s") or s.get("comm_probe_s")
        status = s.get("status", "?")
        print(f"{label:<26}{nproc:>6}{fmt(s.get('tokens_per_s'), ',.0f'):>12}"
              f"{fmt(s.get('mfu') and 100 * s['mfu'], '.1f'):>8}{fmt(s.get('t_step') and 1000 * s['t_step'], '.1f'):>11}"
              f"{fmt(states, ',.1f'):>12}{fmt(activations, ',.1f'):>9}{fmt(memory, ',.0f'):>10}"
              f"{fmt(comm and 1000 * comm, '.2f'):>9}{bubble:>20}  {status}", flush=True)
    print("MFU: % of the GPU's dense peak for the run's arithmetic (bf16, TF32 or fp32; blank on CPU or an unknown "
          "GPU). states: parameters + gradients + optimizer states this rank holds, act: the activations it saved "
          "(both measured from its tensors, rank 0); peak: peak allocated GPU memory, or peak host RSS on CPU. "
          "comm: tp-scratch's all-reduce time per step (device clock); for ddp and zero1, one all-reduce of all "
          "gradients timed alone. idle: the pipeline's idle "
          "fraction of a step, measured (1 - compute time of the busiest rank / step time, in the run's own steps) "
          "vs (p-1)/(v m + p-1).")


if __name__ == "__main__":
    main()
