"""Can a script forked warm use CUDA here? The kit's warm-start server (dlokit.in_job.warm_start) imports torch and
torchvision, then forks every local script; CUDA fails in a child forked after the driver was initialised.

    python bench/gpu_fork_check.py

Prints whether those imports load the CUDA driver (libcuda.so) into the importing process and initialise it, then runs a small CUDA
computation in a script started through a local task's command (warm_start.command), twice: the first starts this
check's own server. Each says which process forked it and what CUDA computed. Exit status 1 if either failed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "helpers"))

from dlokit.in_job import warm_start  # noqa: E402

PROBE = """
import json, os, time, torch
start = time.perf_counter()
x = torch.randn(2048, 2048, device="cuda")
total = float((x @ x).sum())
print(json.dumps({"pid": os.getpid(), "parent": os.getppid(), "gpu": torch.cuda.get_device_name(),
                  "cuda_s": round(time.perf_counter() - start, 3), "sum_finite": total == total}))
"""


def main() -> int:
    probe = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1])\n"
                            f"for name in {warm_start.PRELOAD!r}: __import__(name)\n"
                            "from dlokit.in_job import warm_start\n"
                            "print(warm_start.cuda_driver_loaded() or 'none', '| initialised:',"
                            " warm_start.cuda_initialised() or 'no')",
                            str(REPO / "helpers")], capture_output=True, text=True)
    print(f"after importing {', '.join(warm_start.PRELOAD)}, the CUDA driver mapped: {probe.stdout.strip()}"
          f"{probe.stderr.strip()[-300:]}")
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "XDG_RUNTIME_DIR": tmp, warm_start.SWITCH: "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "helpers"), os.environ.get("PYTHONPATH")]))}
        for attempt in ("first (starts the server)", "second"):
            started = time.perf_counter()
            out = subprocess.run(warm_start.command(sys.executable, ["-c", PROBE]), env=env, capture_output=True,
                                 text=True, timeout=300)
            wall = time.perf_counter() - started
            facts = list((Path(tmp) / "dlokit-warm").glob("*.json"))
            server = json.loads(facts[0].read_text())["pid"] if facts else None
            cold = [p.name for p in (Path(tmp) / "dlokit-warm").glob("*.cold")]
            if out.returncode:
                failed = 1
                print(f"{attempt}: exit {out.returncode} after {wall:.1f} s: {out.stderr.strip()[-500:]}")
                continue
            seen = json.loads(out.stdout.strip().splitlines()[-1])
            how = "forked by the server" if seen["parent"] == server else f"cold{' (' + cold[0] + ')' if cold else ''}"
            print(f"{attempt}: {how}, {wall:.1f} s in all, CUDA {seen['cuda_s']} s on {seen['gpu']}, "
                  f"result finite: {seen['sum_finite']}")
        for facts in (Path(tmp) / "dlokit-warm").glob("*.json"):
            try:
                os.kill(json.loads(facts.read_text())["pid"], 15)
            except (ProcessLookupError, ValueError, KeyError):
                pass
    return failed


if __name__ == "__main__":
    sys.exit(main())
