"""What the checks read: a job's run record, its `observed` block, the hardware it ran on, ratios."""
from __future__ import annotations

import math

from dlokit.analysis import stats
from dlokit.analysis.compare import STEP_METRICS
from dlokit.analysis.table import as_number
from dlokit.in_job.divergence import diverging
from dlokit.in_job.runrecord import is_number

from .framework import CheckResult, failed


def ids(job_ids) -> list[str]:
    """Job ids from one id, a list of ids, or objects with a run_id (Run, JobCard...)."""
    if job_ids is None:
        return []
    if isinstance(job_ids, (str, int)) or hasattr(job_ids, "run_id"):
        job_ids = [job_ids]
    return [str(getattr(j, "run_id", j)) for j in job_ids]


def why_not_finished(job_id: str, run) -> str:
    """A sentence on a job that has no complete record, with the cause when the scheduler knows it."""
    try:
        from dlokit.submission.jobs import job_outcome

        outcome = job_outcome(job_id)
        state, cause = outcome.state, outcome.error or outcome.cause  # error: where in the student's files
    except Exception:
        state, cause = None, ""
    if state in ("RUNNING", "PENDING"):
        return f"job {job_id} is still {state.lower()}: run the queue cell above until it ends, then this one"
    if run.state == "missing":
        head = f"job {job_id} left no run record"
    else:
        head = f"job {job_id} did not finish ({run.state})"
    if state:
        head += f"; the scheduler says {state}"
    last = cause.strip().splitlines()[-1] if cause and cause.strip() else ""
    last = last or (run.error or "")
    if last:
        head += f" — {last[:200]}"
    if run.oom or state == "OUT_OF_MEMORY":
        head += ". It ran out of memory: lower the batch size (or use mixed precision)"
    return head + ". Read its log (dlokit.search_log(contains='" + job_id + "', with_err=True)), fix, resubmit"


def load(job_id):
    """(Run, None) for a completed run, else (Run or None, a sentence saying what is wrong)."""
    from dlokit.analysis import load_run
    from dlokit.submission.profiles import current_profile

    run = load_run(str(job_id), current_profile().runs)
    if run.state != "completed":
        return run, why_not_finished(str(job_id), run)
    return run, None


def load_last(job_ids):
    """(the completed run of the last id given, None), or (None, a failed result saying what is wrong)."""
    wanted = ids(job_ids)
    if not wanted:
        return None, failed("no job id given: pass the id the submission cell returned")
    run, problem = load(wanted[-1])
    return (None, failed(problem)) if problem else (run, None)


def load_completed(job_ids) -> tuple[list, CheckResult | None]:
    """Load every run; returns (completed runs, a failed result when one is missing/unfinished/unobserved)."""
    wanted = ids(job_ids)
    if not wanted:
        return [], failed("no job id given: pass the ids the submission cell returned")
    runs, problems = [], []
    for job_id in wanted:
        run, problem = load(job_id)
        if problem:
            problems.append(problem)
        else:
            runs.append(run)
    if problems:
        return runs, failed(problems[0], problems[1:])
    missing = [r.run_id for r in runs if not observed(r)]
    if missing:
        return runs, failed(f"run(s) {', '.join(missing)} recorded no 'observed' block: were they made by the "
                            "kit's train_classifier.py?")
    return runs, None


def load_baseline(job_id) -> tuple[object, CheckResult | None]:
    run, problem = load(job_id)
    return run, failed(f"baseline: {problem}") if problem else None


def load_with_optional_baseline(job_ids, baseline_id=None):
    """(runs, baseline run or None, problem): the judged runs must be complete; a baseline that is not
    usable only drops the comparison."""
    runs, problem = load_completed(job_ids)
    if problem or baseline_id is None:
        return runs, None, problem
    base, base_problem = load_baseline(baseline_id)
    return runs, None if base_problem else base, None


def divergence(run) -> str | None:
    """'run …: diverging: loss … at step …' when the run's last step line with a loss is above chance after the
    warm-up, the rule its step lines were printed with (dlokit.in_job.divergence); else None."""
    lines = [m for m in run.rank0["metrics"] if m.get("kind") == "step" and is_number(m.get("loss"))]
    if not lines:
        return None
    last = lines[-1]
    note = diverging(float(last["loss"]), step=last.get("step", 0), num_classes=run.config.get("num_classes"),
                     warmup_steps=run.config.get("warmup_steps"), lr_peak=as_number(run.config.get("lr_peak")))
    return note and f"run {run.run_id}: {note}"


def observed(run) -> dict:
    """What the script saw on its first step (run.json, else summary.json); {} when absent."""
    return run.info.get("observed") or run.summary.get("observed") or {}


def hardware_words(run) -> str:
    hardware = run.info.get("hardware") or {}
    if run.on_gpu:
        return hardware.get("gpu_name") or "a GPU"
    cores = hardware.get("cpu_count")
    return f"a CPU-only run ({cores} cores)" if cores else "a CPU-only run"


def number(run, key):
    return as_number(run.summary.get(key)) if run is not None else None


def memory_key(run) -> str:
    return "gpu_mem_peak_mb" if number(run, "gpu_mem_peak_mb") is not None else "host_rss_peak_mb"


def measured(run, key):
    """A run's value of `key` as the verdicts and the comparison tables read it: the median of its settled steps
    for what is measured every step (so a check's line shows the same ratio as the verdict beside it), else
    the summary's number (a peak, a total)."""
    if run is not None and key in STEP_METRICS:
        value = stats.estimate(run, key).value
        if math.isfinite(value):
            return value
    return number(run, key)


def compare_text(label, run, base, key, unit) -> str:
    """'compute throughput: 102.1 img/s vs 83.17 img/s (×1.23 [1.02–1.32])': the ratio's interval from the steps
    when `key` is measured every step; a peak or a total has one number per run, so its ratio has none."""
    value, reference = measured(run, key), measured(base, key)
    if value is None or reference in (None, 0):
        return f"{label}: not measured"
    estimate = stats.ratio(base, run, key) if key in STEP_METRICS else stats.NO_ESTIMATE
    factor = estimate.text() if estimate.usable else f"×{value / reference:.2f}"
    # from the steps: the median step after the warm-up, which the verdicts divide (runs_table shows the script's mean)
    which = " (median step)" if key in STEP_METRICS and value != number(run, key) else ""
    return f"{label}{which}: {value:.4g} {unit} vs {reference:.4g} {unit} ({factor})"


def arms_by(runs, key: str) -> dict[str, list]:
    """Completed runs grouped by a config value (repeats of one command form one arm), in order of appearance."""
    arms: dict[str, list] = {}
    for run in runs:
        arms.setdefault(str(run.config.get(key)), []).append(run)
    return arms


def effect_part(name: str, effect: str, base_runs, arms: dict, *, on_gpu_run: bool, gpu_failure: str | None = None,
                what: str = "{label}"):
    """The measured effect of an optimisation, as one part, judged by dlokit.lessons exactly as the notebook's
    verdict cell judges it: the interval agrees (✅), contradicts (❌ on a GPU when `gpu_failure` says what to
    try, else ℹ️), is within noise (ℹ️), or the lesson needs hardware these runs did not have (➖)."""
    from dlokit import lessons
    from dlokit.analysis import stats

    from .framework import FAILED, INFO, NOT_APPLICABLE, PASSED, part

    if not base_runs or not arms:
        return None
    verdicts = [lessons.verdict_of(effect, stats.ratio(base_runs, runs, lessons.LESSONS[effect].metric), on_gpu_run,
                                   what.format(label=label)) for label, runs in arms.items()]
    measured = "; ".join(f"{v.what}: {v.measured_text}" + ("" if v.outcome == lessons.NOT_APPLICABLE else f" — {v.outcome}")
                         for v in verdicts)
    outcomes = {v.outcome for v in verdicts}
    if outcomes == {lessons.NOT_APPLICABLE}:
        return part(name, NOT_APPLICABLE, f"{lessons.LESSONS[effect].gpu_only}; measured {measured}")
    if lessons.AGREES in outcomes:
        return part(name, PASSED, f"{lessons.LESSONS[effect].expectation}, as measured: {measured}")
    if lessons.CONTRADICTS in outcomes and gpu_failure and on_gpu_run:
        return part(name, FAILED, f"{gpu_failure} (measured {measured})")
    return part(name, INFO, f"the lesson: {lessons.LESSONS[effect].expectation}; measured {measured}")
