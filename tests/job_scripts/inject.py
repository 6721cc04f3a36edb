"""Run a training script with a fault in it (tests only: the scripts carry no test hook).

    python inject.py oom RANK:STEP path/to/script.py ARGS...             # also under torchrun, as the script
    python inject.py slow-checkpoint SECONDS path/to/script.py ARGS...

oom: on rank RANK (the RANK variable, 0 when unset) the STEP-th backward pass raises torch.OutOfMemoryError, as an
allocation that fails during backward would. slow-checkpoint: rank 0 of train_classifier.py takes SECONDS more to
write its records after a signal's checkpoint, as a large checkpoint on a slow file system would. Every other rank
runs untouched. The script runs as `python script.py ARGS` would: as __main__, its own folder first on sys.path.
"""
import os
import runpy
import sys
import time
from pathlib import Path

import torch

fault, value, script, *args = sys.argv[1:]
rank = int(os.environ.get("RANK", "0"))
sys.argv = [script, *args]
sys.path[0] = str(Path(script).resolve().parent)

if fault == "oom":
    oom_rank, oom_step = (int(part) for part in value.split(":"))
    if rank == oom_rank:
        real_backward, calls = torch.autograd.backward, [0]

        def backward(*arguments, **options):
            calls[0] += 1
            if calls[0] == oom_step:
                raise torch.OutOfMemoryError(f"CUDA out of memory. Injected at step {oom_step} by {Path(__file__).name} "
                                             "(a test, not a real allocation failure)")
            return real_backward(*arguments, **options)

        torch.autograd.backward = backward  # Tensor.backward calls it too
elif fault == "slow-checkpoint":
    if rank == 0:
        from common import instrument  # the package beside the script (sys.path[0])

        real_checkpointed = instrument.Instrument.checkpointed

        def checkpointed(self, **extra):
            time.sleep(float(value))
            return real_checkpointed(self, **extra)

        instrument.Instrument.checkpointed = checkpointed
else:
    sys.exit(f"inject.py: unknown fault {fault!r} (oom or slow-checkpoint)")
runpy.run_path(script, run_name="__main__")
