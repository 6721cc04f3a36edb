"""A rendezvous for test jobs that must run at the same time: each one leaves a mark in a folder and waits
(at most a minute) for `count` marks, so "they ran side by side" does not depend on how fast jobs start."""
import os
import time
from pathlib import Path


def meet(folder: str, count: int, timeout_s: float = 60.0) -> bool:
    """True when all `count` jobs arrived; False after the timeout (they could not run together)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"{os.getpid()}.here").touch()
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if len(list(Path(folder).glob("*.here"))) >= count:
            return True
        time.sleep(0.05)
    return False
