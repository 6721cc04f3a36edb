"""How sure is a measurement? Per-step samples, a warm-up read from the data, and intervals.

    est = estimate([run_a1, run_a2], "throughput_train")   # Estimate: value, low, high, runs, steps
    r = ratio([a1, a2], [b1, b2], "throughput_train")        # b / a with its 95 % interval
    r.outcome(expects_gain=True)                              # "agrees", "contradicts" or "within noise"

A run's value is the median of its settled steps (a stray slow step moves it little). Where the runs vary
is the question an interval must answer:

* **several runs of each command** (the kit alternates them, A B A B, so that drift hits both): the run is
  the unit. Six runs of one command, alone on a 2-core machine, ranged over 20 % while each run's steps
  agreed within a few per cent: an interval built from the steps of one run each called two of them
  ×0.94 [0.90–0.98] apart. The interval is Student's t-interval on the log of the runs' values
  (scipy.stats.ttest_ind), the two arms' spreads pooled (it is the machine that varies, alike for both
  commands), turned back into a ratio: honest with few runs, and wide when they disagree. Runs that
  happen to agree more closely than runs of one command do here get that measured spread (RUN_SPREAD, FLOORED).
* **one run of each**: only the steps are there; the interval is a bootstrap of the ratio of the two
  medians (scipy.stats.bootstrap), widened by how much two runs of one command differ here (RUN_SPREAD, measured
  on the project's 2-core machine), and says so: over one run's steps alone, two runs of one command read
  ×0.82 [0.79–0.90] apart (Day 1, 2026-11-28), an "effect" that was only the machine.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 20261125  # the same records always give the same interval
SETTLED_WITHIN = 0.05  # a step within 5 % of the steady step time has warmed up
AGREES, CONTRADICTS, WITHIN_NOISE = "agrees", "contradicts", "within noise"
# a lesson's other outcomes (dlokit.lessons): hardware the jobs did not have, a run missing, too few samples,
NOT_APPLICABLE, NO_MEASUREMENT, NO_INTERVAL = "not applicable", "no measurement", "no interval"
SAME_COMPUTATION = "same computation"  # the records show that both arms computed the same thing
RUNS, STEPS = "runs", "steps"  # what an interval rests on
WIDENED = "steps + run spread"  # one run each: its steps' interval, widened by RUN_SPREAD
FLOORED = "runs, spread at least RUN_SPREAD"  # few runs each that happened to agree: their spread taken as RUN_SPREAD
POOLED = "runs, spread pooled with RUN_SPREAD"  # a value over a few runs: their spread and RUN_SPREAD's runs together
# Two runs of one command differ by more than either run's steps say. Ten runs of TP2.2's 1-rank command, alone on
# the project's 2-core machine (docs/benchmarks.md, course 18, 2026-11-28): the standard deviation of the log of their
# medians was 0.082 (78.8 to 100.9 img/s). A ratio of one run each adds that spread twice, with the t quantile of the
# ten runs it was measured on: ±26 % at 95 %.
RUN_SPREAD, RUN_SPREAD_RUNS = 0.082, 10
RUN_SPREAD_SAID = (f"±{100 * (math.exp(RUN_SPREAD) - 1):.0f} % a run, one standard deviation of {RUN_SPREAD_RUNS} runs on "
                   "the course's 2-core machine")


def warmup_steps(times) -> int:
    """How many leading steps to leave out: those before the first step whose time lies in the settled band,
    the median of the second half ± max(3 robust standard deviations, SETTLED_WITHIN of it). At least one
    (the first step pays for allocations and caches), at most half. Later slow steps stay in: they are the
    machine's noise, not a warm-up."""
    x = np.asarray(times, dtype=float)
    n = len(x)
    if n < 3:
        return min(1, max(n - 1, 0))
    tail = x[n // 2:]
    level = float(np.median(tail))
    band = max(3 * 1.4826 * float(np.median(np.abs(tail - level))), SETTLED_WITHIN * level)
    settled = np.flatnonzero(np.abs(x[1:n // 2 + 1] - level) <= band)
    return 1 + int(settled[0]) if len(settled) else n // 2


def step_table(run) -> pd.DataFrame:
    """The step lines of the run's first rank that time a step: on a GPU, the breakdown steps (synchronised)
    and the step after each (its period lost the overlap) are left out, as in the summary's means."""
    steps = run.steps
    if steps.empty or "step" not in steps:
        return steps
    steps = steps.sort_values("step").drop_duplicates("step", keep="last").reset_index(drop=True)
    if "t_period" in steps and steps["t_period"].notna().any() and "breakdown" in steps:
        breakdown = steps["breakdown"].fillna(False).astype(bool)
        steps = steps[~breakdown & ~breakdown.shift(1, fill_value=False)]
    return steps.reset_index(drop=True)


def _column(steps: pd.DataFrame, metric: str) -> np.ndarray:
    if metric in steps:
        return pd.to_numeric(steps[metric], errors="coerce").to_numpy(dtype=float)
    return np.full(len(steps), np.nan)


def step_values(run, metric: str = "throughput_train") -> np.ndarray:
    """The run's per-step values of `metric` after its warm-up (found in the step times themselves)."""
    steps = step_table(run)
    if steps.empty:
        return np.array([])
    values = _column(steps, metric)
    timing = _column(steps, "t_period") if "t_period" in steps and steps["t_period"].notna().any() else \
        _column(steps, "t_step") + np.nan_to_num(_column(steps, "t_data"))
    usable = np.isfinite(values) & np.isfinite(timing)
    values, timing = values[usable], timing[usable]
    return values[warmup_steps(timing):]


@dataclass(frozen=True)
class Estimate:
    """A value with its interval at `confidence`, and what the interval rests on (`basis`: RUNS, FLOORED, STEPS or WIDENED)."""

    value: float
    low: float
    high: float
    runs: int          # runs in the smaller arm
    steps: int         # settled steps in the smaller arm
    basis: str = STEPS
    confidence: float = CONFIDENCE

    @property
    def usable(self) -> bool:
        return all(math.isfinite(v) for v in (self.value, self.low, self.high))

    def outcome(self, expects_gain: bool) -> str:
        """For a ratio: the interval lies on the side of 1 the lesson predicts (agrees), on the other
        (contradicts), or across 1 (within noise)."""
        if not self.usable:
            return WITHIN_NOISE
        if self.low > 1:
            return AGREES if expects_gain else CONTRADICTS
        if self.high < 1:
            return CONTRADICTS if expects_gain else AGREES
        return WITHIN_NOISE

    @property
    def basis_text(self) -> str:
        if self.basis == RUNS:
            return f"{self.runs} runs each"
        if self.basis == FLOORED:
            return (f"{self.runs} runs each; they agreed more closely than runs of one command do, so their spread is "
                    f"taken as that one ({RUN_SPREAD_SAID})")
        if self.basis == POOLED:
            return f"{self.runs} runs, their spread pooled with that of {RUN_SPREAD_RUNS} runs of one command ({RUN_SPREAD_SAID})"
        if self.basis == WIDENED:
            return (f"1 run each, {self.steps} steps, widened by the spread between two runs of one command "
                    f"({RUN_SPREAD_SAID})")
        return f"1 run each, {self.steps} steps: a second run may differ more"

    def text(self, unit: str = "×") -> str:
        """'×1.30 [1.25–1.36]' for a ratio, '52.1 [50.3–53.8] img/s' for a value."""
        if not self.usable:
            return "n/a" if not math.isfinite(self.value) else (f"×{self.value:.2f}" if unit == "×" else
                                                                  f"{self.value:.4g} {unit}")
        if unit == "×":
            return f"×{self.value:.2f} [{self.low:.2f}–{self.high:.2f}]"
        return f"{self.value:.4g} [{self.low:.4g}–{self.high:.4g}] {unit}".rstrip()

    def long_text(self, unit: str = "×") -> str:
        return f"{self.text(unit)} ({100 * self.confidence:.0f} % interval, {self.basis_text})"


NO_ESTIMATE = Estimate(math.nan, math.nan, math.nan, 0, 0)


def _arm(runs, metric: str) -> list[np.ndarray]:
    return [s for s in (step_values(run, metric) for run in _as_list(runs)) if len(s)]


def _as_list(runs) -> list:
    return list(runs) if isinstance(runs, (list, tuple)) else [runs]


def estimate(runs, metric: str = "throughput_train", confidence: float = CONFIDENCE) -> Estimate:
    """The value of one command (one or several runs of it) with its interval: over several runs, of_runs."""
    samples = _arm(runs, metric)
    return of_runs(samples, confidence) if len(samples) >= 2 else estimate_of_samples(samples, confidence)


def of_runs(samples: list, confidence: float = CONFIDENCE) -> Estimate:
    """Several runs of one command (one array of steps each): the geometric mean of their medians, its t-interval on
    the log scale. Two runs alone give the t quantile of one degree of freedom (12.7): runs of 35.0 and 27.2 ms read
    30.9 [6.3–152.2] ms, true and of no use. The spread between runs of one command on this kind of machine is known
    (RUN_SPREAD, ten runs): it is pooled with theirs, degrees of freedom included, and runs further apart than that
    keep their own spread (the larger of the two is used): 30.9 [23.3–40.9] ms."""
    samples = [np.asarray(s, dtype=float) for s in samples if len(s)]
    medians = np.array([np.median(s) for s in samples])
    if len(samples) < 2 or not (medians > 0).all():
        return estimate_of_samples(samples, confidence)
    points = np.log(medians)
    df = (RUN_SPREAD_RUNS - 1) + (len(points) - 1)
    own = float(np.var(points, ddof=1))
    pooled = math.sqrt(((RUN_SPREAD_RUNS - 1) * RUN_SPREAD ** 2 + (len(points) - 1) * own) / df)
    half = stats.t.ppf((1 + confidence) / 2, df) * max(pooled, math.sqrt(own)) / math.sqrt(len(points))
    centre = float(points.mean())
    return Estimate(math.exp(centre), math.exp(centre - half), math.exp(centre + half), len(points),
                    sum(len(s) for s in samples), POOLED, confidence)


def estimate_of_samples(samples: list, confidence: float = CONFIDENCE) -> Estimate:
    """From raw values: one array per run (its steps). Several runs: a t-interval over the runs' medians, on
    their logarithm when all are positive (a speed or a time: the interval stays positive, and the value, their
    geometric mean, is the one ratio_of_samples divides: two DDP runs of Day 2 at about 178 and 145 img/s read
    -46 to 369 img/s on the linear scale, 44 to 583 on the log one); one run: a bootstrap of its median."""
    samples = [np.asarray(s, dtype=float) for s in samples if len(s)]
    if not samples:
        return NO_ESTIMATE
    n_steps = sum(len(s) for s in samples)
    if len(samples) >= 2:
        medians = np.array([np.median(s) for s in samples])
        positive = bool((medians > 0).all())
        points = np.log(medians) if positive else medians
        mean, sem = float(points.mean()), float(stats.sem(points))
        low, high = (mean, mean) if sem == 0 else stats.t.interval(confidence, len(points) - 1, loc=mean, scale=sem)
        back = np.exp if positive else float
        return Estimate(float(back(mean)), float(back(low)), float(back(high)), len(samples), n_steps, RUNS,
                        confidence)
    steps = samples[0]
    if len(steps) < 2 or np.ptp(steps) == 0:
        value = float(np.median(steps))
        return Estimate(value, value, value, 1, len(steps), STEPS, confidence)
    result = stats.bootstrap((steps,), np.median, confidence_level=confidence, n_resamples=RESAMPLES,
                             method="percentile", rng=np.random.default_rng(SEED))
    ci = result.confidence_interval
    return Estimate(float(np.median(steps)), float(ci.low), float(ci.high), 1, len(steps), STEPS, confidence)


def ratio(base_runs, other_runs, metric: str = "throughput_train", confidence: float = CONFIDENCE) -> Estimate:
    """other / base for `metric` (runs of two commands), with its interval."""
    return ratio_of_samples(_arm(base_runs, metric), _arm(other_runs, metric), confidence)


def _median_ratio(base, other, axis=-1):
    return np.median(other, axis=axis) / np.median(base, axis=axis)


def ratio_of_samples(base: list, other: list, confidence: float = CONFIDENCE) -> Estimate:
    """other / base from raw values: one array per run (its steps), a list of runs per arm. Both arms with
    several runs: Student's t-interval (pooled spread) on the log of the runs' medians; otherwise a
    bootstrap of the ratio of the medians of all steps (the steps of one run each)."""
    base = [np.asarray(s, dtype=float) for s in base if len(s)]
    other = [np.asarray(s, dtype=float) for s in other if len(s)]
    if not base or not other:
        return NO_ESTIMATE
    runs = min(len(base), len(other))
    n_steps = min(sum(len(s) for s in base), sum(len(s) for s in other))
    if runs >= 2:
        log_base = np.log([np.median(s) for s in base])
        log_other = np.log([np.median(s) for s in other])
        value = float(np.exp(log_other.mean() - log_base.mean()))
        if np.ptp(log_base) == 0 and np.ptp(log_other) == 0:
            return Estimate(value, value, value, runs, n_steps, RUNS, confidence)
        return _t_interval(log_base, log_other, value, n_steps, confidence)
    base_steps, other_steps = np.concatenate(base), np.concatenate(other)
    value = float(_median_ratio(base_steps, other_steps))
    if len(base_steps) < 2 or len(other_steps) < 2:
        return Estimate(value, math.nan, math.nan, 1, n_steps, STEPS, confidence)
    result = stats.bootstrap((base_steps, other_steps), _median_ratio, confidence_level=confidence,
                             n_resamples=RESAMPLES, method="percentile", vectorized=True,
                             rng=np.random.default_rng(SEED))
    ci = result.confidence_interval
    return widened(Estimate(value, float(ci.low), float(ci.high), 1, n_steps, STEPS, confidence))


def _t_interval(log_base: np.ndarray, log_other: np.ndarray, value: float, n_steps: int, confidence: float) -> Estimate:
    """Student's t-interval on the log of the runs' values, the arms' spreads pooled. Two or three runs can agree
    by chance (Day 4's compile lesson read ×1.18 [1.15–1.22] from two runs each, then ×1.11 and ×1.23 "within
    noise" on the same code): the pooled spread is taken as at least RUN_SPREAD, what runs of one command are
    known to differ by here, and the estimate says so (FLOORED)."""
    n_base, n_other = len(log_base), len(log_other)
    df = n_base + n_other - 2
    pooled = math.sqrt(((n_base - 1) * np.var(log_base, ddof=1) + (n_other - 1) * np.var(log_other, ddof=1)) / df)
    basis = RUNS if pooled >= RUN_SPREAD else FLOORED
    half = stats.t.ppf((1 + confidence) / 2, df) * max(pooled, RUN_SPREAD) * math.sqrt(1 / n_base + 1 / n_other)
    centre = math.log(value)
    return Estimate(value, math.exp(centre - half), math.exp(centre + half), min(n_base, n_other), n_steps, basis,
                    confidence)


def run_spread_half_width(confidence: float = CONFIDENCE) -> float:
    """Half the width, on the log scale, of the interval of the ratio of two runs of one command (RUN_SPREAD)."""
    return float(stats.t.ppf((1 + confidence) / 2, RUN_SPREAD_RUNS - 1) * RUN_SPREAD * math.sqrt(2))


def widened(ratio: Estimate) -> Estimate:
    """A ratio of one run each, its interval widened by the run-to-run spread: on the log scale, each side's
    half-width from the steps and the spread's add in quadrature (independent sources of error)."""
    if not ratio.usable or min(ratio.value, ratio.low) <= 0:
        return ratio
    spread = run_spread_half_width(ratio.confidence)
    below = math.hypot(math.log(ratio.value / ratio.low), spread)
    above = math.hypot(math.log(ratio.high / ratio.value), spread)
    return Estimate(ratio.value, ratio.value * math.exp(-below), ratio.value * math.exp(above), ratio.runs,
                    ratio.steps, WIDENED, ratio.confidence)


def decimals(low: float, high: float) -> int | None:
    """The decimals an interval supports: two significant digits of its half-width (None: no interval)."""
    half = (high - low) / 2
    if not (math.isfinite(half) and half > 0):
        return None
    return max(0, 1 - math.floor(math.log10(half)))


def mean_of(mean: float, sd: float, n: int, confidence: float = CONFIDENCE) -> Estimate:
    """A mean over n samples (a run's validation loss over its images) from its standard deviation: the t-interval."""
    if not n or n < 2 or not all(math.isfinite(v) for v in (mean, sd)):
        return NO_ESTIMATE
    half = stats.t.ppf((1 + confidence) / 2, n - 1) * sd / math.sqrt(n)
    return Estimate(mean, float(mean - half), float(mean + half), 1, int(n), STEPS, confidence)


def difference_of_means(a: tuple, b: tuple, confidence: float = CONFIDENCE) -> Estimate:
    """b's mean minus a's, each given as (mean, standard deviation, n), with Welch's t-interval: the two runs'
    samples are independent and may spread differently (scipy.stats.ttest_ind_from_stats's test, as an interval)."""
    (mean_a, sd_a, n_a), (mean_b, sd_b, n_b) = a, b
    if min(n_a, n_b) < 2 or not all(math.isfinite(v) for v in (mean_a, sd_a, mean_b, sd_b)):
        return NO_ESTIMATE
    var_a, var_b = sd_a ** 2 / n_a, sd_b ** 2 / n_b
    se = math.sqrt(var_a + var_b)
    if se == 0:
        return Estimate(mean_b - mean_a, mean_b - mean_a, mean_b - mean_a, 1, int(min(n_a, n_b)), STEPS, confidence)
    dof = (var_a + var_b) ** 2 / (var_a ** 2 / (n_a - 1) + var_b ** 2 / (n_b - 1))  # Welch-Satterthwaite
    half = stats.t.ppf((1 + confidence) / 2, dof) * se
    diff = mean_b - mean_a
    return Estimate(diff, float(diff - half), float(diff + half), 1, int(min(n_a, n_b)), STEPS, confidence)


def proportion(hits: int, total: int, confidence: float = CONFIDENCE) -> Estimate:
    """An accuracy over `total` examples with its Wilson interval (scipy.stats.binomtest)."""
    if not total:
        return NO_ESTIMATE
    ci = stats.binomtest(int(round(hits)), int(total)).proportion_ci(confidence, method="wilson")
    return Estimate(hits / total, float(ci.low), float(ci.high), 1, int(total), STEPS, confidence)
