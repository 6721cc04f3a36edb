"""Text that follows measurement: after a comparison, what THIS measurement says about the lesson.

    v = lessons.judge("amp", fp32_jobs, bf16_jobs, on_gpu=False, what="bf16 against fp32")
    v.outcome      # "agrees", "contradicts", "within noise", "not applicable" or "no measurement"
    v              # one paragraph: the ratio with its interval, the lesson, the verdict

The verdict follows from the interval (dlokit.analysis.stats), never from a fixed threshold: the interval
above 1 for a lesson that predicts a gain agrees, below 1 contradicts, across 1 is within noise. A lesson
whose mechanism needs a GPU (tensor cores, an asynchronous device queue) is "not applicable" on a CPU-only
run whatever the ratio: the ratio is shown, the public GPU figure beside it (../shared/reference/figures.md,
quoted with its source, never presented as ours). The check cells call the same judge, so the verdict
above a check and the check's speed part never disagree.

A lesson names the facts of a run record that show its treatment happened (`evidence`: the logits' dtype, the
memory format, the device, the DataLoader workers in use, whether a variant compiled). When both arms' records
show the same facts, the two arms computed the same thing: their ratio is the spread between runs of one
computation, and the verdict says "same computation" with what the record shows (untreated()); when the arm had
asked for the treatment, the sentence names the TODO that makes it happen. compare_runs and the checks ask the
same question, so no bar, verdict or ✅ shows an effect the records say did not happen.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass

from dlokit.analysis import stats
from dlokit.analysis.stats import (AGREES, CONTRADICTS, NO_INTERVAL, NO_MEASUREMENT, NOT_APPLICABLE,
                                   SAME_COMPUTATION, WITHIN_NOISE, Estimate)
from dlokit.analysis.expectations import LESSONS, Lesson, untreated  # noqa: F401 (lessons.LESSONS, .untreated)

MIME = "application/vnd.dlokit.verdict+json"  # what a saved notebook keeps of a verdict, machine-readable


@dataclass(frozen=True)
class Verdict:
    """What one comparison says about one lesson; shown as a quote in Jupyter, text elsewhere."""

    effect: str
    what: str
    estimate: Estimate
    on_gpu: bool
    outcome: str
    same: str = ""  # SAME_COMPUTATION: what the records show both arms did (untreated())

    @property
    def lesson(self) -> Lesson:
        return LESSONS[self.effect]

    @property
    def applicable(self) -> bool:
        return self.outcome != NOT_APPLICABLE

    @property
    def measured_text(self) -> str:
        """'×1.30 [1.21–1.40] compute throughput (95 % interval, 2 runs each)'."""
        e = self.estimate
        if not e.usable:
            return "no measurement" if not e.runs else f"{e.text()} {self.lesson.measured} (no interval: too few steps)"
        return f"{e.text()} {self.lesson.measured} ({100 * e.confidence:.0f} % interval, {e.basis_text})"

    @property
    def text(self) -> str:
        lesson = self.lesson
        if self.outcome == NO_MEASUREMENT:
            return f"{self.what}: no measurement to compare (a run failed or is missing). The lesson: {lesson.expectation}."
        where = "on a GPU" if self.on_gpu else "on the CPU"
        if self.outcome == SAME_COMPUTATION:
            apart = f" (their ratio, ×{self.estimate.value:.2f}, is what two runs of one computation differ by)" \
                if self.estimate.runs and math.isfinite(self.estimate.value) else ""
            text = (f"{self.what}, {where}: same computation: {self.same}. Both arms computed the same thing, so this "
                    f"comparison shows no effect{apart}. The lesson: {lesson.expectation}.")
            return text + ("" if self.on_gpu else f" For comparison, a public GPU figure (not ours): {lesson.public}.")
        text = f"{self.what}, {where}: {self.measured_text}. The lesson: {lesson.expectation}. "
        side = "above" if lesson.expects_gain else "below"
        if self.outcome == NOT_APPLICABLE:
            text += f"Not applicable on this hardware: {lesson.gpu_only}."
        elif self.outcome == AGREES:
            text += f"The interval lies {side} 1: this measurement agrees."
        elif self.outcome == CONTRADICTS:
            text += f"The interval lies on the other side of 1: this measurement contradicts it."
        elif self.outcome == NO_INTERVAL:
            text += "Too few samples for an interval: no verdict from this measurement (more steps or repeats give one)."
        else:
            text += "The interval contains 1: within noise, this measurement neither shows nor contradicts it."
        if not self.on_gpu:
            text += f" For comparison, a public GPU figure (not ours): {lesson.public}."
        return text

    def __str__(self) -> str:
        return self.text

    def as_json(self) -> dict:
        e = self.estimate
        numbers = {"ratio": e.value, "low": e.low, "high": e.high}
        return {"effect": self.effect, "what": self.what, "outcome": self.outcome, "on_gpu": self.on_gpu,
                **{k: v if math.isfinite(v) else None for k, v in numbers.items()}, "runs": e.runs, "basis": e.basis,
                "same": self.same}

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/markdown": f"> {html.escape(self.text)}", "text/plain": self.text, MIME: self.as_json()}


def verdict_of(effect: str, estimate: Estimate | None, on_gpu: bool, what: str, same: str = "") -> Verdict:
    """The verdict of a ratio already estimated (other / baseline, dlokit.analysis.stats); `same`: what
    untreated() found, when the records show both arms computed the same thing."""
    lesson = LESSONS[effect]
    estimate = estimate or stats.NO_ESTIMATE
    if same:
        outcome = SAME_COMPUTATION
    elif lesson.gpu_only and not on_gpu:
        outcome = NOT_APPLICABLE
    elif not estimate.runs:
        outcome = NO_MEASUREMENT
    elif not estimate.usable:  # a value without an interval: nothing to judge it by
        outcome = NO_INTERVAL
    else:
        outcome = estimate.outcome(lesson.expects_gain)
    return Verdict(effect, what, estimate, on_gpu, outcome, same)


def judge(effect: str, base_runs, other_runs, on_gpu: bool, what: str, metric: str | None = None) -> Verdict:
    """Compare runs of two commands (job ids, Runs, or lists of repeats) on the lesson's metric and say what
    the interval shows."""
    from dlokit.analysis.run import load_runs

    base, other = load_runs(_ids(base_runs)), load_runs(_ids(other_runs))
    estimate = stats.ratio(base, other, metric or LESSONS[effect].metric)
    return verdict_of(effect, estimate, on_gpu, what, untreated(effect, base, other))


def verdict(effect: str, base_runs, other_runs, on_gpu: bool, what: str, metric: str | None = None) -> Verdict:
    """judge(), for a notebook cell: the verdict is the cell's value."""
    return judge(effect, base_runs, other_runs, on_gpu, what, metric)


def compile_verdicts(job_id, on_gpu: bool, runs_dir=None) -> list:
    """TP3.3's verdicts, per part: its fastest compiled variant against eager, and Adam(fused=True)
    against the for-each kernels, from calls timed in one process. A compiled variant whose record says it ran
    uncompiled (compile_with untouched: compile took 0.0 s) is eager against eager: "same computation"."""
    from dlokit.analysis.compile_storage import compile_speedup
    from dlokit.analysis.run import load_run

    lines = load_run(job_id, runs_dir).lines("compile_result")
    ok = lines[lines["status"] == "ok"] if "status" in lines else lines
    verdicts = []
    for part, rows in ok.groupby("part", sort=False):
        eager = rows[rows["variant"] == "eager"].to_dict("records")
        compiled = rows[rows["variant"].astype(str).str.startswith("compile")].sort_values("t_step").head(1)
        for row in compiled.to_dict("records") if eager else []:
            what = (f"{row['variant']} (the fastest compiled variant) against eager on the {part} part, calls timed in "
                    f"one process (compile took {row['t_compile']:.1f} s once, from an empty kernel cache)")
            verdicts.append(verdict_of("compile", compile_speedup(lines, row), on_gpu, what,
                                               untreated("compile", eager[:1], [row])))
        for row in rows[rows["variant"] == "fused"].to_dict("records") if eager else []:
            verdicts.append(verdict_of("fused_optimizer", compile_speedup(lines, row), on_gpu,
                                               "Adam(fused=True) against the for-each kernels (eager), steps timed in "
                                               "one process"))
    return verdicts


def _ids(runs) -> list:
    if runs is None:
        return []
    return list(runs) if isinstance(runs, (list, tuple)) else [runs]
