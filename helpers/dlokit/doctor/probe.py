"""What `dlokit doctor` runs inside its jobs: `python -u probe.py KIND [ARGS]`, one small check per job.

Each task prints one line `DLOKIT_DOCTOR {json}` on stdout (the doctor reads the job's log); a probe that
cannot run its check says why in that line ("skip") instead of failing, so that a missing GPU is "not
checked" and only a broken path is a failure. Plain torch, nothing of the course's scripts: what fails here is
the site, not a TP.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

MARK = "DLOKIT_DOCTOR "
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


def say(**fields) -> None:
    print(MARK + json.dumps({"host": socket.gethostname(), "rank": int(os.environ.get("RANK", 0)), **fields}),
          flush=True)


def env_probe(login_files: list[str]) -> None:
    """Versions of what this node's python imports; the login node's files read here, this node's written beside."""
    found = {"python": sys.executable, "python_version": sys.version.split()[0]}
    for module in ("torch", "dlokit", "submitit"):
        try:
            imported = __import__(module)
            found[module] = getattr(imported, "__version__", "?")
            if module == "torch":
                found["gpus"] = imported.cuda.device_count()
        except Exception as err:  # the check reports it: a node's python without torch is the finding
            found[module + "_error"] = f"{type(err).__name__}: {err}"
    shared = {}
    for name in login_files:
        path = Path(name)
        try:
            shared[name] = path.read_text().strip()
            path.with_suffix(".node").write_text(socket.gethostname())
        except OSError as err:
            shared[name] = f"error: {err.strerror or err}"
    say(probe="env", **found, shared=shared)


def ranks_probe() -> None:
    """Every task adds rank + 1 in one all-reduce; on GPUs, NCCL's bus bandwidth for 64 MiB."""
    import torch
    import torch.distributed as dist

    from dlokit.in_job import rank

    env = rank.detect()
    device = rank.init_process_group()
    value = torch.tensor([env.rank + 1.0], device=device)
    dist.all_reduce(value)
    fields = {"world_size": env.world_size, "sum": value.item(), "backend": dist.get_backend()}
    if device.type == "cuda":
        block = torch.ones(16 * 2 ** 20, device=device)  # 64 MiB of fp32
        dist.all_reduce(block)
        torch.cuda.synchronize()
        start, repeats = time.perf_counter(), 5
        for _ in range(repeats):
            dist.all_reduce(block)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / repeats
        # bus bandwidth: what each GPU sends and receives in a ring all-reduce, 2 (n - 1) / n of the buffer
        fields["bus_gb_s"] = round(block.numel() * 4 * 2 * (env.world_size - 1) / env.world_size / seconds / 1e9, 2)
    say(probe="ranks", **fields)
    rank.destroy_process_group()


def cuda_or_skip(probe: str):
    import torch

    if not torch.cuda.is_available():
        say(probe=probe, skip="no GPU on this node")
        sys.exit(0)
    return torch


def gpu_device_probe() -> None:
    """A tensor on each visible GPU; the GPU the task computes on is one the scheduler gave it."""
    torch = cuda_or_skip("gpu-device")
    names = []
    for index in range(torch.cuda.device_count()):
        x = torch.ones(1024, device=f"cuda:{index}")
        assert float((x * 2).sum()) == 2048.0
        names.append(torch.cuda.get_device_name(index))
    given = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    used = str(getattr(torch.cuda.get_device_properties(0), "uuid", "") or "")
    try:
        import pynvml

        from dlokit.in_job.measure import nvml_handle

        pynvml.nvmlInit()
        nvml_index = pynvml.nvmlDeviceGetIndex(nvml_handle(pynvml, torch.device("cuda", 0)))
    except Exception as err:
        nvml_index = f"unknown ({type(err).__name__}: {err})"
    say(probe="gpu-device", gpus=names, cuda_visible_devices=given, cuda0_uuid=used, cuda0_nvml_index=nvml_index)


def gpu_amp_probe() -> None:
    """A training step under autocast fp16 with GradScaler, and one under bf16 where the GPU has it."""
    torch = cuda_or_skip("gpu-amp")
    model = torch.nn.Linear(256, 256).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    x = torch.randn(64, 256, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        out = model(x)
    scaler.scale(out.float().pow(2).mean()).backward()
    scaler.step(optimizer)
    scaler.update()
    bf16 = None
    if torch.cuda.is_bf16_supported():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            bf16 = str(model(x).dtype)
    say(probe="gpu-amp", fp16=str(out.dtype), bf16=bf16, scale=scaler.get_scale(),
        finite=bool(torch.isfinite(model.weight).all()))


def gpu_channels_last_probe() -> None:
    torch = cuda_or_skip("gpu-channels-last")
    conv = torch.nn.Conv2d(16, 32, 3, padding=1).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(8, 16, 32, 32, device="cuda").to(memory_format=torch.channels_last)
    out = conv(x)
    say(probe="gpu-channels-last", channels_last=out.is_contiguous(memory_format=torch.channels_last))


def gpu_profiler_probe() -> None:
    """A CUDA trace read back by the kit's own reader: kernels with a duration."""
    torch = cuda_or_skip("gpu-profiler")
    from torch.profiler import ProfilerActivity, profile

    from dlokit.analysis.profiler import on_device, read_trace

    x = torch.randn(1024, 1024, device="cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            x = x @ x / 1024
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        kernels = [e for e in read_trace(path) if on_device(e)]
    say(probe="gpu-profiler", kernels=len(kernels), kernel_us=round(sum(float(e.get("dur", 0)) for e in kernels), 1))


def gpu_energy_probe() -> None:
    """NVML's energy counter of the task's own physical GPU, as the run records read it."""
    torch = cuda_or_skip("gpu-energy")
    from dlokit.in_job.measure import EnergyMeter

    meter = EnergyMeter(torch.device("cuda", 0))
    say(probe="gpu-energy", gpu_uuid=meter.gpu_uuid, unavailable=meter.unavailable)


def fsdp_probe() -> None:
    """FSDP2 on the job's GPUs: each rank holds its shard of every weight, and one step runs."""
    torch = cuda_or_skip("fsdp")
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from dlokit.in_job import rank

    env = rank.detect()
    device = rank.init_process_group()
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512)).to(device)
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    model(torch.randn(4, 512, device=device)).sum().backward()
    local = sum(p.to_local().numel() for p in model.parameters())
    whole = sum(p.numel() for p in model.parameters())
    say(probe="fsdp", world_size=env.world_size, local_share=round(local / whole, 3), backend=dist.get_backend())
    rank.destroy_process_group()


def compile_device() -> str:
    """Where the course compiles: a GPU node's first GPU (TP3.3 and TP4.2 compile there), else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def compile_probe() -> None:
    """torch.compile of a small function gives eager's answer on the device the course compiles for: on a GPU, Inductor's
    Triton kernels; on a CPU, its C++ (the node's compiler). Either way this user's kernel cache."""
    import torch

    def f(x):
        return torch.sin(x) * 2 + x.cos()

    device = compile_device()
    where = {"device": device, "backend": "triton" if device == "cuda" else "cpp",
             "cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")}
    if device == "cuda":
        where["gpu"] = torch.cuda.get_device_name(0)
    x = torch.randn(1000, device=device)
    start = time.perf_counter()
    try:
        compiled = torch.compile(f)(x)
        same = bool(torch.allclose(compiled, f(x), atol=1e-5))  # .item() waits for the device's kernels
    except Exception as err:  # the compiler's own message is the finding
        say(probe="compile", error=f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:400]}", **where)
        return
    say(probe="compile", same=same, seconds=round(time.perf_counter() - start, 1), **where)


def data_probe(folder: str, generated: str) -> None:
    """The data set the course reads has the ImageNet layout (train/ and val/, a folder per class, images), or
    the generated one can be written where the notebooks put it."""
    if folder:
        root, found = Path(folder), {}
        for split in ("train", "val"):
            classes = [d for d in (root / split).iterdir() if d.is_dir()] if (root / split).is_dir() else []
            images = sum(1 for d in classes[:5] for f in d.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
            found[split] = {"classes": len(classes), "images_in_first_classes": images}
        say(probe="data", folder=folder, layout=found)
        return
    target = Path(generated)
    try:
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target, prefix=".doctor-"):
            pass
        say(probe="data", generated=generated, writable=True)
    except OSError as err:
        say(probe="data", generated=generated, writable=False, error=str(err))


def sleep_probe(seconds: str) -> None:
    say(probe="sleep", started=True)
    time.sleep(float(seconds))


PROBES = {"env": lambda *files: env_probe(list(files)), "ranks": ranks_probe, "gpu-device": gpu_device_probe,
          "gpu-amp": gpu_amp_probe, "gpu-channels-last": gpu_channels_last_probe, "gpu-profiler": gpu_profiler_probe,
          "gpu-energy": gpu_energy_probe, "fsdp": fsdp_probe, "compile": compile_probe, "data": data_probe,
          "sleep": sleep_probe}

if __name__ == "__main__":
    print(MARK.strip() + " started", file=sys.stderr, flush=True)  # what the job's setup lines said comes before
    PROBES[sys.argv[1]](*sys.argv[2:])
