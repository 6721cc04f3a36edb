"""train_classifier.py (the solution) with one rank stuck where it cannot reach the next collective:
`--stuck-rank R` makes rank R's validation pass hang, `--frozen` while holding Python's GIL (its process runs
no Python at all, as a deadlock in C code would), else in plain Python (its threads still run); `--stall-s S`
shortens dlokit.in_job.peers.STALL_S. A test tool, never part of the course: the training script has no such hook."""
import ctypes
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tp_scripts" / "solutions"))
import train_classifier  # noqa: E402
from common import evaluation  # noqa: E402  (the module whose end_of_epoch calls evaluate)

from dlokit.in_job import peers  # noqa: E402  (RankWatch reads STALL_S from there)


def stuck_evaluate(*args, **kwargs):
    if int(os.environ.get("RANK", "0")) == stuck_rank:
        if frozen:
            ctypes.PyDLL(None).sleep(3600)  # a C call that keeps the GIL: no Python thread of this process runs
        while True:
            time.sleep(1)
    return evaluate(*args, **kwargs)


if __name__ == "__main__":  # the ranks' DataLoader workers import this file too (a forkserver's children do)
    argv = sys.argv[1:]
    stuck_rank = int(argv[argv.index("--stuck-rank") + 1])
    frozen = "--frozen" in argv
    if "--stall-s" in argv:
        peers.STALL_S = float(argv[argv.index("--stall-s") + 1])
    ours = ("--stuck-rank", "--stall-s")
    argv = [a for i, a in enumerate(argv) if a not in (*ours, "--frozen") and (i == 0 or argv[i - 1] not in ours)]
    evaluate = evaluation.evaluate
    evaluation.evaluate = stuck_evaluate
    sys.exit(train_classifier.main(argv))
