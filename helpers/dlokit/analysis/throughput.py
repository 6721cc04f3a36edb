"""Tokens per second and MFU of train_llm.py runs, each with its 95 % interval, and the peak MFU divides by.

    peak = measured_peak(matmul_job)                 # a CPU: the peak comm_bench.py --measure peak measured on this machine
    throughput_columns(runs, peak)                   # per run: tokens/s and MFU, each with its interval
    throughput_plot(runs, peak)                      # tokens/s per layout (equal global batch), with whiskers

The peak is the device's datasheet peak for the run's arithmetic on a GPU (the run's own summary: common/mfu.py,
dense figures), and on a CPU the matmul FLOP/s that comm_bench.py --measure peak measured on this machine, every rank of one job
at once: the sum over its ranks is what the machine's cores give a job, whatever its number of processes (they
share them). Never a made-up number: without either, no MFU, and the basis says why.
MFU = tokens/s x FLOPs per token (6 per weight touched + attention, model.flops_per_token) / (peak x devices).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
from scipy import stats

from dlokit.analysis.figures import message_figure, new_figure
from dlokit.analysis.llm_memory import mode_label
from dlokit.analysis.run import load_run, load_runs
from dlokit.analysis.stats import (CONFIDENCE, NO_ESTIMATE, RUN_SPREAD, RUN_SPREAD_RUNS, WIDENED, Estimate, estimate,
                                   estimate_of_samples)


@dataclass(frozen=True)
class Peak:
    """FLOP/s of the devices of a job: `per_device` on a GPU (datasheet), `machine` on a CPU (measured)."""
    per_device: float | None = None
    machine: float | None = None
    dtype: str = "fp32"
    basis: str = "no peak"
    low: float | None = None
    high: float | None = None

    def total(self, world: int, on_gpu: bool) -> float | None:
        if on_gpu:
            return self.per_device * world if self.per_device else None
        return self.machine


def measured_peak(run) -> Peak:
    """The machine's matmul peak from a comm_bench.py --measure peak job: the sum of its ranks' best medians (measured at once),
    with an interval from the spread of the best size's timed blocks on each rank (their low and high ends added)."""
    run = load_run(run) if isinstance(run, str) else run
    totals, lows, highs = 0.0, 0.0, 0.0
    for rank in sorted(run.ranks):
        summary = run.ranks[rank].get("summary") or {}
        lines = run.lines("matmul", rank)
        if not summary.get("peak_flops") or lines.empty:
            return Peak(basis=f"comm_bench.py --measure peak run {run.run_id}: rank {rank} measured nothing ({run.state})")
        best = estimate_of_samples_at(lines, summary.get("peak_n"))
        totals, lows, highs = totals + best.value, lows + best.low, highs + best.high
    dtype = run.config.get("dtype", "fp32")
    return Peak(machine=totals, dtype=dtype, low=lows, high=highs,
                basis=f"{dtype} matmul peak measured on this machine by comm_bench.py --measure peak (run {run.run_id}): "
                      f"{totals / 1e9:.1f} [{lows / 1e9:.1f}-{highs / 1e9:.1f}] GFLOP/s over its {len(run.ranks)} "
                      "ranks at once")


def estimate_of_samples_at(lines: pd.DataFrame, n) -> Estimate:
    rows = lines[lines["n"] == n] if n is not None else lines
    return estimate_of_samples([pd.to_numeric(rows["flops_per_s"]).to_numpy()])


def run_peak(run, peak: Peak | None) -> tuple[float | None, str]:
    """(FLOP/s of the run's devices, why): the run's datasheet peak on a GPU, `peak` (measured) on a CPU."""
    if run.on_gpu:
        per_device = run.summary.get("peak_flops")
        return ((per_device * run.world_size, run.summary.get("mfu_basis") or "datasheet") if per_device
                else (None, run.summary.get("mfu_basis") or "no datasheet peak"))
    if peak is None or peak.machine is None:
        return None, "no MFU: on a CPU the peak must be measured (comm_bench.py --measure peak), and none was given"
    dtype = run.config.get("dtype", "fp32")
    if dtype != peak.dtype:
        return None, f"no MFU: the measured peak is {peak.dtype}'s, the run computed in {dtype}"
    return peak.machine, peak.basis


def tokens_per_s(run) -> Estimate:
    """The median of the settled steps' tokens/s with its interval. One settled step (TP4.2's scan runs two steps
    each) has no spread of its own: its interval is then the spread of one run of a command on this machine
    (stats.RUN_SPREAD: two runs of one command differ by that much), and says so."""
    value = estimate(run, "tokens_per_s")
    if not math.isfinite(value.value) or value.low != value.high:
        return value
    half = math.exp(stats.t.ppf((1 + CONFIDENCE) / 2, RUN_SPREAD_RUNS - 1) * RUN_SPREAD)
    return Estimate(value.value, value.value / half, value.value * half, value.runs, value.steps, WIDENED)


def rate_text(rate: Estimate) -> str | None:
    """'16,670 [15,110–18,190] tok/s' (3 significant digits at least)."""
    if not math.isfinite(rate.value):
        return None
    number = lambda v: f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
    return f"{number(rate.value)} [{number(rate.low)}–{number(rate.high)}] tok/s"


def mfu_text(mfu: Estimate) -> str | None:
    return f"{100 * mfu.value:.2f} % [{100 * mfu.low:.2f}–{100 * mfu.high:.2f}]" if mfu.usable else None


def mfu_estimate(run, peak: Peak | None) -> tuple[Estimate, str]:
    """MFU with its interval: the tokens/s interval scaled (the peak's own spread is in its basis)."""
    total, basis = run_peak(run, peak)
    rate, fpt = tokens_per_s(run), run.summary.get("flops_per_token")
    if total is None or not fpt or not rate.usable:
        return NO_ESTIMATE, basis
    scale = fpt / total
    return Estimate(rate.value * scale, rate.low * scale, rate.high * scale, rate.runs, rate.steps, rate.basis), basis


def throughput_columns(runs, peak: Peak | None = None, runs_dir=None) -> pd.DataFrame:
    """Per run (its id as the index): tokens/s and MFU with their intervals, as text and numbers."""
    rows = {}
    for run in load_runs(list(runs), runs_dir):
        rate = tokens_per_s(run)
        mfu, basis = mfu_estimate(run, peak)
        rows[run.run_id] = {"tokens_per_s": rate_text(rate), "mfu": mfu_text(mfu),
                            "tokens_per_s_value": rate.value, "tokens_per_s_low": rate.low,
                            "tokens_per_s_high": rate.high, "mfu_value": mfu.value, "mfu_basis": basis}
    return pd.DataFrame.from_dict(rows, orient="index")


def throughput_plot(runs, peak: Peak | None = None, runs_dir=None):
    """Tokens/s per layout with its 95 % interval (runs of one global batch), MFU written on each bar."""
    runs = [r for r in load_runs(list(runs), runs_dir) if tokens_per_s(r).usable or math.isfinite(tokens_per_s(r).value)]
    if not runs:
        return message_figure(["no run measured tokens/s"], title="tokens/s per layout")
    figure, axes = new_figure(size=(9, 4))
    ax = axes[0, 0]
    labels, bases = [], set()
    for index, run in enumerate(runs):
        rate = tokens_per_s(run)
        mfu, basis = mfu_estimate(run, peak)
        bases.add(basis)
        low = rate.value - rate.low if math.isfinite(rate.low) else 0
        high = rate.high - rate.value if math.isfinite(rate.high) else 0
        ax.bar(index, rate.value, yerr=[[low], [high]], color=f"C{index % 10}", capsize=4)
        if mfu.usable:
            ax.annotate(f"MFU {100 * mfu.value:.1f} %", (index, rate.value + high), ha="center", va="bottom",
                        fontsize=7, xytext=(0, 3), textcoords="offset points")
        labels.append(mode_label(run).replace(" ×", "\n×"))
    ax.set_xticks(range(len(runs)), labels, fontsize=8)
    batches = sorted({int(r.config.get("batch_size") or 0) for r in runs})
    ax.set(ylabel="tokens/s (95 % interval)",
           title=f"tokens/s per layout, global batch {', '.join(map(str, batches))} x {runs[0].config.get('seq_len')}")
    figure.text(0.01, -0.02, "MFU's peak: " + "; ".join(sorted(bases)), fontsize=7, wrap=True)
    return figure
