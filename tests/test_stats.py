"""Intervals and verdicts (dlokit.analysis.stats, dlokit.lessons) on synthetic step times: a clear gain agrees,
a clear loss contradicts, overlapping noise is within noise, and the verdict text never says more than its
interval. No job runs here."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from dlokit import lessons
from dlokit.analysis import stats

RNG = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def same_draws_whatever_ran_before():
    """Each test draws from a fresh generator: its samples, and so its verdicts, do not depend on which tests ran
    before it (`-k` once turned a 'within noise' case into 'contradicts')."""
    global RNG
    RNG = np.random.default_rng(7)


def steps(level, n=12, spread=0.02):
    """Per-step throughputs around `level` with a relative spread."""
    return level * (1 + spread * RNG.standard_normal(n))


def runs(level, count, between=0.05, n=12):
    """`count` runs of one command: each run's pace is off by a run-to-run factor, its steps vary around it."""
    return [steps(level * (1 + between * RNG.standard_normal()), n) for _ in range(count)]


def test_warmup_is_read_from_the_step_times():
    assert stats.warmup_steps([0.47, 0.35, 0.34, 0.32, 0.29, 0.29, 0.31, 0.29, 0.27, 0.28]) == 3  # 0.32 is within the band
    assert stats.warmup_steps([0.41, 0.30, 0.31, 0.30, 0.30, 0.29, 0.31, 0.31, 0.29, 0.33]) == 1  # only the first
    assert stats.warmup_steps([0.9, 0.8, 0.7, 0.6, 0.5, 0.3, 0.3, 0.3, 0.3, 0.3]) == 5  # never more than half
    assert stats.warmup_steps([0.3]) == 0 and stats.warmup_steps([0.5, 0.3]) == 1


@pytest.mark.parametrize("repeats", [1, 2, 3])
def test_a_clear_gain_agrees_a_clear_loss_contradicts_overlapping_noise_is_within_noise(repeats):
    base = runs(100, repeats)
    faster, slower, same = runs(150, repeats), runs(60, repeats), runs(100, repeats, between=0.0)
    gain = stats.ratio_of_samples(base, faster)
    assert gain.low > 1 and gain.outcome(expects_gain=True) == stats.AGREES
    assert gain.outcome(expects_gain=False) == stats.CONTRADICTS  # a lesson that predicts a cost
    loss = stats.ratio_of_samples(base, slower)
    assert loss.high < 1 and loss.outcome(expects_gain=True) == stats.CONTRADICTS
    # the same level in both arms: runs that differ by a few per cent are not an effect
    noise = stats.ratio_of_samples(runs(100, 3, between=0.08), runs(100, 3, between=0.08))
    assert noise.low < 1 < noise.high and noise.outcome(expects_gain=True) == stats.WITHIN_NOISE
    assert gain.basis in ((stats.RUNS, stats.FLOORED) if repeats > 1 else (stats.WIDENED,))


def test_the_run_is_the_unit_when_commands_were_repeated():
    """Two runs of ONE command whose paces differ by 8 %: steps alone would call that an effect; the runs do not."""
    one, other = [steps(100, 20, 0.01)], [steps(92, 20, 0.01)]
    single = stats.ratio_of_samples(one, other)
    assert single.basis == stats.WIDENED and single.low < 1 < single.high  # widened by the run-to-run spread...
    assert "widened by the spread between two runs of one command" in single.long_text()  # ...and it says so
    repeated = stats.ratio_of_samples(one + [steps(93, 20, 0.01)], other + [steps(101, 20, 0.01)])
    assert repeated.basis in (stats.RUNS, stats.FLOORED) and repeated.low < 1 < repeated.high
    assert "2 runs each" in repeated.long_text()


def test_two_runs_that_agree_by_chance_are_not_taken_for_a_sure_effect():
    """Day 4's compile lesson, two runs each: ×1.18 [1.15–1.22] "agrees" once, ×1.11 and ×1.23 "within noise" on the
    same code. Runs that agree more closely than runs of one command do here get the measured spread (FLOORED)."""
    close = stats.ratio_of_samples([steps(100, 12, 0.01), steps(101, 12, 0.01)],
                                   [steps(118, 12, 0.01), steps(119, 12, 0.01)])
    assert close.basis == stats.FLOORED and close.outcome(expects_gain=True) == stats.WITHIN_NOISE
    assert close.low < 1 < close.high and 1.15 < close.value < 1.21
    assert "their spread is taken as that one" in close.long_text()
    # runs that spread more than that keep their own spread; a clear effect still decides
    wide = stats.ratio_of_samples([steps(80, 12, 0.01), steps(120, 12, 0.01)], [steps(85, 12, 0.01), steps(125, 12, 0.01)])
    assert wide.basis == stats.RUNS and wide.outcome(expects_gain=True) == stats.WITHIN_NOISE
    clear = stats.ratio_of_samples([steps(100, 12, 0.01), steps(101, 12, 0.01)], [steps(200, 12, 0.01)] * 2)
    assert clear.basis == stats.FLOORED and clear.outcome(expects_gain=True) == stats.AGREES


def test_estimates_and_accuracy_intervals():
    one = stats.estimate_of_samples([steps(50, 30, 0.02)])
    assert one.low < one.value < one.high and abs(one.value - 50) < 2
    several = stats.estimate_of_samples([steps(50), steps(52), steps(49)])
    assert several.runs == 3 and several.low < 50.3 < several.high
    acc = stats.proportion(45, 100)
    assert acc.value == 0.45 and 0.35 < acc.low < 0.45 < acc.high < 0.56
    assert not stats.NO_ESTIMATE.usable and stats.ratio_of_samples([], [steps(1)]) is stats.NO_ESTIMATE


def test_verdict_text_follows_its_interval():
    gain = stats.ratio_of_samples(runs(100, 2), runs(170, 2))
    v = lessons.verdict_of("ddp", gain, on_gpu=False, what="2 ranks against 1")
    assert v.outcome == lessons.AGREES
    assert "interval lies above 1: this measurement agrees" in v.text and gain.text() in v.text
    flat = stats.ratio_of_samples(runs(100, 3, between=0.08), runs(100, 3, between=0.08))
    v = lessons.verdict_of("find_unused", flat, on_gpu=False, what="find_unused_parameters")
    assert v.outcome == lessons.WITHIN_NOISE and "agrees" not in v.text and "contains 1" in v.text
    # a lesson about tensor cores on a CPU-only run: not applicable, whatever the ratio says
    v = lessons.verdict_of("amp", stats.ratio_of_samples(runs(100, 2), runs(130, 2)), on_gpu=False, what="bf16")
    assert v.outcome == lessons.NOT_APPLICABLE and "agrees" not in v.text
    assert "Not applicable on this hardware" in v.text and "tensor cores" in v.text
    assert v.estimate.text() in v.text  # the number is still shown, with its interval
    v = lessons.verdict_of("gpu_vs_cpu", stats.NO_ESTIMATE, on_gpu=True, what="GPU")
    assert v.outcome == lessons.NO_MEASUREMENT and "no measurement" in v.text
    # one sample on a side: a ratio, no interval, no verdict (not "the interval contains 1")
    lone = stats.ratio_of_samples([[0.006]], [[1.0, 1.1, 0.9]])
    v = lessons.verdict_of("augment_cost", lone, on_gpu=False, what="RandAugment against mixup")
    assert v.outcome == lessons.NO_INTERVAL and "interval contains" not in v.text and "no verdict" in v.text


def test_the_interval_of_a_few_runs_of_a_speed_stays_positive():
    # two runs of an arm that differ by a fifth (Day 2's two 2-rank runs on the CPU, 2026-11-27): with one degree
    # of freedom the linear t-interval went below zero; on the log scale it stays a speed
    fast, slow = [steps(178, 9, 0.02), steps(145, 9, 0.02)], [steps(100, 9, 0.02), steps(104, 9, 0.02)]
    arm = stats.estimate_of_samples(fast)
    assert arm.basis == stats.RUNS and 0 < arm.low < arm.value < arm.high
    assert arm.value == pytest.approx((178 * 145) ** 0.5, rel=0.02)  # the geometric mean, as ratio_of_samples uses
    assert stats.ratio_of_samples(slow, fast).value == pytest.approx(arm.value / stats.estimate_of_samples(slow).value)


def test_a_few_runs_of_one_command_pool_their_spread_with_the_machines():
    """Two runs of 35.0 and 27.2 ms (TP4.9's ZeRO-1, 2026-11-29): one degree of freedom alone read 30.9 [6.3–152.2]
    ms. With RUN_SPREAD's ten runs' degrees of freedom, and the larger of their own spread and the pooled one."""
    two = [steps(35.0, 9, 0.01), steps(27.2, 9, 0.01)]
    alone, pooled = stats.estimate_of_samples(two), stats.of_runs(two)
    assert alone.low < 7 and alone.high > 140  # what it was
    assert pooled.basis == stats.POOLED and pooled.value == pytest.approx(alone.value)
    own = np.std(np.log([np.median(s) for s in two]), ddof=1)  # 0.178: above the pooled spread, so it is the one used
    assert np.log(pooled.high / pooled.value) == pytest.approx(scipy_stats.t.ppf(0.975, 10) * own / np.sqrt(2), rel=1e-6)
    assert 22 < pooled.low < 25 and 39 < pooled.high < 43 and "pooled with that of 10 runs" in pooled.basis_text
    # runs that agree closely get the machine's spread, pooled: 273 and 290 img/s (Day 2's 1 rank, 2026-11-29)
    close = stats.of_runs([steps(273, 9, 0.01), steps(290, 9, 0.01)])
    s2 = (9 * stats.RUN_SPREAD ** 2 + np.var(np.log([273, 290]), ddof=1)) / 10
    assert np.log(close.high / close.value) == pytest.approx(scipy_stats.t.ppf(0.975, 10) * np.sqrt(s2 / 2), rel=0.01)
    assert 240 < close.low < 255 and 315 < close.high < 330
    # runs far apart keep their own spread: a wide interval
    apart = stats.of_runs([steps(60.0, 9, 0.01), steps(20.0, 9, 0.01)])
    assert apart.high / apart.low > 5 and apart.low < 20 and apart.high > 60
    assert stats.of_runs(two[:1]).basis == stats.STEPS  # one run: its steps, as before


def test_intervals_of_a_mean_and_of_a_difference_of_means_are_scipys():
    rng = np.random.default_rng(3)
    a, b = rng.normal(2.0, 0.45, 400), rng.normal(2.4, 1.4, 80)
    one = stats.mean_of(a.mean(), a.std(ddof=1), len(a))
    expected = scipy_stats.ttest_1samp(a, 0).confidence_interval()
    assert (one.low, one.high) == pytest.approx((expected.low, expected.high))
    diff = stats.difference_of_means((a.mean(), a.std(ddof=1), len(a)), (b.mean(), b.std(ddof=1), len(b)))
    expected = scipy_stats.ttest_ind(b, a, equal_var=False).confidence_interval()  # Welch's
    assert diff.value == pytest.approx(b.mean() - a.mean()) and (diff.low, diff.high) == pytest.approx(
        (expected.low, expected.high))
    assert not stats.difference_of_means((1.0, 0.1, 1), (2.0, 0.1, 10)).usable  # one image: no spread


@pytest.mark.parametrize("apart", [0.82, 0.87, 1.20, 1.27])
def test_one_run_each_of_one_command_reads_within_noise_at_the_measured_run_to_run_spread(apart):
    """Identical commands whose two runs differ as this machine's did (Day 1's first job against the CPU baseline,
    ×0.82 [0.79–0.90] over its steps; channels_last untouched ×0.87, bf16 untouched ×1.27 [1.12–1.47]): each run's
    steps agree within 2 %, so the steps alone exclude 1; the run-to-run spread puts 1 back inside."""
    base, other = [steps(100, 10, 0.02)], [steps(100 * apart, 10, 0.02)]
    ratio = stats.ratio_of_samples(base, other)
    assert ratio.value == pytest.approx(apart, rel=0.03)
    assert ratio.basis == stats.WIDENED and ratio.outcome(expects_gain=True) == stats.WITHIN_NOISE, ratio.long_text()
    assert ratio.high / ratio.low > math.exp(2 * stats.run_spread_half_width())  # at least the spread's width
    # the spread itself: ten runs of one command, docs/benchmarks.md (course 18)
    medians = np.log([78.8, 83.7, 100.9, 93.8, 87.4, 97.0, 83.1, 95.8, 84.9, 94.5])
    assert stats.RUN_SPREAD == pytest.approx(medians.std(ddof=1), abs=0.001) and stats.RUN_SPREAD_RUNS == len(medians)


def test_a_clear_effect_of_one_run_each_still_agrees_after_widening():
    """The solutions' one-run verdicts (Day 2's loader wait ×0.06, Day 3's compiled function ×2.2-6) stay shown."""
    assert stats.ratio_of_samples([steps(0.40, 10, 0.1)], [steps(0.024, 10, 0.3)]).outcome(expects_gain=False) == \
        stats.AGREES
    assert stats.ratio_of_samples([steps(100, 10, 0.05)], [steps(219, 10, 0.1)]).outcome(expects_gain=True) == \
        stats.AGREES
