"""memory_vs_batch: peak memory against batch size, the OOM point, and model vs activation memory.

Peak memory grows about linearly with the batch: the intercept is what does not depend on the batch
(weights, gradients, optimizer states), the slope is the activation memory per sample.

The line is drawn through what a step holds in tensors (train_classifier.py's `tensor_held_mib`, counted by
tp_scripts/common/tensor_memory.py: autograd's saved tensors, weights, gradients, optimizer states) when the records
have it: those counts are the same every run, so the slope's interval excludes 0 every time. A process's peak RSS
(~760 MiB on the CPU, the interpreter and the libraries) moved by tens of MiB from run to run and hid Day 1's
activations: its slope read 0.04 [-1.71–1.80] MiB per image in one course run, 0.26 [0.09–0.43] in the next.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dlokit.analysis import stats
from dlokit.analysis.figures import add_notes, message_figure, new_figure
from dlokit.analysis.run import COMPLETED, load_runs
from dlokit.analysis.table import as_number, runs_table


BASES = {  # memory= : (the column, the plot's axis, its points' label)
    "tensors": ("tensor_held_mib", "tensors held by a step",
                "tensors a step holds (autograd's saved activations + weights, gradients, optimizer states)"),
    "gpu": ("gpu_mem_peak_mb", "GPU peak allocated", "GPU peak allocated (max_memory_allocated)"),
    "host": ("host_rss_peak_mb", "host peak RSS", "host peak RSS (the process: interpreter and libraries too)"),
}


def tensor_held_mib(run):
    """The busiest rank's tensors held by a step (its summary's tensor_held_mib), None when not recorded."""
    values = [as_number(summary.get("tensor_held_mib")) for summary in run.summaries]
    return max((v for v in values if v is not None), default=None)


def memory_table(runs, runs_dir=None, memory: str = "auto") -> pd.DataFrame:
    """batch_size, peak memory (MiB), oom, state per run; memory='tensors', 'gpu', 'host' or 'auto': the tensors a
    step holds when any record has them, else the GPU's peak if any, else the host's."""
    loaded = load_runs(runs, runs_dir)
    table = runs_table(loaded)
    table["tensor_held_mib"] = [tensor_held_mib(run) for run in loaded]
    if memory == "auto":
        memory = next(basis for basis, (column, *_) in BASES.items()
                      if basis == "host" or table[column].notna().any())
    column = BASES[memory][0]
    out = table[["run_id", "state", "batch_size", column, "oom"]].rename(columns={column: "peak_mb"})
    out["peak_mb"] = pd.to_numeric(out["peak_mb"], errors="coerce")
    out.attrs["memory"] = memory
    return out.sort_values("batch_size", na_position="last").reset_index(drop=True)


def memory_fit(table: pd.DataFrame) -> dict | None:
    """Least-squares line through completed runs (scipy.stats.linregress): {'model_mb', 'activation_mb_per_sample',
    'slope_low', 'slope_high', 'points'}, the slope's 95 % interval from its standard error (NaN with two points:
    a line through two points has none), and 'slope_shown': False when that interval contains 0 or is missing — the
    peaks' noise drowns the activations (host memory holds the interpreter and the libraries too, and moves by tens
    of MiB from run to run; the tensors a step holds do not move)."""
    from scipy import stats as scipy_stats

    ok = table[(table["state"] == COMPLETED) & ~table["oom"]].dropna(subset=["batch_size", "peak_mb"])
    if ok["batch_size"].nunique() < 2:
        return None
    fit = scipy_stats.linregress(ok["batch_size"].astype(float), ok["peak_mb"].astype(float))
    dof = len(ok) - 2
    half = scipy_stats.t.ppf(0.975, dof) * fit.stderr if dof > 0 else float("nan")
    low, high = fit.slope - half, fit.slope + half
    return {"model_mb": float(fit.intercept), "activation_mb_per_sample": float(fit.slope), "slope_low": float(low),
            "slope_high": float(high), "points": len(ok), "slope_shown": bool(dof > 0 and low > 0)}


def memory_vs_batch(runs, runs_dir=None, memory: str = "auto"):
    """Scatter of peak memory vs batch size, a linear fit, and a red cross per OOM batch size; the axis names
    what was measured (memory_table's basis)."""
    table = memory_table(runs, runs_dir, memory)
    measured = table[~table["oom"]].dropna(subset=["batch_size", "peak_mb"])
    ooms = table[table["oom"]].dropna(subset=["batch_size"])
    notes = [f"run {r.run_id}: {r.state}, no {'batch size' if pd.isna(r.batch_size) else 'memory reading'}"
             for r in table.itertuples() if not r.oom and (pd.isna(r.batch_size) or pd.isna(r.peak_mb))]
    if measured.empty and ooms.empty:
        return message_figure(notes or ["no runs"], title="memory vs batch size")
    figure, axes = new_figure()
    ax = axes[0, 0]
    _, axis, basis = BASES[table.attrs["memory"]]
    ax.plot(measured["batch_size"], measured["peak_mb"], "o", label=basis, color="tab:blue")
    fit = memory_fit(table)
    if fit:
        xs = np.linspace(0, max(table["batch_size"].dropna().max(), 1), 50)
        slope = (f"{fit['activation_mb_per_sample']:.2f} [{fit['slope_low']:.2f}–{fit['slope_high']:.2f}] MiB/image"
                 if np.isfinite(fit["slope_low"]) else f"{fit['activation_mb_per_sample']:.2f} MiB/image")
        ax.plot(xs, fit["model_mb"] + fit["activation_mb_per_sample"] * xs, "--", color="tab:gray",
                label=f"fit: {fit['model_mb']:.0f} MiB + {slope}" + ("" if fit["slope_shown"] else " (two points: no interval)"
                                                              if fit["points"] < 3 else " (within noise)"))
    if not ooms.empty:
        top = measured["peak_mb"].max() if not measured.empty else 0.0
        ys = [fit["model_mb"] + fit["activation_mb_per_sample"] * b if fit else top for b in ooms["batch_size"]]
        ax.plot(ooms["batch_size"], ys, "x", color="tab:red", markersize=12, mew=3, label="out of memory")
        for b in ooms["batch_size"]:
            ax.axvline(b, color="tab:red", alpha=0.3)
    ax.set(xlabel="batch size (per GPU)", ylabel=f"{axis} (MiB)", title="memory vs batch size")
    ax.legend(fontsize=8)
    add_notes(figure, notes)
    return figure


# A smaller batch is kept only when shown this close to every larger one (its speed ratio's whole interval above 1 - it).
EQUIVALENT_WITHIN = 0.05


def batch_speeds(runs, runs_dir=None, metric: str = "throughput_compute") -> pd.DataFrame:
    """A batch scan: per completed run, its batch size and `metric` (median of the settled steps) with its 95 %
    interval; `low_vs_larger` the lowest bound, over every larger batch, of the interval of its speed ratio to
    that batch; `as_fast_as_larger` whether that bound is at least 1 - EQUIVALENT_WITHIN: shown within 5 % of every
    larger batch (the largest batch is, having none).

    Why not "within noise of the fastest": under noise every interval widens and overlaps, and the fastest itself
    changes when the top two are close, so the choice moved with the noise: Day 1 on a 2-core CPU chose 64, 64,
    16, 64 in four course runs of 2026-11-27, then 32 (by a median 6 % above 64's, intervals overlapping). Here a
    smaller batch must show that it is as fast; noise alone keeps the largest batch (64 in all five, recomputed).
    With one run per batch the ratio carries the spread between two runs of one command (stats.RUN_SPREAD, ±30 %):
    no smaller batch can show it, and the scan keeps its largest batch every time.
    The default reads the device's work (forward, backward, optimizer step), not the loader's: on an H100 a
    loader without workers fed Day 1's JPEGs at ~500 img/s while the GPU computed 1,760 (batch 32) to 2,300
    (batch 256), so a scan of the whole step measured the loader (docs/benchmarks.md, 2026-11-26)."""
    rows, completed = [], {}
    for run in load_runs(runs, runs_dir):
        batch = run.config.get("batch_size")
        if run.state != COMPLETED or batch is None:
            continue
        value = stats.estimate(run, metric)
        if value.runs:
            completed[run.run_id] = run
            rows.append({"run_id": run.run_id, "batch_size": int(batch), metric: value.value, "low": value.low,
                         "high": value.high})
    columns = ["run_id", "batch_size", metric, "low", "high", "low_vs_larger", "as_fast_as_larger"]
    if not rows:
        return pd.DataFrame(columns=columns)
    table = pd.DataFrame(rows).sort_values(["batch_size", metric]).reset_index(drop=True)
    runs_in_order = [completed[run_id] for run_id in table["run_id"]]
    table["low_vs_larger"] = [min((stats.ratio(larger, run, metric).low for larger in runs_in_order[i + 1:]
                                   if larger.config.get("batch_size") > run.config.get("batch_size")),
                                  default=math.nan)
                              for i, run in enumerate(runs_in_order)]
    table["as_fast_as_larger"] = table["low_vs_larger"].isna() | (table["low_vs_larger"] >= 1 - EQUIVALENT_WITHIN)
    table = table[columns]
    table.attrs["notes"] = [f"low_vs_larger: the lowest bound of the 95 % interval of this batch's speed over each larger "
                            f"batch's; as_fast_as_larger: that bound is at least {1 - EQUIVALENT_WITHIN:g}, so no larger "
                            f"batch is shown faster by more than {EQUIVALENT_WITHIN:.0%} (the largest batch: nothing "
                            "to compare, True)"]
    return table


def chosen_batch(runs, runs_dir=None, metric: str = "throughput_compute") -> int | None:
    """The batch a scan recommends: the smallest one shown to be within EQUIVALENT_WITHIN of every larger batch (a
    larger one buys nothing this scan could measure, and costs memory and steps per epoch); the largest batch
    scanned when no smaller one is shown so. None when no run completed."""
    table = batch_speeds(runs, runs_dir, metric)
    return int(table.loc[table["as_fast_as_larger"].astype(bool), "batch_size"].min()) if not table.empty else None


def throughput_vs_batch(runs, runs_dir=None, metric: str = "throughput_compute"):
    """Throughput against batch size (the batch scan) with 95 % intervals, the out-of-memory batch sizes marked,
    and the batch chosen_batch() recommends."""
    table = runs_table(load_runs(runs, runs_dir))
    table[metric] = pd.to_numeric(table[metric], errors="coerce")
    speeds = batch_speeds(runs, runs_dir, metric)
    ooms = table[table["oom"]].dropna(subset=["batch_size"])
    notes = [f"run {r.run_id}: {r.state}, no {metric}" for r in table.itertuples()
             if not r.oom and pd.isna(getattr(r, metric))]
    notes += [f"⚠ run {r.run_id} overlapped {r.overlapped_by}: not a valid measurement"
              for r in table.itertuples() if r.overlapped_by]
    if speeds.empty:
        return message_figure(notes or ["no runs"], title="throughput vs batch size")
    figure, axes = new_figure()
    ax = axes[0, 0]
    spread = [(speeds[metric] - speeds["low"]).clip(lower=0).fillna(0),
              (speeds["high"] - speeds[metric]).clip(lower=0).fillna(0)]
    ax.errorbar(speeds["batch_size"], speeds[metric], yerr=spread, fmt="o-", capsize=3, color="tab:blue",
                label=f"{metric} (median of the settled steps, 95 % interval)")
    for b in ooms["batch_size"]:
        ax.axvline(b, color="tab:red", alpha=0.4, label="out of memory" if b == ooms["batch_size"].iloc[0] else None)
    chosen = speeds[speeds["as_fast_as_larger"].astype(bool)].iloc[0]
    last = chosen["batch_size"] == speeds["batch_size"].max()  # then the label goes left, inside the axes
    why = ("the largest: no smaller batch shown within" if last else "the smallest shown within")
    ax.annotate(f"chosen: batch {int(chosen['batch_size'])}\n({why} {100 * EQUIVALENT_WITHIN:.0f} % of every "
                "larger one)",
                (chosen["batch_size"], chosen[metric]), fontsize=8, xytext=(-8 if last else 5, -22),
                textcoords="offset points", ha="right" if last else "left")
    ax.set(xlabel="batch size (per GPU)", ylabel=f"images / s ({metric.removeprefix('throughput_')})",
           title="throughput vs batch size", xscale="log")
    ax.set_xticks(speeds["batch_size"], [str(int(b)) for b in speeds["batch_size"]])
    ax.minorticks_off()
    ax.legend(fontsize=8)
    add_notes(figure, notes)
    return figure


class BatchScan:
    """Day 1's batch scan read back: each batch size's outcome (from the scheduler, so a job killed before it
    wrote a record counts too), the largest that fitted, and the memory line through the completed runs.
    print(scan) says what the scan shows; scan.outcomes, scan.fits and scan.oom are tables."""

    def __init__(self, jobs: list, sizes: list[int], states: list[str], on_gpu: bool, model_states_mib: float,
                 runs_dir=None):
        self.jobs, self.on_gpu, self.model_states_mib = list(jobs), on_gpu, model_states_mib
        self.outcomes = pd.DataFrame({"job": self.jobs, "batch_size": list(sizes), "outcome": list(states)})
        self.fits = self.outcomes[self.outcomes["outcome"] == "COMPLETED"]
        self.oom = self.outcomes[self.outcomes["outcome"] == "OUT_OF_MEMORY"]
        table = memory_table(self.jobs, runs_dir)
        self.basis, self.fit = table.attrs["memory"], memory_fit(table)
        self.autocast = any(str(run.config.get("amp") or "none") not in ("none", "fp32")
                            for run in load_runs([j for j in self.jobs if j], runs_dir))

    @property
    def largest_fitting(self) -> int | None:
        return int(self.fits["batch_size"].max()) if not self.fits.empty else None

    def busy_batch(self, default: int) -> int:
        """The batch of a comparison that needs busy tensor cores: on a GPU the largest that fitted, on a CPU (or
        when none fitted) `default`."""
        return (self.largest_fitting or default) if self.on_gpu else default

    def __str__(self) -> str:
        lines = [f"out of memory from batch {self.oom['batch_size'].min()} on; the largest batch that fits: "
                 f"{self.largest_fitting or 'none'}" if not self.oom.empty else
                 f"no out-of-memory in this scan ({'GPU' if self.on_gpu else 'host'} memory measured)"]
        fit = self.fit
        if fit and fit["slope_shown"]:
            lines.append(f"linear fit: {fit['model_mb']:.0f} MiB that do not depend on the batch + "
                         f"{fit['activation_mb_per_sample']:.2f} [{fit['slope_low']:.2f}–{fit['slope_high']:.2f}] "
                         f"MiB per image (95 % interval), measured on the {BASES[self.basis][2]}")
            lines.append(f"(weights + gradients + momentum alone are {self.model_states_mib:.0f} MiB; " + (
                ("the rest, if any, is the weights' 16-bit copies that autocast keeps for backward)" if self.autocast
                 else "compare the line's intercept above: in fp32 autocast keeps no copies)")
                if self.basis == "tensors" else
                "the rest of the intercept is workspaces and transient tensors: max_memory_allocated "
                "leaves out the CUDA context and the allocator's cache)" if self.on_gpu else
                "on the CPU the intercept also holds the interpreter and the PyTorch libraries)"))
        elif fit and fit["points"] < 3:
            lines.append(f"two batch sizes only: the line through them ({fit['activation_mb_per_sample']:.2f} MiB "
                         "per image) has no interval, so it cannot tell activations from noise; add sizes to "
                         "BATCH_SWEEP (GPU_BATCH_SWEEP on a GPU)")
        elif fit:
            lines.append(f"the memory per image is within noise here: the fit's slope, "
                         f"{fit['activation_mb_per_sample']:.2f} [{fit['slope_low']:.2f}–{fit['slope_high']:.2f}] "
                         "MiB per image, could be 0. "
                         + ("" if self.on_gpu else "A CPU process's peak holds the interpreter and the libraries "
                            f"(about {fit['model_mb']:.0f} MiB) and moves by tens of MiB from run to run: at these "
                            "sizes the activations hide in it. ") + "Larger images or batches make them show.")
        return "\n".join(lines)


def batch_scan(jobs, sizes, states=None, on_gpu: bool = False, model_states_mib: float = 0.0,
               runs_dir=None) -> BatchScan:
    """The scan of `sizes` run as `jobs`, whose scheduler states are `states` (None: each job's
    dlokit.job_outcome(j).state)."""
    if states is None:
        from dlokit.submission.jobs import job_outcome

        states = [job_outcome(job).state for job in jobs]
    return BatchScan(jobs, sizes, states, on_gpu, model_states_mib, runs_dir)


def model_states(model: str, classes: int) -> pd.DataFrame:
    """The memory of a torchvision model's training state in fp32, tensor by tensor (MiB); attrs["mib"]: weights,
    gradients and SGD momentum, what stays whatever the batch. Prints the sum."""
    import torchvision

    parameters = sum(p.numel() for p in torchvision.models.get_model(model, num_classes=classes).parameters())
    states = pd.DataFrame({
        "tensor per parameter": ["weights", "gradients", "SGD momentum (this course)", "Adam m and v (for comparison)"],
        "bytes each": [4, 4, 4, 8],
    })
    states["MiB"] = states["bytes each"] * parameters / 2**20
    states.attrs["mib"] = states["MiB"].iloc[:3].sum()
    print(f"{model}: {parameters:,} parameters -> weights + gradients + momentum = {states.attrs['mib']:.0f} MiB in fp32")
    return states
