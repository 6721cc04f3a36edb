"""Writes a run record and a metrics line every 0.2 s until stopped (or for argv[1] seconds)."""
import sys
import time

from dlokit.runrecord import RunRecorder

record = RunRecorder({"job": "recorded_sleep"})
print("recording", flush=True)
end = time.time() + (float(sys.argv[1]) if len(sys.argv) > 1 else 600)
step = 0
while time.time() < end:
    record.log("step", step=step)
    print(f"step {step}", flush=True)
    step += 1
    time.sleep(0.2)
record.finish()
