"""Starts argv[1] child processes that each take argv[2] MB (hog.py) and hold it, then waits for them."""
import subprocess
import sys
from pathlib import Path

count, each_mb = int(sys.argv[1]), sys.argv[2]
hog = Path(__file__).with_name("hog.py")
children = [subprocess.Popen([sys.executable, str(hog), each_mb, "20"]) for _ in range(count)]
sys.exit(max(child.wait() for child in children))
