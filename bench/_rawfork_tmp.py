import os, sys, ctypes
sys.path.insert(0, "helpers")
from dlokit.in_job import warm_start
for name in warm_start.PRELOAD:
    __import__(name)
    print(f"after {name}: driver {warm_start.cuda_driver_loaded() or 'none'}; initialised: {warm_start.cuda_initialised() or 'no'}", flush=True)
pid = os.fork()
if pid == 0:
    import torch
    x = torch.randn(1024, 1024, device="cuda"); print("raw fork child: CUDA ok, finite", bool(torch.isfinite(x @ x).all()), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0); print("raw fork child exit status", status)
