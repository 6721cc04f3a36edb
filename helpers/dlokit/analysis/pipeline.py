"""Pipeline runs of train_llm.py as they ran: a timeline per stage, and the bubble measured against theory.

pipeline_timeline(run)  a Gantt chart of one step: each stage's forward, backward and loss per micro-batch
                        (the `pp_event` lines, seconds from the step's common start), idle time left blank
bubble_table(runs)      per run: schedule, p, v, m, each stage's idle fraction (1 − busy / step time, median of
                        the timed steps), the pipeline's (the busiest stage's, with a 95 % interval) and the theory's (p − 1) / (v·m + p − 1); also as bubble / ideal time
bubble_trend(runs)      how the measured bubble moves from the fewest micro-batches to each count: falls, rises or
                        within noise, from the interval of the ratio of the two runs' per-step bubbles
bubble_plot(runs)       the same against the number of micro-batches, with the intervals, theory as a dashed line
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from dlokit.analysis import stats
from dlokit.analysis.figures import add_notes, message_figure, new_figure
from dlokit.analysis.run import COMPLETED, load_run, load_runs

EVENT_COLUMNS = ["rank", "step", "stage", "microbatch", "phase", "t_start", "t_end"]
PHASE_COLORS = {"fwd": "tab:blue", "loss": "tab:gray", "bwd": "tab:orange", "bwd_weight": "tab:red"}


def pipeline_events(run, runs_dir=None) -> pd.DataFrame:
    """Every `pp_event` line of every rank (columns EVENT_COLUMNS); empty for a run without them."""
    metrics = load_run(run, runs_dir).metrics
    if metrics.empty or "kind" not in metrics or not set(EVENT_COLUMNS) <= set(metrics.columns):
        return pd.DataFrame(columns=EVENT_COLUMNS)
    events = metrics.loc[metrics["kind"] == "pp_event", EVENT_COLUMNS]
    return events.dropna(subset=["step", "stage", "t_start", "t_end"]).reset_index(drop=True)


def _theory(p: int, v: int, m: int) -> float:
    return (p - 1) / (v * m + p - 1)


def _shape(run) -> tuple[str, int, int, int]:
    """(schedule, stages p, virtual stages per rank v, micro-batches m) as the run ran them."""
    config, summary = run.config, run.summary
    schedule = str(config.get("pp_schedule") or "?")
    p = int(config.get("pp") or run.world_size)
    v = int(summary.get("pp_virtual_stages") or (config.get("pp_virtual") if schedule == "interleaved" else 1) or 1)
    m = int(summary.get("pp_microbatches") or (1 if schedule == "naive" else config.get("microbatches") or 1))
    return schedule, p, v, m


def _idle_steps(run) -> dict[int, list]:
    """Each rank's idle fraction of each timed step (the first `warmup` steps left out)."""
    warmup = int(run.config.get("warmup") or 0)
    idle = {}
    for rank in sorted(run.ranks):
        steps = run.lines("step", rank)
        if steps.empty or "pp_idle_fraction" not in steps:
            continue
        values = pd.to_numeric(steps["pp_idle_fraction"], errors="coerce").dropna()
        timed = values.iloc[warmup:] if len(values) > warmup else values
        if not timed.empty:
            idle[rank] = timed.tolist()
    return idle


def _idle_by_rank(run) -> dict[int, float]:
    """Each rank's idle fraction, the median of its timed steps (as the bubble's: a stray slow step moves it little)."""
    return {rank: float(np.median(values)) for rank, values in _idle_steps(run).items()}


def _busiest_steps(run) -> list:
    """The per-step idle fractions of the busiest stage (the least idle on average): the pipeline's bubble."""
    idle = _idle_by_rank(run)
    return _idle_steps(run)[min(idle, key=idle.get)] if idle else []


def bubble_table(runs, runs_dir=None) -> pd.DataFrame:
    rows = []
    for run in load_runs(runs, runs_dir):
        schedule, p, v, m = _shape(run)
        idle = _idle_by_rank(run)
        # the pipeline is as idle as its busiest stage: the median of its timed steps
        bubble = stats.estimate_of_samples([_busiest_steps(run)]) if idle else stats.NO_ESTIMATE
        measured = bubble.value if idle else None
        pipelined = p > 1  # else not a pipeline run: nothing to compare with
        rows.append({
            "run": run.label, "state": run.state, "schedule": schedule, "p": p, "v": v, "m": m,
            "idle_by_stage": [round(idle[r], 3) for r in sorted(idle)],
            "bubble_measured": measured, "bubble_low": bubble.low, "bubble_high": bubble.high,
            "bubble_theory": _theory(p, v, m) if pipelined else None,
            "bubble_over_ideal_measured": measured / (1 - measured) if measured is not None and measured < 1 else None,
            "bubble_over_ideal_theory": (p - 1) / (v * m) if pipelined else None,
        })
    table = pd.DataFrame(rows, columns=["run", "state", "schedule", "p", "v", "m", "idle_by_stage", "bubble_measured",
                                        "bubble_low", "bubble_high", "bubble_theory", "bubble_over_ideal_measured",
                                        "bubble_over_ideal_theory"])
    table.attrs["basis"] = ("bubble_measured: the busiest stage's idle share of a step, the median of the timed steps, "
                            "bubble_low–bubble_high its 95 % interval; bubble_theory: (p−1)/(v·m+p−1); "
                            "idle_by_stage: each stage's idle share, the median of its timed steps")
    return table


FALLS, RISES, FLAT = "falls", "rises", "within noise"


def bubble_trend(runs, runs_dir=None) -> pd.DataFrame:
    """One row per micro-batch count after the fewest (runs of one schedule and p, sorted by m): the ratio of the
    busiest stage's per-step bubble to the fewest micro-batches' one, its 95 % interval, and what it says: falls, rises
    or within noise. Against the fewest, not the neighbour: from one step up to the next the bubble moves by less
    than a 2-core CPU's run-to-run spread (m=2→4 read "falls" in three course runs and "within noise" in three),
    from m=1 it falls in every run."""
    loaded = sorted(load_runs(runs, runs_dir), key=lambda r: _shape(r)[3])
    rows = []
    for before, after in ((loaded[0], later) for later in loaded[1:]):
        ratio = stats.ratio_of_samples([_busiest_steps(before)], [_busiest_steps(after)])
        outcome = ratio.outcome(expects_gain=True)
        word = {stats.AGREES: RISES, stats.CONTRADICTS: FALLS}.get(outcome, FLAT)
        rows.append({"m_from": _shape(before)[3], "m_to": _shape(after)[3], "ratio": ratio.value,
                     "ratio_low": ratio.low, "ratio_high": ratio.high, "trend": word if ratio.usable else FLAT,
                     "theory_ratio": _theory(*_shape(after)[1:]) / _theory(*_shape(before)[1:])})
    table = pd.DataFrame(rows, columns=["m_from", "m_to", "ratio", "ratio_low", "ratio_high", "trend", "theory_ratio"])
    table.attrs["basis"] = ("ratio: the busiest stage's bubble per step at m_to over that at m_from, with its 95 % "
                            "interval over their timed steps; trend follows from the interval; theory_ratio: the same "
                            "from (p−1)/(v·m+p−1)")
    return table


def bubble_plot(runs, runs_dir=None):
    table = bubble_table(runs, runs_dir)
    plotted = table.dropna(subset=["bubble_measured"])
    notes = [f"{row.run}: {row.state}, no timed pipeline steps" for row in table.itertuples()
             if pd.isna(row.bubble_measured)]
    notes += [f"{row.run}: {row.state}" for row in plotted.itertuples() if row.state != COMPLETED]
    if plotted.empty:
        return message_figure(notes or ["no pipeline runs"], title="pipeline bubble")
    figure, axes = new_figure(size=(7, 4.5))
    ax = axes[0][0]
    for index, ((schedule, p, v), group) in enumerate(plotted.groupby(["schedule", "p", "v"], sort=False)):
        group = group.sort_values("m")
        color = f"C{index % 10}"
        label = f"{schedule}, p={p}" + (f", v={v}" if v > 1 else "")
        spread = [(group["bubble_measured"] - group["bubble_low"]).clip(lower=0).fillna(0),
                  (group["bubble_high"] - group["bubble_measured"]).clip(lower=0).fillna(0)]
        ax.errorbar(group["m"], group["bubble_measured"], yerr=spread, fmt="o-", capsize=3, color=color,
                    label=f"{label}: measured (95 % interval over the steps)")
        ms = sorted(set(group["m"]) | {1, int(group["m"].max())})
        ax.plot(ms, [_theory(p, v, m) for m in ms], "--", color=color, alpha=0.7, label=f"{label}: (p−1)/(v·m+p−1)")
    ax.set(xscale="log", xlabel="micro-batches m", ylabel="idle fraction of the step (busiest stage)",
           title="pipeline bubble: measured vs theory", ylim=(0, 1))
    ax.set_xticks(sorted(plotted["m"].unique()), [str(m) for m in sorted(plotted["m"].unique())])
    ax.minorticks_off()
    ax.legend(fontsize=7)
    add_notes(figure, notes)
    return figure


def pipeline_timeline(run, step: int | None = None, runs_dir=None):
    """One step of a pipeline run as a Gantt chart: a row per stage, a bar per forward (blue), loss
    (grey) and backward (orange) of each micro-batch, numbered; blank is idle. Default: the last step."""
    run = load_run(run, runs_dir)
    events = pipeline_events(run)
    if events.empty:
        return message_figure([run.describe_state(), "no pp_event lines: not a pipeline run of train_llm.py"],
                              title="pipeline timeline")
    step = int(events["step"].max()) if step is None else int(step)
    chosen = events[events["step"] == step]
    if chosen.empty:
        return message_figure([f"run {run.label}: no timeline for step {step}; steps: "
                               f"{int(events['step'].min())}..{int(events['step'].max())}"], title="pipeline timeline")
    stages = sorted(int(s) for s in chosen["stage"].unique())
    figure, axes = new_figure(size=(11, 1.2 + 0.7 * len(stages)))
    ax = axes[0][0]
    for (stage, phase), group in chosen.groupby(["stage", "phase"]):
        y = stages.index(int(stage))
        bars = [(1e3 * s, 1e3 * (e - s)) for s, e in zip(group["t_start"], group["t_end"])]
        ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=PHASE_COLORS.get(phase, "tab:green"), edgecolor="white")
        if phase != "loss":
            for (start, width), micro in zip(bars, group["microbatch"]):
                ax.text(start + width / 2, y, str(int(micro)), ha="center", va="center", fontsize=7, color="white")
    owner = chosen.groupby("stage")["rank"].first()
    ax.set_yticks(range(len(stages)), [f"stage {s} (rank {int(owner[s])})" for s in stages])
    ax.invert_yaxis()
    steps = run.lines("step")
    span = None
    if not steps.empty and "pp_span_s" in steps:
        spans = steps.loc[steps["step"] == step, "pp_span_s"].dropna()
        span = float(spans.iloc[0]) if not spans.empty else None
    if span:
        ax.axvline(1e3 * span, color="black", lw=1, ls=":")
    schedule, p, v, m = _shape(run)
    idle = _idle_by_rank(run)
    measured = f"{min(idle.values()):.2f}" if idle else "?"
    ax.set(xlabel="ms from the step's start (all stages start together)",
           title=f"{run.label}: {schedule}, p={p}, m={m}" + (f", v={v}" if v > 1 else "") +
                 f" — step {step}; bubble measured {measured} (median of timed steps) vs (p−1)/(v·m+p−1) "
                 f"= {_theory(p, v, m):.2f}")
    ax.title.set_fontsize(9)
    present = [phase for phase in PHASE_COLORS if phase in set(chosen["phase"])]
    ax.legend([Patch(color=PHASE_COLORS[phase]) for phase in present], present, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    add_notes(figure, [] if run.state == COMPLETED else [run.describe_state()])
    return figure
