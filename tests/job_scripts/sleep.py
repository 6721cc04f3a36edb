import sys
import time

print("sleeping", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 600)
