"""The day at a glance: did every job of the day end as it should? A failed or timed-out job is a ❌ here, with its
cause, whatever the cell that used it printed."""
from __future__ import annotations

from .framework import check, failed, passed
from .records import ids


@check("the day's jobs")
def day_jobs(job_ids, expected: dict | None = None):
    """Every job COMPLETED, or ended the way its TP meant it to (`expected`: {job id: state, or a tuple of the states
    it may end in}, e.g. the DDP job of TP4.2 that must run out of memory, a trial the HPO pruner cancelled, a run of
    TP4.2's batch scan that fits or runs out of memory; else what its job card expects: submit(..., expected=))."""
    from dlokit.submission.jobs import job_outcome

    wanted = ids(job_ids)
    expected = {str(k): (v,) if isinstance(v, str) else tuple(v) for k, v in (expected or {}).items()}
    if not wanted:
        return failed("no job id given: pass day.submitted")
    outcomes = [job_outcome(job) for job in wanted]
    expected = {**{job: meant for job in wanted if (meant := _card_expects(job))}, **expected}
    wrong = [o for o in outcomes if o.state not in expected.get(o.job_id, ("COMPLETED",))]
    details = [f"job {o.job_id}: {o.state}" + (" (as TP meant)" if o.job_id in expected else "")
               for o in outcomes if o.state != "COMPLETED"]
    if wrong:
        lines = [f"job {o.job_id} {o.state}" + (f": {o.cause.strip().splitlines()[-1]}" if o.cause.strip() else "")
                 for o in wrong]
        return failed(f"{len(wrong)} of {len(outcomes)} jobs did not end as they should: {lines[0]}",
                      lines[1:] + details)
    meant = sum(1 for o in outcomes if o.job_id in expected and o.state != "COMPLETED")  # the lines below
    return passed(f"all {len(outcomes)} jobs ended as they should"
                  + (f" ({meant} failed by design: see below)" if meant else ""), details)


def _card_expects(job_id: str) -> tuple:
    """The states a job's card says it is meant to end in (submit's `expected=`); () when none or no card."""
    from dlokit.submission.jobs import find_card

    try:
        return tuple(find_card(job_id).expected)
    except LookupError:
        return ()
