"""Day 3 views of the compile benchmark (TP3.3) and the read benchmark of the storage formats (TP3.4).

    compile_table(job_id) / compile_plot(job_id)    # compile time apart from step time, per part and variant
    read_table(job_id) / read_plot(job_id)          # images/s (with its interval) and MB/s per format and workers
    fastest_read(job_id)                            # the fastest, and whether its lead is beyond noise
"""
from __future__ import annotations

import pandas as pd

from dlokit.analysis import stats
from dlokit.analysis.figures import add_notes, message_figure, new_figure
from dlokit.analysis.run import load_run

COMPILE_COLUMNS = ("part", "variant", "status", "t_compile", "t_step", "speedup", "speedup_low", "speedup_high",
                   "max_abs_diff", "agrees", "compiled", "graphs", "graph_breaks", "cache", "ddp", "reason")
READ_LINE_COLUMNS = ("format", "num_workers", "repeat", "cache", "images", "images_per_s", "mb_per_s", "t_first_batch",
                     "pixel_sum")
READ_COLUMNS = ("format", "num_workers", "cache", "images", "repeats", "images_per_s", "low", "high", "mb_per_s",
                "first_batch_ms", "pixel_sum")


CONTROL_FLOW_COLUMNS = ("variant", "example_branch", "same_as_eager_on_example", "same_as_eager_on_other_branch")


def control_flow_table(job_id, runs_dir=None) -> pd.DataFrame:
    """TorchScript's pitfall, as compile_bench.py measured it: per variant (trace, script), whether it still
    gives eager's answer on the branch of its example and on the other branch."""
    return _lines(job_id, "control_flow", CONTROL_FLOW_COLUMNS, runs_dir)


def _lines(job_id, kind: str, columns, runs_dir=None) -> pd.DataFrame:
    lines = load_run(job_id, runs_dir).lines(kind)
    return lines[[c for c in columns if c in lines]].reset_index(drop=True)


def compile_table(job_id, runs_dir=None) -> pd.DataFrame:
    """One row per part (model, function) and variant: compile time (first calls) apart from the steady step, and
    the speed-up against the part's reference (eager or NumPy) with its 95 % interval over the timed calls."""
    lines = load_run(job_id, runs_dir).lines("compile_result")
    if not lines.empty and "step_times" in lines:
        lines = lines.copy()
        estimates = [compile_speedup(lines, row) for _, row in lines.iterrows()]
        lines["speedup_low"] = [e.low for e in estimates]
        lines["speedup_high"] = [e.high for e in estimates]
    table = lines[[c for c in COMPILE_COLUMNS if c in lines]].reset_index(drop=True)
    table.attrs["basis"] = ("t_compile: seconds of the first calls (compiling); t_step: the median of the timed calls "
                            "after them; speedup: the part's reference (eager or NumPy) over this variant, "
                            "speedup_low–speedup_high its 95 % interval over the timed calls")
    return table


def _timed(row) -> list:
    times = row.get("step_times")
    warmup = int(row.get("warmup_steps") or 0)
    return list(times[warmup:]) if isinstance(times, list) else []


def compile_speedup(lines: pd.DataFrame, row) -> stats.Estimate:
    """The reference's time per call over this variant's (a speed-up), from their timed calls, with its interval."""
    if row.get("status") != "ok" or not row.get("reference"):
        return stats.NO_ESTIMATE
    reference = lines[(lines["part"] == row["part"]) & (lines["variant"] == row["reference"])]
    if reference.empty:
        return stats.NO_ESTIMATE
    return stats.ratio_of_samples([_timed(row)], [_timed(reference.iloc[0])])


UNCOMPILED = ("eager", "numpy", "fused")  # nothing traced, scripted or compiled: no compile time to write


def compile_plot(job_id, runs_dir=None):
    """Per part: steady-state time per call (bars) and the one-off compile time (written beside each traced,
    scripted or compiled variant)."""
    table = compile_table(job_id, runs_dir)
    done = table[table.get("status", pd.Series(dtype=str)) == "ok"] if not table.empty else table
    if done.empty:
        return message_figure([load_run(job_id, runs_dir).describe_state()], title="compilation")
    parts = list(dict.fromkeys(done["part"]))
    lines = load_run(job_id, runs_dir).lines("compile_result")
    figure, axes = new_figure(1, len(parts), size=(6 * len(parts), 3.8))
    for ax, part in zip(axes[0], parts):
        rows = done[done["part"] == part]
        ms = 1000 * rows["t_step"].astype(float)
        spread = [[], []]
        for variant, median in zip(rows["variant"], ms):  # each variant's timed calls: a 95 % interval of the median
            mine = lines[(lines["part"] == part) & (lines["variant"] == variant)]
            e = stats.estimate_of_samples([_timed(mine.iloc[0])]) if len(mine) else stats.NO_ESTIMATE
            spread[0].append(max(0.0, median - 1000 * e.low) if e.usable else 0.0)
            spread[1].append(max(0.0, 1000 * e.high - median) if e.usable else 0.0)
        bars = ax.barh(rows["variant"], ms, xerr=spread, capsize=3,
                       color=["tab:grey" if v == "eager" else "tab:blue" for v in rows["variant"]])
        for bar, variant, compile_s, above in zip(bars, rows["variant"], rows["t_compile"], spread[1]):
            if variant not in UNCOMPILED and pd.notna(compile_s):  # written past the whisker
                ax.annotate(f" compile {compile_s:.1f} s", (bar.get_width() + above, bar.get_y() + bar.get_height() / 2),
                            va="center", fontsize=7)
        ax.invert_yaxis()
        ax.set(xlabel="ms per call (median after warm-up, 95 % interval)", title=f"{part}: steady state; compile time written")
    skipped = table[table["status"] != "ok"] if "status" in table else table.iloc[0:0]
    notes = [f"{r.part}/{r.variant}: {r.status} ({r.reason})" for r in skipped.itertuples()]
    caches = set(done["cache"].dropna()) if "cache" in done else set()
    notes += [f"compile times: each compiled variant started from an empty kernel cache" if caches == {"fresh"} else
              "compile times: the kernel cache was shared, so a variant may have reused kernels compiled before it "
              "(compile_bench.py --fresh-cache compares them from scratch)"] if caches else []
    add_notes(figure, notes)
    return figure


def read_table(job_id, runs_dir=None) -> pd.DataFrame:
    """One row per storage format and DataLoader worker count: images/s over its repeats (read_bench.py --repeats),
    with a 95 % interval (a t-interval on the logarithm of the repeats' speeds; none from a single measurement),
    MB/s and the first batch's time in ms (worker start-up, files opened; medians), and what it read (images, pixel
    sum)."""
    table = _read_rows(_lines(job_id, "read_result", READ_LINE_COLUMNS, runs_dir))
    table.attrs["basis"] = ("images_per_s: over the repeats, low–high its 95 % interval (none from one repeat); "
                            "mb_per_s and first_batch_ms (worker start-up, files opened): medians of the repeats")
    return table


def _read_rows(lines: pd.DataFrame) -> pd.DataFrame:
    if lines.empty:
        return pd.DataFrame(columns=READ_COLUMNS)
    rows = []
    for (data_format, workers), group in lines.groupby(["format", "num_workers"], sort=False):
        speed = stats.estimate_of_samples([[value] for value in group["images_per_s"]])
        usable = speed.usable and len(group) > 1
        rows.append({"format": data_format, "num_workers": workers, "cache": group["cache"].iloc[0],
                     "images": group["images"].iloc[0], "repeats": len(group), "images_per_s": speed.value,
                     "low": speed.low if usable else float("nan"), "high": speed.high if usable else float("nan"),
                     "mb_per_s": group["mb_per_s"].median(), "first_batch_ms": 1000 * group["t_first_batch"].median(),
                     "pixel_sum": group["pixel_sum"].iloc[0]})
    return pd.DataFrame(rows, columns=READ_COLUMNS)


def fastest_read(job_id, runs_dir=None) -> str:
    """Which format and worker count read fastest, and whether its lead over the next one is beyond noise: the ratio
    of their speeds with its 95 % interval, from their repeats (dlokit.analysis.stats.ratio_of_samples). The sentence
    starts with what the interval says ("fastest here: ", "no single fastest here: "), so that no caller names a
    fastest that the numbers after it deny."""
    lines = _lines(job_id, "read_result", READ_LINE_COLUMNS, runs_dir)
    table = _read_rows(lines).sort_values("images_per_s", ascending=False)
    if table.empty:
        return "nothing was read"
    best = table.iloc[0]
    said = f"{best['format']} with {best['num_workers']} workers ({best['images_per_s']:.0f} img/s"
    said += f" [{best['low']:.0f}–{best['high']:.0f}])" if pd.notna(best["low"]) else ", one measurement)"
    if len(table) == 1:
        return f"one format read: {said}"
    second = table.iloc[1]

    def speeds(row):
        chosen = (lines["format"] == row["format"]) & (lines["num_workers"] == row["num_workers"])
        return [[value] for value in lines.loc[chosen, "images_per_s"]]

    lead = stats.ratio_of_samples(speeds(second), speeds(best))
    other = f"{second['format']} with {second['num_workers']} workers"
    if not lead.usable or lead.low == lead.high:
        return (f"fastest of one measurement each: {said}, then {other}; no interval to say whether the lead is "
                "real")
    if lead.low > 1:
        return f"fastest here: {said}, ×{lead.value:.2f} [{lead.low:.2f}–{lead.high:.2f}] the next, {other}"
    return (f"no single fastest here: {said} is within noise of {other} "
            f"(×{lead.value:.2f} [{lead.low:.2f}–{lead.high:.2f}])")


def read_plot(job_id, runs_dir=None):
    """images/s (with its 95 % interval) and MB/s read, per format, one bar per worker count; log scales, since the
    formats differ by tens of times."""
    table = read_table(job_id, runs_dir)
    if table.empty:
        return message_figure([load_run(job_id, runs_dir).describe_state()], title="storage formats")
    figure, axes = new_figure(1, 2, size=(11, 3.8))
    for ax, column, label in ((axes[0][0], "images_per_s", "images/s"), (axes[0][1], "mb_per_s", "MB/s read from disk")):
        wide = table.pivot_table(index="format", columns="num_workers", values=column, sort=False)
        errors = None
        if column == "images_per_s" and table["low"].notna().any():
            below = table.assign(e=table["images_per_s"] - table["low"]).pivot_table(
                index="format", columns="num_workers", values="e", sort=False)
            above = table.assign(e=table["high"] - table["images_per_s"]).pivot_table(
                index="format", columns="num_workers", values="e", sort=False)
            errors = {workers: [below[workers].to_numpy(), above[workers].to_numpy()] for workers in wide.columns}
        wide.plot.bar(ax=ax, rot=0, yerr=errors, capsize=3)
        title = f"{label} per format" + (f" ({table['repeats'].max()} reads each, 95 % intervals)" if errors else "")
        ax.set(ylabel=label, title=title, xlabel="", yscale="log")
        ax.legend(title="workers", fontsize=7)
    return figure


def control_flow_text(job_id, runs_dir=None) -> str:
    """control_flow_table in words: what each variant gave on the branch its example did not take."""
    return "\n".join(f"{row.variant}: on the other branch it gave " + (
        "eager's answer" if row.same_as_eager_on_other_branch else
        "NOT eager's answer (it replayed the branch of its example)")
        for row in control_flow_table(job_id, runs_dir).itertuples())


def startup_text(job_id, runs_dir=None) -> str:
    """The compiler's one-off start-up that compile_bench.py timed before its variants; why it timed none (no
    variant compiles: TODO TP3.3), or empty when the record says neither."""
    summary = load_run(job_id, runs_dir).summary
    startup = summary.get("compiler_startup_s")
    if not startup:
        return str(summary.get("compiler_startup_skipped") or "")
    return (f"the compiler's one-off start-up (its modules, its first C++ build) took {startup:.1f} s, paid before "
            "the variants; each variant's compile time below starts from an empty kernel cache")
