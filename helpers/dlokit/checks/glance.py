"""The day at a glance: did every job of the day end as it should? A failed or timed-out job is a ❌ here, with its
cause, whatever the cell that used it printed; a demonstration meant to fail that completed says why, from its run
record, and which TODO it points to."""
from __future__ import annotations

from .framework import check, failed, passed
from .records import ids, observed


@check("the day's jobs")
def day_jobs(job_ids, expected: dict | None = None):
    """Every job COMPLETED, or ended the way its TP meant it to (`expected`: {job id: state, or a tuple of the states
    it may end in}, e.g. the DDP job of TP4.2 that must run out of memory, a trial the HPO pruner cancelled, a run of
    TP4.2's batch scan that fits or runs out of memory; else what its job card expects: submit(..., expected=)).
    The result's info `by_design` lists the jobs that failed as meant: what the class report counts."""
    from dlokit.submission.jobs import job_outcome

    wanted = ids(job_ids)
    expected = {str(k): (v,) if isinstance(v, str) else tuple(v) for k, v in (expected or {}).items()}
    if not wanted:
        return failed("no job id given: pass day.submitted")
    outcomes = [job_outcome(job) for job in wanted]
    cards = {job: _card(job) for job in wanted}
    expected = {**{job: tuple(card.expected) for job, card in cards.items() if card and card.expected}, **expected}
    wrong = [o for o in outcomes if o.state not in expected.get(o.job_id, ("COMPLETED",))]
    by_design = [o.job_id for o in outcomes if o.state != "COMPLETED" and o.state in expected.get(o.job_id, ())]
    details = [f"job {o.job_id}: {o.state}" + (" (as TP meant)" if o.job_id in expected else "")
               for o in outcomes if o.state != "COMPLETED"]
    if wrong:
        lines = [_wrong_line(o, expected.get(o.job_id, ("COMPLETED",)), cards[o.job_id]) for o in wrong]
        lines.sort(key=lambda line: "TODO" not in line)  # the one that says what to do first
        return failed(f"{len(wrong)} of {len(outcomes)} jobs did not end as they should: {lines[0]}",
                      lines[1:] + details, by_design=by_design)
    return passed(f"all {len(outcomes)} jobs ended as they should"
                  + (f" ({len(by_design)} failed by design: see below)" if by_design else ""), details,
                  by_design=by_design)


def _wrong_line(outcome, meant: tuple, card) -> str:
    """One job that did not end as it should: its cause; for a demonstration meant to fail that completed, what it
    was meant to show and why it did not, with the TODO its record points to."""
    if outcome.state != "COMPLETED" or "COMPLETED" in meant:
        cause = (outcome.error or outcome.cause).strip()  # error: where in the student's files
        because = failed_because(outcome.job_id)
        return (f"job {outcome.job_id} {outcome.state}" + (f" because {because}" if because else "")
                + (f": {cause.splitlines()[-1]}" if cause else ""))
    whys = card.expected if card else {}
    tag = (card.extra.get("tag") if card else None) or ""
    ends = " or ".join(f"{state} ({whys[state]})" if whys.get(state) else state for state in meant)
    because = completed_because(outcome.job_id)
    return (f"job {outcome.job_id}{f' ({tag})' if tag else ''} should have ended {ends}, but it completed"
            + (f" because {because}" if because else ": was the demonstration's option changed?"))


def completed_because(job_id: str, runs_dir=None) -> str:
    """Why a job meant to fail completed, when its run record shows a TODO left untouched; "" when it shows none:
    several ranks without DistributedDataParallel (TP2.2's TODO) wait for nothing, so a demonstration of what DDP
    refuses (TP2.3's blocks without gradients) trains. `runs_dir`: the class report's (default: the profile's)."""
    from dlokit.analysis import load_run
    from dlokit.submission.profiles import current_profile

    try:
        run = load_run(str(job_id), runs_dir or current_profile().runs)
    except (OSError, ValueError):
        return ""
    if run.world_size > 1 and observed(run).get("ddp_wrapped") is False:
        return (f"DDP is not set up: its {run.world_size} ranks each trained their own copy of the model, so none "
                "waited for another — TODO TP2.2")
    return ""


def failed_because(job_id: str, runs_dir=None) -> str:
    """Why a job failed, when its run record shows a TODO left untouched; "" when it shows none: an FSDP2 run whose
    ranks each held the whole model's weights (measured from their tensors once laid out: train_llm.py's `observed`
    params_bytes) ran out of memory because nothing was sharded."""
    from dlokit.analysis import load_run
    from dlokit.submission.profiles import current_profile

    from .day4 import FSDP_TODO, SHARDED

    try:
        run = load_run(str(job_id), runs_dir or current_profile().runs)
    except (OSError, ValueError):
        return ""
    weights = 4 * float(run.config.get("n_params") or 0)  # the model's fp32 weights
    observed = [(r.get("run") or {}).get("observed") for r in run.ranks.values()]
    held = [float(o.get("params_bytes") or 0) for o in observed if isinstance(o, dict)]
    if run.config.get("data_parallel") != "fsdp" or not weights or not held or min(held) < SHARDED * weights:
        return ""
    return (f"FSDP2 sharded nothing: each of its {len(held)} ranks held {min(held) / weights:.2f} of the model's "
            f"weights — {FSDP_TODO}")


def _card(job_id: str):
    """The job's card (what submit's `expected=` stored with it); None when there is none."""
    from dlokit.submission.jobs import find_card

    try:
        return find_card(job_id)
    except LookupError:
        return None
