"""Day 3 views of the compile benchmark (TP3.3) and the read benchmark of the storage formats (TP3.4).

    compile_table(job_id) / compile_plot(job_id)    # compile time apart from step time, per part and variant
    read_table(job_id) / read_plot(job_id)          # images/s and MB/s per format and worker count
"""
from __future__ import annotations

import pandas as pd

from dlokit.analysis import stats
from dlokit.analysis.figures import add_notes, message_figure, new_figure
from dlokit.analysis.run import load_run

COMPILE_COLUMNS = ("part", "variant", "status", "t_compile", "t_step", "speedup", "speedup_low", "speedup_high",
                   "max_abs_diff", "agrees", "compiled", "graphs", "graph_breaks", "cache", "ddp", "reason")
READ_COLUMNS = ("format", "num_workers", "cache", "images", "images_per_s", "mb_per_s", "t_first_batch", "pixel_sum")


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
    return lines[[c for c in COMPILE_COLUMNS if c in lines]].reset_index(drop=True)


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
    """One row per storage format and DataLoader worker count."""
    return _lines(job_id, "read_result", READ_COLUMNS, runs_dir)


def read_plot(job_id, runs_dir=None):
    """images/s and MB/s read, per format, one bar per worker count."""
    table = read_table(job_id, runs_dir)
    if table.empty:
        return message_figure([load_run(job_id, runs_dir).describe_state()], title="storage formats")
    figure, axes = new_figure(1, 2, size=(11, 3.8))
    for ax, column, label in ((axes[0][0], "images_per_s", "images/s"), (axes[0][1], "mb_per_s", "MB/s read from disk")):
        wide = table.pivot_table(index="format", columns="num_workers", values=column)
        wide.plot.bar(ax=ax, rot=0)
        ax.set(ylabel=label, title=f"{label} per format", xlabel="")
        ax.legend(title="workers", fontsize=7)
    return figure
