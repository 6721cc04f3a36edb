"""DLO-Kit: submit course jobs, watch them, and read what they report.

    import dlokit
    dlokit.use_profile("local")                    # or "slurm", "jean-zay", your own
    ids = dlokit.gpu_jobs_submitter("train_classifier.py --test", n_gpu=1, name="alice")
    dlokit.display_slurm_queue("alice")
    print(dlokit.job_outcome(ids[0]))
"""
import importlib

from .jobs import JobCard, Outcome, SchedulerError, cancel, job_outcome, search_log, show_script, wait
from .jobspec import JobSpec, JobSpecError, plan, sbatch_preview
from .profiles import Profile, ProfileError, current_profile, get_profile, use_profile
from .submit import gpu_jobs_submitter, submit
from .day import Day, LlmDay, setup_day, setup_llm_day

__version__ = "0.1.0"
# Loaded on first use: the local launcher and every job's task import dlokit's small modules before a job
# starts, and should not pay for pandas (the queue's table) on each job.
_LAZY = {"display_slurm_queue": "queue", "job_table": "queue"}
__all__ = [
    "Day", "LlmDay", "setup_day", "setup_llm_day", "JobCard", "JobSpec", "JobSpecError", "Outcome", "Profile", "SchedulerError", "ProfileError", "cancel", "current_profile",
    "display_slurm_queue", "get_profile", "gpu_jobs_submitter", "job_outcome", "job_table", "plan",
    "sbatch_preview", "search_log", "show_script", "submit", "use_profile", "wait",
]


def __getattr__(name: str):
    """The public names above, and `dlokit.hpo` (Day 3, Optuna), imported on first use."""
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    if name == "hpo":
        return importlib.import_module(".hpo", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
