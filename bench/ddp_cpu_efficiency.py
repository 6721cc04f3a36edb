"""Weak-scaling efficiency of gloo DDP on a CPU-only machine, one core per rank.

Model of the machine: each rank stands for one GPU and owns its share of the cores. The 1-rank baseline
runs on ONE core (1 intra-op thread, process pinned to core 0); the 2-rank job runs rank r on core r.
The per-rank batch is the same in both (weak scaling), so

    efficiency = throughput(2 ranks) / (2 x throughput(1 rank))

Each measurement is a fresh set of processes (torch.multiprocessing, spawn) on a small in-memory
synthetic batch and a torchvision model. A 2-rank measurement times, in the same processes:

    ddp     : normal DDP steps (forward, backward with bucketed all-reduce, SGD step)
    local   : the same steps under ``model.no_sync()`` (no communication, both cores still busy)
    raw     : ``all_reduce`` of one flat fp32 tensor holding every gradient (cost of the bytes alone)

so that ``all-reduce share = 1 - local / ddp`` is the part of a DDP step that communication adds
(what overlap with backward did not hide), and ``local`` against the 1-rank step shows what two busy
cores cost each other (shared caches, memory bandwidth, clock) with no communication at all.

Other programs may use the cores meanwhile: every measurement records the load average at its start
and end and the CPU time used by *other* processes during it (``/proc/stat`` busy time minus the CPU
time of our own workers); measurements with more than ``--max-extra-load`` foreign cores are
discarded and re-run (up to ``--retries`` times). Runs are interleaved: for each variant, a 1-rank
baseline and then the 2-rank job, repeated ``--repeat`` times; medians are reported.

    python bench/ddp_cpu_efficiency.py                              # default variant set
    python bench/ddp_cpu_efficiency.py --variants default bucket100 --batches 16 64 --repeat 3
    python bench/ddp_cpu_efficiency.py --list                       # the variants

No wall-clock threshold here is a test: numbers depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from dataclasses import dataclass

# this module is re-imported by every spawned worker: keep torch out of the top level so that the
# environment (OMP_NUM_THREADS ...) and the CPU affinity are in place before torch starts its pools


@dataclass(frozen=True)
class Variant:
    name: str
    note: str = ""
    threads: int = 1                 # torch.set_num_threads per rank
    interop: int = 1                 # torch.set_num_interop_threads per rank (0 = leave torch's default)
    omp_env: bool = True             # export OMP_NUM_THREADS / MKL_NUM_THREADS = threads
    pin: bool = True                 # os.sched_setaffinity(rank r -> core r)
    bucket_cap_mb: float | None = None   # DDP default: 25
    grad_view: bool = False          # gradient_as_bucket_view
    static_graph: bool = False
    gloo_threads: int = 0            # 0 = default process group (gloo's default: 2 threads)
    comm_hook: str = "none"          # none | bf16 (bf16_compress_hook: half the bytes, changes numerics)
    channels_last: bool = False


VARIANTS = {v.name: v for v in [
    Variant("default", "DDP defaults, 1 thread, pinned"),
    Variant("unpinned", "no sched_setaffinity (OS places threads)", pin=False),
    Variant("no-omp-env", "set_num_threads(1) only, OMP env unset, interop default", omp_env=False, interop=0),
    Variant("gradview", "gradient_as_bucket_view=True", grad_view=True),
    Variant("static", "static_graph=True", static_graph=True),
    Variant("bucket5", "bucket_cap_mb=5", bucket_cap_mb=5),
    Variant("bucket100", "bucket_cap_mb=100 (one bucket: no overlap)", bucket_cap_mb=100),
    Variant("gloo1", "gloo process group with 1 thread", gloo_threads=1),
    Variant("gloo4", "gloo process group with 4 threads", gloo_threads=4),
    Variant("tuned", "gradient_as_bucket_view + static_graph", grad_view=True, static_graph=True),
    Variant("tuned-bf16", "tuned + bf16_compress_hook", grad_view=True, static_graph=True, comm_hook="bf16"),
    Variant("bf16hook", "bf16_compress_hook only", comm_hook="bf16"),
    Variant("b100-gloo1", "one bucket + 1 gloo thread", bucket_cap_mb=100, gloo_threads=1),
    Variant("b100-view", "one bucket + gradient_as_bucket_view", bucket_cap_mb=100, grad_view=True),
    Variant("b100-view-static", "one bucket + gradient_as_bucket_view + static_graph", bucket_cap_mb=100,
            grad_view=True, static_graph=True),
    Variant("b100-bf16", "one bucket + bf16_compress_hook", bucket_cap_mb=100, comm_hook="bf16"),
    Variant("b100-view-bf16", "one bucket + gradient_as_bucket_view + bf16_compress_hook", bucket_cap_mb=100,
            grad_view=True, comm_hook="bf16"),
]}


# ----------------------------------------------------------------------------------------------- worker

def _worker(rank: int, world: int, v: Variant, cfg: dict, port: int, queue) -> None:
    try:
        queue.put(_measure(rank, world, v, cfg, port))
    except BaseException as exc:  # report, never hang the parent
        queue.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}"})
        raise


def _measure(rank: int, world: int, v: Variant, cfg: dict, port: int) -> dict:
    if v.pin:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import torchvision
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(v.threads)
    if v.interop:
        torch.set_num_interop_threads(v.interop)
    torch.manual_seed(0)
    model = torchvision.models.get_model(cfg["model"], num_classes=cfg["classes"])
    x = torch.randn(cfg["batch"], 3, cfg["size"], cfg["size"])
    y = torch.randint(0, cfg["classes"], (cfg["batch"],))
    if v.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    numel = sum(p.numel() for p in model.parameters())

    pg = None
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        if v.gloo_threads:
            store = dist.PrefixStore("gloo_custom", dist.distributed_c10d._get_default_store())
            opts = dist.ProcessGroupGloo._Options()
            opts._threads = v.gloo_threads
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
            pg = _gloo_group(store, rank, world, opts)
        kwargs = {"gradient_as_bucket_view": v.grad_view, "static_graph": v.static_graph}
        if v.bucket_cap_mb is not None:
            kwargs["bucket_cap_mb"] = v.bucket_cap_mb
        model = DDP(model, process_group=pg, **kwargs)
        if v.comm_hook == "bf16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            model.register_comm_hook(pg, default_hooks.bf16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    def sync():
        if world > 1:
            dist.barrier(group=pg)

    warm = []
    for _ in range(cfg["warmup"]):
        t = time.perf_counter()
        step()
        warm.append(time.perf_counter() - t)
    est = min(warm[-2:])
    n = max(3, min(2000, round(cfg["seconds"] / est)))
    if world > 1:  # every rank runs the same number of steps: rank 0's estimate wins
        nt = torch.tensor([n if rank == 0 else 0])
        dist.all_reduce(nt, group=pg)
        n = int(nt)

    out = {"rank": rank, "steps": n, "threads": torch.get_num_threads(),
           "interop": torch.get_num_interop_threads(), "affinity": sorted(os.sched_getaffinity(0))}
    def phase(key, steps, context):
        """Time `steps` steps; record wall, own CPU time and the machine's /proc/stat counters around them
        (the parent subtracts every rank's CPU time from the machine's busy time: what is left is foreign)."""
        sync()
        cpu0, t0, c0 = _cpu_counters(), time.perf_counter(), time.process_time()
        with context():
            for _ in range(steps):
                step()
        t1, c1 = time.perf_counter(), time.process_time()
        sync()
        cpu1 = _cpu_counters()
        out[key] = {"steps": steps, "wall_s": t1 - t0, "cpu_s": c1 - c0,
                    "machine": {k: cpu1[k] - cpu0[k] for k in cpu0}}

    import contextlib

    phase("ddp", n, contextlib.nullcontext)
    out["step_s"] = out["ddp"]["wall_s"] / n
    out["cpu_per_step_s"] = out["ddp"]["cpu_s"] / n
    if world > 1:
        m = max(3, n // 2)
        phase("local", m, model.no_sync)  # each rank alone: no communication, both cores still busy
        out["local_step_s"] = out["local"]["wall_s"] / m
        out["local_cpu_per_step_s"] = out["local"]["cpu_s"] / m
        sync()
        flat = torch.randn(numel)
        for _ in range(2):
            dist.all_reduce(flat, group=pg)
        sync()
        t0 = time.perf_counter()
        k = 5
        for _ in range(k):
            dist.all_reduce(flat, group=pg)
        out["raw_allreduce_s"] = (time.perf_counter() - t0) / k
        out["grad_mb"] = numel * 4 / 2**20
        sync()
        dist.destroy_process_group()
    return out


def _gloo_group(store, rank, world, opts):
    """A gloo process group with our own options (thread count), usable by DDP as ``process_group``."""
    import torch
    import torch.distributed as dist

    backend = dist.ProcessGroupGloo(store, rank, world, opts)
    group = dist.ProcessGroup(store, rank, world)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    return group


# ----------------------------------------------------------------------------------------------- parent

def _cpu_counters() -> dict:
    """CPU-seconds since boot, all cores: busy (user+nice+system+irq+softirq), softirq, steal (/proc/stat)."""
    f = [int(x) / os.sysconf("SC_CLK_TCK") for x in open("/proc/stat").readline().split()[1:9]]
    return {"busy": f[0] + f[1] + f[2] + f[5] + f[6], "softirq": f[6], "steal": f[7]}


def _busy_seconds() -> float:
    return _cpu_counters()["busy"]


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def _foreign_load(seconds: float = 1.0) -> float:
    b0 = _busy_seconds()
    time.sleep(seconds)
    return (_busy_seconds() - b0) / seconds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(v: Variant, world: int, cfg: dict, timeout: float = 180) -> dict:
    import torch.multiprocessing as mp

    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    for k in saved:
        if v.omp_env:
            os.environ[k] = str(v.threads)
        else:
            os.environ.pop(k, None)
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _free_port()
    load0 = os.getloadavg()
    cpu0, own0, t0 = _cpu_counters(), _children_cpu(), time.perf_counter()
    procs = [ctx.Process(target=_worker, args=(r, world, v, cfg, port, queue), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(1, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    wall = time.perf_counter() - t0
    cpu1 = _cpu_counters()
    # busy time of the whole machine minus our workers' own CPU time = other processes, plus the kernel's
    # softirq work for our loopback TCP (reported apart: it is ours, not foreign)
    softirq = (cpu1["softirq"] - cpu0["softirq"]) / wall
    extra = max(0.0, ((cpu1["busy"] - cpu0["busy"]) - (_children_cpu() - own0)) / wall - softirq)
    steal = (cpu1["steal"] - cpu0["steal"]) / wall
    load1 = os.getloadavg()
    for k, val in saved.items():
        if val is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = val
    ranks = []
    while not queue.empty():
        ranks.append(queue.get())
    ranks.sort(key=lambda r: r["rank"])
    res = {"variant": v.name, "world": world, "batch": cfg["batch"], "size": cfg["size"], "model": cfg["model"],
           "load_start": round(load0[0], 2), "load_end": round(load1[0], 2), "extra_load": round(extra, 2),
           "softirq_cores": round(softirq, 2), "steal_cores": round(steal, 2),
           "wall_s": round(wall, 1), "ranks": ranks}
    errors = [r["error"] for r in ranks if "error" in r]
    if errors or len(ranks) != world:
        res["error"] = errors[0] if errors else f"{len(ranks)}/{world} ranks reported (exit codes " \
                                                 f"{[p.exitcode for p in procs]})"
        return res
    # foreign load during the timed phases: machine busy time (rank 0's window) minus all ranks' CPU time
    phases = ["ddp", "local"] if world > 1 else ["ddp"]
    foreign = []
    for ph in phases:
        m = ranks[0][ph]["machine"]
        own = sum(r[ph]["cpu_s"] for r in ranks)
        foreign.append(max(0.0, (m["busy"] - m["softirq"] - own) / ranks[0][ph]["wall_s"]))
    res["extra_load_timed"] = round(max(foreign), 2)
    step = max(r["step_s"] for r in ranks)
    res["step_ms"] = step * 1e3
    res["img_s"] = world * cfg["batch"] / step
    res["cpu_per_step_ms"] = statistics.mean(r["cpu_per_step_s"] for r in ranks) * 1e3
    if world > 1:
        local = max(r["local_step_s"] for r in ranks)
        res["local_step_ms"] = local * 1e3
        res["allreduce_share"] = max(0.0, 1 - local / step)
        res["local_cpu_per_step_ms"] = statistics.mean(r["local_cpu_per_step_s"] for r in ranks) * 1e3
        res["raw_allreduce_ms"] = max(r["raw_allreduce_s"] for r in ranks) * 1e3
        res["grad_mb"] = ranks[0]["grad_mb"]
    return res


def measure(v: Variant, world: int, cfg: dict, max_extra: float, retries: int, log, wait_s: float = 120) -> dict:
    for attempt in range(retries + 1):
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:  # wait for a quiet machine before starting
            if _foreign_load(2.0) <= max_extra:
                break
        res = run_once(v, world, cfg)
        res["attempt"] = attempt
        log(res)
        if "error" in res or res["extra_load_timed"] <= max_extra:
            return res
    res["discarded"] = True
    return res


def _fmt(res: dict, max_extra: float) -> str:
    if "error" in res:
        return f"  {res['variant']:<12} {res['world']} rank(s) b{res['batch']}: ERROR {res['error']}"
    s = (f"  {res['variant']:<12} {res['world']} rank(s) b{res['batch']:<3} {res['img_s']:7.1f} img/s  "
         f"step {res['step_ms']:7.1f} ms  cpu/step {res['cpu_per_step_ms']:7.1f} ms")
    if res["world"] > 1:
        s += (f"  local {res['local_step_ms']:7.1f} ms  share {res['allreduce_share']:5.1%}  "
              f"raw allreduce {res['raw_allreduce_ms']:6.1f} ms")
    return s + (f"  | load {res['load_start']:.2f}->{res['load_end']:.2f} foreign {res['extra_load']:.2f} (timed "
                f"{res['extra_load_timed']:.2f}) softirq {res['softirq_cores']:.2f} steal {res['steal_cores']:.2f}"
                f"{' DISCARD' if res['extra_load_timed'] > max_extra else ''}")


def summarize(records: list[dict]) -> str:
    """Median over trials of each (variant, per-rank batch): a trial's 2-rank runs against its baselines."""
    med = statistics.median
    trials = {}
    for r in records:
        trials.setdefault(r["trial"], []).append(r)
    rows = {}
    for runs in trials.values():
        base = [r for r in runs if r["role"] == "baseline"]
        if not base:
            continue
        one_img = statistics.mean(r["img_s"] for r in base)
        one_step = statistics.mean(r["step_ms"] for r in base)
        for t in runs:
            if t["role"] == "ddp":
                rows.setdefault((t["variant"], t["batch"]), []).append((one_img, one_step, t))
    lines = ["| variant | per-rank batch | 1-rank img/s | 2-rank img/s | weak-scaling efficiency (min-max) | "
             "all-reduce share | 2-rank no-comm efficiency | raw all-reduce ms | n |", "|---|---|---|---|---|---|---|---|---|"]
    for (name, batch), trips in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        effs = [t["img_s"] / (2 * o) for o, _, t in trips]
        lines.append(
            f"| {name} | {batch} | {med(o for o, _, _ in trips):.1f} | {med(t['img_s'] for _, _, t in trips):.1f} | "
            f"{med(effs):.0%} ({min(effs):.0%}-{max(effs):.0%}) | {med(t['allreduce_share'] for _, _, t in trips):.0%} | "
            f"{med(s / t['local_step_ms'] for _, s, t in trips):.0%} | {med(t['raw_allreduce_ms'] for _, _, t in trips):.0f} | "
            f"{len(trips)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--variants", nargs="+", default=["default", "tuned"], help=f"from: {', '.join(VARIANTS)}")
    p.add_argument("--batches", nargs="+", type=int, default=[16], help="per-rank batch sizes")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--size", type=int, default=64, help="image side, pixels")
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--seconds", type=float, default=8.0, help="timed DDP phase length (the no_sync phase is half)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--max-extra-load", type=float, default=0.5, help="foreign cores busy above which a run is redone")
    p.add_argument("--retries", type=int, default=3)
    p.add_argument("--wait", type=float, default=120, help="seconds to wait for a quiet machine before a run")
    p.add_argument("--out", default=None, help="append every measurement here as JSON lines")
    p.add_argument("--list", action="store_true", help="list the variants and exit")
    p.add_argument("--summarize", nargs="+", default=None, metavar="JSONL",
                   help="only print the table of runs kept in these files (written by --out, as OUT.kept)")
    a = p.parse_args(argv)
    if a.list:
        for v in VARIANTS.values():
            print(f"{v.name:<16} {v.note}")
        return 0
    if a.summarize:
        print(summarize([json.loads(line) for f in a.summarize for line in open(f) if line.strip()]))
        return 0

    def log(res):
        print(_fmt(res, a.max_extra_load), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(res) + "\n")

    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; {a.model} {a.size}px; per-rank batches {a.batches}"
          f"; repeat {a.repeat}", flush=True)
    records = []

    def keep(res, trial, role):
        res.update(trial=trial, role=role)
        if "error" not in res and not res.get("discarded"):
            records.append(res)
            if a.out:
                with open(a.out + ".kept", "a") as f:
                    f.write(json.dumps(res) + "\n")

    for rep in range(a.repeat):
        for batch in a.batches:
            cfg = {"model": a.model, "size": a.size, "classes": a.classes, "batch": batch,
                   "seconds": a.seconds, "warmup": a.warmup}
            # variants whose 1-rank run is the same share one baseline, measured before AND after their
            # 2-rank runs (1, 2, 2, ..., 1): each 2-rank run is compared with the mean of the two
            groups = {}
            for name in a.variants:
                v = VARIANTS[name]
                groups.setdefault((v.threads, v.interop, v.omp_env, v.pin, v.channels_last), []).append(v)
            for members in groups.values():
                trial = f"{time.strftime('%H%M%S')}-r{rep}-b{batch}-{members[0].name}"
                keep(measure(members[0], 1, cfg, a.max_extra_load, a.retries, log, a.wait), trial, "baseline")
                for v in members:
                    keep(measure(v, 2, cfg, a.max_extra_load, a.retries, log, a.wait), trial, "ddp")
                keep(measure(members[0], 1, cfg, a.max_extra_load, a.retries, log, a.wait), trial, "baseline")
    print("\n" + summarize(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
