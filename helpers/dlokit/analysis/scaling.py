"""scaling_table / scaling_plot: speed-up and efficiency of data parallelism against the number of ranks.

A scaling figure is only worth drawing from valid runs, so the table refuses what would mislead:
a multi-rank run that did not wrap the model in DDP or did not shard the data (its ranks each
trained alone, on the same images), and it names the kind of scaling — strong (same global batch)
or weak (same per-rank batch). An efficiency above 100 % always comes with its reason.
"""
from __future__ import annotations

import pandas as pd

from dlokit.analysis import stats
from dlokit.analysis.figures import add_notes, message_figure, new_figure
from dlokit.analysis.overlap import busy
from dlokit.analysis.run import Run, load_runs
from dlokit.analysis.table import runs_table

DISTRIBUTED_SAMPLERS = ("DistributedSampler",)


class ScalingError(ValueError):
    """These runs cannot be compared as a scaling series; the message says why."""


def check_data_parallel(run: Run) -> None:
    """Raise ScalingError if a multi-rank run was not really data-parallel."""
    if run.world_size <= 1 or run.unreadable:
        return  # an unreadable run is a row of its own in the table, naming why
    observed = run.info.get("observed") or run.summary.get("observed") or {}
    if not observed and run.state != "completed":
        return  # it never got through a step: no throughput to compare, the plot names it
    if not observed:
        raise ScalingError(f"run {run.run_id} ({run.world_size} ranks) recorded no 'observed' block, so "
                           "nothing shows it used DDP: it cannot be part of a scaling comparison")
    if not observed.get("ddp_wrapped"):
        raise ScalingError(f"run {run.run_id} ran {run.world_size} ranks without DistributedDataParallel: each "
                           "rank trained its own model, so its throughput is not a data-parallel speed-up "
                           "(complete TP2.2: wrap the model in DDP)")
    sampler = observed.get("sampler")
    if sampler is not None and sampler not in DISTRIBUTED_SAMPLERS:
        raise ScalingError(f"run {run.run_id} ran {run.world_size} ranks with a {sampler}: every rank read the "
                           "whole data set instead of its own shard (complete TP2.2: a DistributedSampler)")


def not_data_parallel(run: Run) -> str | None:
    """Why a multi-rank run's ranks did not train one model together (check_data_parallel's reason), or None."""
    try:
        check_data_parallel(run)
    except ScalingError as why:
        return str(why)
    return None


def scaling_kind(table: pd.DataFrame) -> str:
    """'strong' (same global batch), 'weak' (same per-rank batch) or 'mixed'."""
    if table["global_batch_size"].nunique(dropna=True) <= 1:
        return "strong"
    if table["batch_size"].nunique(dropna=True) <= 1:
        return "weak"
    return "mixed"


KIND_TEXT = {"strong": "strong scaling: the same global batch split over more ranks",
             "weak": "weak scaling: the same batch per rank, so the global batch grows with the ranks",
             "mixed": "neither strong nor weak scaling: per-rank AND global batch sizes differ between runs, "
                      "so the speed-up mixes two effects"}


def _above_ideal_reason(row, base, kind: str) -> str:
    if base["overlapped_by"]:
        return f"the baseline run {base['run_id']} overlapped {base['overlapped_by']}, so it was slowed down"
    if busy(base["foreign_cpu"]):
        return (f"other work kept {100 * base['foreign_cpu']:.0f} % of the baseline run {base['run_id']}'s cores "
                "busy, so it was slowed down")
    if kind == "strong":
        return ("superlinear: with the same global batch each rank computes a smaller batch, which can fit "
                "the caches better; check the measurement before believing it")
    return ("above the ideal: the baseline was slower than one device should be (look at its foreign_cpu in "
            "runs_table and its load average in run.json 'measurement'); run both again")


def epochs_crossed(runs: list[Run]) -> int:
    """The most epochs of the data set one of these timed runs went through (0: none recorded)."""
    return max((int(run.summary.get("epochs") or 0) for run in runs if run.config.get("test")), default=0)


def _epoch_note(group: list[Run]) -> str:
    """A timed run that met epoch ends measured the data loader's restarts too: each epoch's first batch waits for
    the workers to start reading again, and N ranks, each with 1/N of the images, meet that N times as often."""
    epochs = epochs_crossed(group)
    if epochs <= 1:
        return ""
    per_rank = max(((run.info.get("observed") or {}).get("samples_per_rank_per_epoch") or 0) for run in group)
    return (f"its timed steps ran over {epochs} epochs ({per_rank} images per rank each): the loader's restart "
            "at every epoch is in its speed, met more often the more ranks share the data; a larger data set "
            "(TRAIN_PER_CLASS) keeps a timed run in one epoch")


def scaling_table(runs, runs_dir=None, metric: str = "throughput_train") -> pd.DataFrame:
    """Throughput per world size (every run of that size: repeats of one command), and the speed-up and
    efficiency relative to the smallest world size, each with its 95 % interval (dlokit.analysis.stats: the run
    is the unit when both sizes were repeated).

    Raises ScalingError for a multi-rank run without DDP or a distributed sampler; an unreadable run is a row of
    its own (no numbers, a note naming why). The table's
    `attrs["kind"]` says strong/weak/mixed; `note` explains an efficiency above 100 % or an overlap."""
    runs = load_runs(runs, runs_dir)
    for run in runs:
        check_data_parallel(run)
    table = runs_table(runs)
    table[metric] = pd.to_numeric(table[metric], errors="coerce")
    usable = table.dropna(subset=[metric])
    columns = ["world_size", "run_id", "batch_size", "global_batch_size", metric, "low", "high", "speedup",
               "speedup_low", "speedup_high", "ideal", "efficiency", "efficiency_low", "efficiency_high",
               "overlapped_by", "foreign_cpu", "note"]
    unreadable = [{"world_size": r.world_size, "run_id": r.run_id, "note": f"{r.state}: left out of the comparison"}
                  for r in runs if r.unreadable]
    if usable.empty:
        return pd.DataFrame(unreadable, columns=columns)
    by_id = {r.run_id: r for r in runs}
    groups = {size: [by_id[i] for i in rows["run_id"]] for size, rows in usable.groupby("world_size")}
    base_size = min(groups)
    rows = []
    for size, group in sorted(groups.items()):
        ids = [r.run_id for r in group]
        these = usable[usable["run_id"].isin(ids)]
        value = stats.estimate(group, metric)
        speedup = stats.ratio(groups[base_size], group, metric) if size != base_size else \
            stats.Estimate(1.0, 1.0, 1.0, value.runs, value.steps)
        ideal = size / base_size
        rows.append({"world_size": size, "run_id": ", ".join(ids), "batch_size": these["batch_size"].iloc[0],
                     "global_batch_size": these["global_batch_size"].iloc[0], metric: value.value,
                     "low": value.low, "high": value.high, "speedup": speedup.value, "speedup_low": speedup.low,
                     "speedup_high": speedup.high, "ideal": ideal, "efficiency": speedup.value / ideal,
                     "efficiency_low": speedup.low / ideal, "efficiency_high": speedup.high / ideal,
                     "overlapped_by": ", ".join(o for o in these["overlapped_by"] if o),
                     "foreign_cpu": these["foreign_cpu"].max(), "_speedup": speedup})
    out = pd.DataFrame(rows)
    base = out.iloc[0]
    kind = scaling_kind(out)
    notes = []
    for row in out.itertuples():
        note = []
        if row.efficiency_low > 1.0 + 1e-9:
            note.append(f"efficiency {100 * row.efficiency:.0f} % > 100 % beyond noise: "
                        + _above_ideal_reason(row, base, kind))
        if row.overlapped_by:
            note.append(f"overlapped run(s) {row.overlapped_by}: not a valid measurement")
        if busy(row.foreign_cpu):
            note.append(f"other work kept {100 * row.foreign_cpu:.0f} % of its cores busy: not a valid measurement")
        epoch_note = _epoch_note(groups[row.world_size])
        if epoch_note:
            note.append(epoch_note)
        notes.append("; ".join(note))
    out["note"] = notes
    out.attrs["kind"] = kind
    out.attrs["kind_text"] = KIND_TEXT[kind]
    out.attrs["basis"] = (f"{metric}: the median of the settled steps of each world size's runs, low–high its 95 % "
                          "interval; speedup and efficiency against the smallest world size, with their 95 % "
                          "intervals (over the runs when repeated)")
    out.attrs["speedups"] = dict(zip(out["world_size"], out["_speedup"]))  # stats.Estimate per world size
    if unreadable:  # after the measured sizes, so that their rows keep their places
        out = pd.concat([out, pd.DataFrame(unreadable)], ignore_index=True)
    return out[columns]


def scaling_plot(runs, runs_dir=None, metric: str = "throughput_train"):
    """Speed-up vs world size with the ideal line (left) and parallel efficiency (right)."""
    runs = load_runs(runs, runs_dir)
    try:
        scaling = scaling_table(runs, metric=metric)
    except ScalingError as error:
        return message_figure(["not a valid scaling comparison:", *_wrap(str(error))], title="scaling")
    table = runs_table(runs)
    notes = [f"run {r.run_id}: {r.state}, no {metric}" for r in table.itertuples() if pd.isna(getattr(r, metric))]
    notes += [f"run {r.run_id}: {r.note}" for r in scaling.itertuples() if r.note and pd.isna(r.speedup)]
    kind_text = scaling.attrs.get("kind_text", "")
    scaling = scaling.dropna(subset=["speedup"])  # the measured world sizes (an unreadable run is only a note)
    if scaling.empty:
        return message_figure(notes or ["no runs"], title="scaling")
    notes += [f"world size {r.world_size}: {r.note}" for r in scaling.itertuples() if r.note]
    on_gpus = any((r.info.get("hardware") or {}).get("gpu_count") for r in runs)
    xlabel = "GPUs (world size)" if on_gpus else "CPU processes (world size)"
    figure, axes = new_figure(1, 2, size=(10, 4))
    left, right = axes[0]
    left.plot(scaling["world_size"], scaling["ideal"], "--", color="tab:gray", label="ideal")
    left.errorbar(scaling["world_size"], scaling["speedup"], capsize=3, color="tab:blue", fmt="o-", label="measured",
                  yerr=[(scaling["speedup"] - scaling["speedup_low"]).clip(lower=0).fillna(0),
                        (scaling["speedup_high"] - scaling["speedup"]).clip(lower=0).fillna(0)])
    left.set(xlabel=xlabel, ylabel="speed-up", title=f"speed-up ({metric}, 95 % intervals)")
    left.legend(fontsize=8)
    right.errorbar(scaling["world_size"], 100 * scaling["efficiency"], capsize=3, color="tab:green", fmt="o-",
                   yerr=[100 * (scaling["efficiency"] - scaling["efficiency_low"]).clip(lower=0).fillna(0),
                         100 * (scaling["efficiency_high"] - scaling["efficiency"]).clip(lower=0).fillna(0)])
    right.axhline(100, ls="--", color="tab:gray")
    right.set(xlabel=xlabel, ylabel="%", title="efficiency",
              ylim=(0, max(110, 105 * scaling["efficiency"].max())))
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(scaling["world_size"], [str(w) for w in scaling["world_size"]])
    for row in scaling.itertuples():
        if row.note:
            right.annotate("see note", (row.world_size, 100 * row.efficiency), fontsize=8, color="tab:red")
    figure.suptitle(kind_text, fontsize=9)
    add_notes(figure, notes)
    return figure


def _wrap(text: str, width: int = 90) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width)


def runs_by_size(runs, runs_dir=None) -> dict:
    """{world size: [run ids]} of data-parallel runs, smallest first."""
    by_size = {}
    for run in load_runs(runs, runs_dir):
        by_size.setdefault(run.world_size, []).append(run.run_id)
    return dict(sorted(by_size.items()))


def scaling_summary(runs, runs_dir=None) -> pd.DataFrame | None:
    """scaling_table, said in words, when the runs make a scaling comparison of two sizes or more; else None,
    with why (e.g. ranks that did not use DDP: no speed-up to show)."""
    try:
        table = scaling_table(runs, runs_dir)
    except ScalingError as refused:
        print(f"not a valid scaling comparison: {refused}")
        return None
    if len(table) < 2:
        return None
    print(table.attrs["kind_text"])
    return table
