"""Takes argv[1] MB of memory, 20 MB at a time (each page touched), then holds it for argv[2] seconds."""
import sys
import time

wanted_mb, hold_s = int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 5.0
held = []
print(f"taking {wanted_mb} MB", flush=True)
for _ in range(wanted_mb // 20):
    held.append(bytearray(b"x" * (20 * 1024 ** 2)))
    time.sleep(0.05)
print(f"holding {wanted_mb} MB", flush=True)
time.sleep(hold_s)
