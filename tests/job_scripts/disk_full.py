"""Writes a run record on a disk that fills up before the summary: every rename reports ENOSPC."""
import errno
import os

from dlokit.in_job.runrecord import RunRecorder

record = RunRecorder({"job": "disk_full"})
record.log("step", step=0)


def full(src, dst):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


os.replace = full
record.finish()
