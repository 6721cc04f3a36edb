"""Writes a run record and a metrics line every 0.2 s until stopped (or for argv[1] seconds).

recorded_sleep.py SECONDS FOLDER COUNT: first meets COUNT jobs in FOLDER (see meet.py), then records."""
import sys
import time

from dlokit.in_job.runrecord import RunRecorder
from meet import meet

record = RunRecorder({"job": "recorded_sleep"})
if len(sys.argv) > 3 and not meet(sys.argv[2], int(sys.argv[3])):
    sys.exit("the other jobs never arrived")
print("recording", flush=True)
end = time.time() + (float(sys.argv[1]) if len(sys.argv) > 1 else 600)
step = 0
while time.time() < end:
    record.log("step", step=step)
    print(f"step {step}", flush=True)
    step += 1
    time.sleep(0.2)
record.finish()
