"""Course-compatible facade: cells written for the original course's `idr_pytools` run unchanged.

    from idr_pytools import gpu_jobs_submitter, display_slurm_queue, search_log
"""
from dlokit.submission.jobs import search_log
from dlokit.submission.queue import display_slurm_queue
from dlokit.submission.submit import gpu_jobs_submitter

__all__ = ["display_slurm_queue", "gpu_jobs_submitter", "search_log"]
