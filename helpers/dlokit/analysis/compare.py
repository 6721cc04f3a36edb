"""compare_runs: one metric across commands, as a table and bars, each with its interval and its ratio to a
baseline.

    compare_runs([a, b], "throughput_train")                        # each run is its own arm
    compare_runs({"fp32": [a1, a2], "bf16": [b1, b2]}, baseline="fp32")   # repeats of one command form one arm

An arm's value is the median of its runs' settled steps (dlokit.analysis.stats), with a 95 % interval; the
ratio to the baseline arm carries its own interval (the run is the unit when both arms were repeated). Given the
lesson the arms compare (`lesson="amp"`), an arm whose records show it computed what the baseline computed
(dlokit.analysis.expectations.untreated) gets no ratio: its bar says "same computation", and its row why.
"""
from __future__ import annotations

from typing import NamedTuple

import pandas as pd
from matplotlib.figure import Figure

from dlokit.analysis import stats
from dlokit.analysis.expectations import untreated
from dlokit.analysis.figures import add_notes, figure_png_base64, message_figure, new_figure
from dlokit.analysis.overlap import busy, foreign_notes, overlap_notes
from dlokit.analysis.run import load_runs
from dlokit.analysis.table import html_of, runs_table

METRICS = ("throughput_train", "throughput_compute", "t_step", "t_data", "t_forward", "t_backward",
           "t_optimizer", "gpu_mem_peak_mb", "host_rss_peak_mb", "energy_j", "val_acc",
           "best_val_acc", "wall_time_s", "first_step_load_s")
STEP_METRICS = ("throughput_train", "throughput_compute", "t_step", "t_data", "t_forward", "t_backward",
                "t_optimizer", "t_h2d", "t_metrics")  # measured every step: an interval from the steps


class Comparison(NamedTuple):
    """(table, figure); shows both in a notebook. `ratio(label)` is that arm's ratio to the baseline, a
    stats.Estimate (also in `table.attrs["ratios"]`)."""

    table: pd.DataFrame
    figure: Figure

    def ratio(self, label) -> stats.Estimate:
        return self.table.attrs.get("ratios", {}).get(str(label), stats.NO_ESTIMATE)

    def shown(self) -> pd.DataFrame:
        """The table as displayed: each value and its interval to the decimals the intervals support
        (stats.decimals: the most any row's needs, one count per column), four significant digits where none has
        an interval."""
        out = self.table.copy()
        for value, low, high in ((out.columns[3], "low", "high"), ("ratio", "ratio_low", "ratio_high")):
            places = [d for d in (stats.decimals(a, b) for a, b in zip(out[low], out[high])) if d is not None]
            for column in (value, low, high):
                out[column] = [_number(v, max(places, default=None)) for v in self.table[column]]
        return out

    def _repr_mimebundle_(self, include=None, exclude=None):
        png = figure_png_base64(self.figure)  # also as image/png, so that saved notebooks keep the chart
        shown = self.shown()
        table = html_of(shown)
        return {"text/html": table + f'<img src="data:image/png;base64,{png}"/>', "image/png": png,
                "text/plain": shown.to_string(index=False)}


def _number(value, places: int | None) -> str:
    if pd.isna(value):
        return ""
    return f"{value:.{places}f}" if places is not None else f"{value:.4g}"


def arms_of(runs) -> dict[str, list]:
    """{label: [run ids or Runs]}: a dict as given, else each run is its own arm, labelled by its id."""
    if isinstance(runs, dict):
        return {str(label): list(ids) if isinstance(ids, (list, tuple)) else [ids] for label, ids in runs.items()}
    runs = [runs] if isinstance(runs, (str, int)) or hasattr(runs, "run_id") else list(runs)
    return {str(getattr(r, "run_id", r)): [r] for r in runs}


def _baseline_label(arms: dict, baseline) -> str | None:
    if not arms:
        return None
    if baseline is None:
        return next(iter(arms))
    label = str(getattr(baseline, "run_id", baseline))
    if label in arms:
        return label
    for name, ids in arms.items():  # a run id inside an arm
        if label in [str(getattr(i, "run_id", i)) for i in ids]:
            return name
    raise ValueError(f"baseline {baseline!r} is not one of the compared arms or runs: {list(arms)}")


def _samples(runs, metric: str, table: pd.DataFrame) -> list:
    """One array per completed run: its settled steps, or its one reported value (peak memory, accuracy)."""
    if metric in STEP_METRICS:
        return [stats.step_values(r, metric) for r in runs if r.state == "completed"]
    rows = table[table["run_id"].isin([r.run_id for r in runs])]
    return [[v] for v in pd.to_numeric(rows[metric], errors="coerce").dropna()]


def _arm_row(label: str, runs, metric: str, table: pd.DataFrame) -> dict:
    rows = table[table["run_id"].isin([r.run_id for r in runs])]
    samples = _samples(runs, metric, table)
    value = stats.of_runs(samples) if metric in STEP_METRICS else stats.estimate_of_samples(samples)
    return {"arm": label, "runs": ", ".join(r.run_id for r in runs), "state": "/".join(sorted(set(rows["state"]))),
            metric: value.value, "low": value.low, "high": value.high,
            "overlapped_by": ", ".join(o for o in rows["overlapped_by"] if o),
            "foreign_cpu": rows["foreign_cpu"].max() if rows["foreign_cpu"].notna().any() else float("nan")}


def compare_runs(runs, metric: str = "throughput_train", baseline=None, runs_dir=None, lesson=None) -> Comparison:
    """Compare `metric` (a runs_table column) across arms; ratio = arm / baseline arm, with its interval. `lesson`
    (a dlokit.lessons name, or several): no ratio for an arm whose records show the same computation as the
    baseline's."""
    arms = arms_of(runs)
    loaded = {label: load_runs(ids, runs_dir) for label, ids in arms.items()}
    table = runs_table([r for group in loaded.values() for r in group])
    if metric not in table:
        raise ValueError(f"unknown metric {metric!r}; choose one of {list(METRICS)}")
    base = _baseline_label(arms, baseline)
    rows = [_arm_row(label, group, metric, table) for label, group in loaded.items()]
    base_samples = _samples(loaded[base], metric, table) if base is not None else []
    estimates, same = {}, {}
    for row in rows:
        arm = row["arm"]
        if arm == base:
            estimate = stats.Estimate(1.0, 1.0, 1.0, len(base_samples), sum(len(s) for s in base_samples))
        else:
            same[arm] = untreated(lesson, loaded[base], loaded[arm]) if lesson and loaded[base] else ""
            estimate = stats.NO_ESTIMATE if same[arm] else \
                stats.ratio_of_samples(base_samples, _samples(loaded[arm], metric, table))
        estimates[arm] = estimate
        row.update(ratio=estimate.value, ratio_low=estimate.low, ratio_high=estimate.high,
                   basis="baseline" if arm == base else f"same computation: {same[arm]}" if same.get(arm) else
                   estimate.basis_text if estimate.runs else "")
    out = pd.DataFrame(rows, columns=["arm", "runs", "state", metric, "low", "high", "ratio", "ratio_low",
                                      "ratio_high", "basis", "overlapped_by", "foreign_cpu"])
    out.attrs["ratios"], out.attrs["same"] = estimates, {arm: why for arm, why in same.items() if why}
    out.attrs["basis"] = (f"{metric}: " + ("the median of each arm's settled steps" if metric in STEP_METRICS else
                                           "the median over each arm's runs") +
                          " [its 95 % interval]; ratio: the arm's value over the baseline's [its 95 % interval], on the "
                          "basis said")
    return Comparison(out, _bars(out, metric, base, table, estimates, out.attrs["same"]))


def _short(text: str, width: int = 24) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _bars(out: pd.DataFrame, metric: str, base: str, table: pd.DataFrame, estimates: dict, same: dict) -> Figure:
    plotted = out[out[metric].notna()]
    notes = [f"run {r.runs}: {r.state}, no {metric}" for r in out[out[metric].isna()].itertuples()]
    notes += overlap_notes({r.run_id: r.overlapped_by.split(", ") for r in table.itertuples() if r.overlapped_by})
    notes += foreign_notes(dict(zip(table["run_id"], table["foreign_cpu"])))
    notes += [f"{arm}: same computation as {base}: {why}" for arm, why in same.items()]
    if plotted.empty:
        return message_figure(notes or ["no runs to compare"], title=metric)
    notes.append("bars: median of the settled steps; whiskers and [brackets]: 95 % intervals" if metric in STEP_METRICS
                 else "whiskers and [brackets]: 95 % intervals over the runs of each arm")
    if any(e.basis == stats.WIDENED for e in estimates.values()):
        notes.append("[brackets] of one run each: widened by the spread between two runs of one command")
    if any(e.basis == stats.FLOORED for e in estimates.values()):
        notes.append("[brackets] of runs that agreed closely: their spread taken as that of runs of one command here")
    figure, axes = new_figure(size=(max(5, 1.3 * len(plotted) + 2), 4))
    ax = axes[0, 0]
    labels = [_short(str(r.arm)) + ("" if r.state == "completed" else f"\n{_short(r.state)}") for r in plotted.itertuples()]
    low = (plotted[metric] - plotted["low"]).clip(lower=0).fillna(0)
    high = (plotted["high"] - plotted[metric]).clip(lower=0).fillna(0)
    colors = ["tab:gray" if r.arm == base else "lightgray" if r.arm in same else "tab:blue" for r in plotted.itertuples()]
    bars = ax.bar(labels, plotted[metric], yerr=[low, high], capsize=4, color=colors,
                  hatch=["//" if r.overlapped_by or busy(r.foreign_cpu) else "" for r in plotted.itertuples()])
    ax.bar_label(bars, labels=[_bar_label(r.arm, base, estimates, same) for r in plotted.itertuples()],
                 fontsize=8, padding=2)
    ax.set(ylabel=metric)
    ax.set_title(f"{metric}\n(ratio to {base}, 95 % interval)", fontsize=10)
    ax.tick_params(axis="x", labelsize=8)
    add_notes(figure, notes)
    return figure


def _bar_label(arm: str, base: str, estimates: dict, same: dict) -> str:
    if arm == base:
        return "baseline"
    return "same computation" if arm in same else estimates[arm].text()


def fastest_shown(verdicts: dict, default: str) -> tuple[str, str]:
    """(the arm whose gain this machine showed with the largest ratio, why it was kept): among the verdicts
    {arm: lessons.Verdict} that agree with their lesson; `default` when none did. The reason says what each
    other arm's verdict was, so that it never reads against the numbers shown beside it (a lesson that does not
    apply here keeps `default` whatever its ratio was, which makes the choice the same on every run)."""
    shown = {arm: v.estimate.value for arm, v in verdicts.items() if v.outcome == stats.AGREES}
    if shown:
        best = max(shown, key=shown.get)
        if len(verdicts) == 1:
            return best, f"this machine showed its gain over {default}: {verdicts[best].estimate.text()}"
        return best, f"its gain over {default} is the largest this machine showed"
    return default, "; ".join(_not_kept(arm, v, default) for arm, v in verdicts.items())


def _not_kept(arm: str, verdict, default: str) -> str:
    measured = verdict.estimate.text() if verdict.estimate.runs else "not measured"
    if verdict.outcome == stats.SAME_COMPUTATION:
        return f"{arm} computed the same as {default}: {verdict.same}"
    if verdict.outcome == stats.NOT_APPLICABLE:
        return f"{arm}'s gain does not apply on this hardware: {default} stays, whatever {arm} measured ({measured})"
    if verdict.outcome == stats.CONTRADICTS:
        return f"{arm} was slower than {default} here ({measured})"
    if verdict.outcome in (stats.NO_MEASUREMENT, stats.NO_INTERVAL):
        return f"{arm} has no measurement to judge ({measured})"
    return f"{arm} showed no gain over {default} beyond noise here ({measured})"
