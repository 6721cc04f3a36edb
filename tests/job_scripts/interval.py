"""Prints when it ran and on which cores, as one JSON line, after a short busy wait.

interval.py SECONDS [FOLDER COUNT]: with a folder, first meets COUNT jobs there (see meet.py); "met" says whether
they all arrived, and the busy wait starts once they have."""
import json
import os
import sys
import time

from meet import meet

met = meet(sys.argv[2], int(sys.argv[3])) if len(sys.argv) > 3 else None
start = time.time()
deadline = start + float(sys.argv[1] if len(sys.argv) > 1 else 1.0)
while time.time() < deadline:
    pass
print(json.dumps({"start": start, "end": time.time(), "cpus": sorted(os.sched_getaffinity(0)),
                  "omp": os.environ.get("OMP_NUM_THREADS"), "devices": os.environ.get("DLOKIT_DEVICES"),
                  "run_id": os.environ.get("DLOKIT_RUN_ID"), "met": met}), flush=True)
