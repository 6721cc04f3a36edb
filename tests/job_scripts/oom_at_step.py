"""Run a training script with a fake out-of-memory error in it (tests only: the scripts carry no test hook).

    python oom_at_step.py RANK:STEP path/to/script.py ARGS...

On rank RANK (the RANK variable, 0 when unset) the STEP-th backward pass raises torch.OutOfMemoryError, as an
allocation that fails during backward would; every other rank runs the script untouched. The script runs as
`python script.py ARGS` would: as __main__, with its own folder first on sys.path.
"""
import os
import runpy
import sys
from pathlib import Path

import torch

where, script, *args = sys.argv[1:]
rank, step = (int(part) for part in where.split(":"))
if int(os.environ.get("RANK", "0")) == rank:
    real_backward, calls = torch.autograd.backward, [0]

    def backward(*arguments, **options):
        calls[0] += 1
        if calls[0] == step:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Injected at step {step} by {Path(__file__).name} "
                                         "(a test, not a real allocation failure)")
        return real_backward(*arguments, **options)

    torch.autograd.backward = backward  # Tensor.backward calls it too
sys.argv = [script, *args]
sys.path[0] = str(Path(script).resolve().parent)
runpy.run_path(script, run_name="__main__")
