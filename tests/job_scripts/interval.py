"""Prints when it ran and on which cores, as one JSON line, after a short busy wait."""
import json
import os
import sys
import time

start = time.time()
deadline = start + float(sys.argv[1] if len(sys.argv) > 1 else 1.0)
while time.time() < deadline:
    pass
print(json.dumps({"start": start, "end": time.time(), "cpus": sorted(os.sched_getaffinity(0)),
                  "omp": os.environ.get("OMP_NUM_THREADS"), "devices": os.environ.get("DLOKIT_DEVICES"),
                  "run_id": os.environ.get("DLOKIT_RUN_ID")}), flush=True)
