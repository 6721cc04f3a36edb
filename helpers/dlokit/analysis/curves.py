"""training_curves: loss, accuracy and learning rate against optimizer steps, one colour per run;
epoch_times: where each epoch's wall clock went, training or validation."""
from __future__ import annotations

import pandas as pd

from dlokit.analysis.figures import add_notes, message_figure, new_figure
from dlokit.analysis.run import load_runs
from dlokit.analysis.scaling import not_data_parallel


def _series(frame: pd.DataFrame, x: str, y: str):
    if frame.empty or x not in frame or y not in frame:
        return None
    data = frame[[x, y]].apply(pd.to_numeric, errors="coerce").dropna()
    return (data[x].to_numpy(), data[y].to_numpy()) if not data.empty else None


def _epoch_steps(run) -> pd.DataFrame:
    """Epoch lines placed at the last optimizer step of their epoch."""
    epochs, steps = run.lines("epoch"), run.steps
    if epochs.empty or "epoch" not in epochs or "epoch" not in steps or "step" not in steps:
        return pd.DataFrame()
    last = steps.groupby("epoch")["step"].max()
    return epochs.assign(step=epochs["epoch"].map(last)).dropna(subset=["step"])


def _spans_decades(ax, decades: int = 2) -> bool:
    values = [v for line in ax.lines for v in line.get_ydata() if v == v and v > 0]
    return bool(values) and max(values) > 10 ** decades * min(values)


# What tells one training from another in a legend, when the runs differ in it (a job id says nothing)
_DIFFERENCES = (("global_batch_size", lambda v: f"global batch {v}"), ("optimizer", str), ("lr", lambda v: f"lr {v:g}"),
                ("lr_scaling", lambda v: "no lr scaling" if v == "none" else f"{v} lr scaling"),
                ("warmup_epochs", lambda v: f"{float(v):g}-epoch warm-up" if float(v) else "no warm-up"),
                ("lr_schedule", lambda v: f"{v} schedule"))


def _labels(runs) -> dict:
    """{run_id: its legend label}: the end of its id, then the settings in which the runs differ."""
    shown = [(key, words) for key, words in _DIFFERENCES if len({str(r.config.get(key)) for r in runs}) > 1]
    if not shown:
        return {run.run_id: run.label for run in runs}
    return {run.run_id: f"{run.run_id[-4:]}: " + ", ".join(words(run.config[key]) for key, words in shown
                                                           if run.config.get(key) is not None)
            for run in runs}


def training_curves(runs, runs_dir=None):
    """Three panels: loss (train steps, validation points), accuracy, learning rate; the legend names each run by
    the settings in which the runs differ (batch, optimiser, learning rate, its scaling, warm-up, schedule)."""
    runs = load_runs(runs, runs_dir)
    plotted = [r for r in runs if not r.steps.empty]
    notes = [r.describe_state() for r in runs if r.steps.empty or r.state != "completed"]
    if not plotted:
        return message_figure(notes or ["no runs"], title="training curves")
    figure, axes = new_figure(1, 3, size=(13, 4))
    loss_ax, acc_ax, lr_ax = axes[0]
    labels = _labels(plotted)
    for index, run in enumerate(plotted):
        color, label = f"C{index % 10}", labels[run.run_id] + (f" on {run.world_size} ranks" if run.world_size > 1 else "")
        if not_data_parallel(run):  # its record's global batch was never one model's: each rank trained its own
            label = f"{run.run_id[-4:]}: {run.world_size} models apart, batch {run.config.get('batch_size')} each (no DDP)"
        steps, vals, epochs = run.steps, run.lines("val"), _epoch_steps(run)
        for ax, frame, y, style, suffix in (
                (loss_ax, steps, "loss", "-", " train"), (loss_ax, vals, "val_loss", "o--", " val"),
                (acc_ax, steps, "acc", "-", " train"), (acc_ax, epochs, "train_acc", "s:", " train/epoch"),
                (acc_ax, vals, "val_acc", "o--", " val"), (lr_ax, steps, "lr", "-", "")):
            series = _series(frame, "step", y)
            if series is not None:
                ax.plot(*series, style, color=color, label=label + suffix, alpha=0.9)
    for ax, title in ((loss_ax, "loss"), (acc_ax, "accuracy"), (lr_ax, "learning rate")):
        ax.set(title=title, xlabel="step")
    # one legend, of the runs' colours (a legend in every panel hid the curves); the line styles in a note
    (lr_ax if lr_ax.lines else loss_ax).legend(fontsize=7)
    notes = ["solid: training steps; dashed with circles: validation; dotted with squares: training accuracy per "
             "epoch"] + notes
    if _spans_decades(loss_ax):  # e.g. a first validation at 2,000 (BatchNorm statistics of a few steps) beside 2.3
        loss_ax.set(yscale="log", title="loss (log scale)")
    add_notes(figure, notes)
    return figure


def epoch_times(runs, runs_dir=None):
    """Each epoch's training time and its validation pass, side by side per run (seconds, from the run's
    "epoch" and "val" lines): what validating every epoch costs."""
    runs = load_runs(runs, runs_dir)
    rows = []
    for run in runs:
        epochs, vals = run.lines("epoch"), run.lines("val")
        if epochs.empty or "epoch_time_s" not in epochs:
            continue
        val_s = vals.set_index("epoch")["val_time_s"] if "val_time_s" in vals and "epoch" in vals else pd.Series()
        for epoch, seconds in zip(epochs["epoch"], epochs["epoch_time_s"]):
            rows.append({"run": run.run_id, "ranks": run.world_size, "epoch": int(epoch), "training": seconds,
                         "validation": val_s.get(epoch)})
    notes = [r.describe_state() for r in runs if r.state != "completed"]
    if not rows:
        return message_figure(notes or ["no epoch lines: these runs trained no whole epoch (--test runs)"],
                              title="training vs validation time")
    table = pd.DataFrame(rows)
    figure, axes = new_figure(1, 1, size=(max(6, len(table) * 0.9 + 2), 3.8))
    ax = axes[0][0]
    first = ~table["run"].duplicated()  # the run is named under its first epoch only
    labels = [f"epoch {r.epoch + 1}" + (f"\n{r.run}\n{r.ranks} rank{'s' if r.ranks > 1 else ''}" if head else "")
              for r, head in zip(table.itertuples(), first)]
    at = range(len(table))  # by position: the runs' epochs share their labels ("epoch 2")
    ax.bar(at, table["training"], color="tab:blue", label="training")
    ax.bar(at, table["validation"].fillna(0), bottom=table["training"], color="tab:orange", label="validation")
    ax.set_xticks(list(at), labels)
    share = (table["validation"] / (table["training"] + table["validation"])).mean()
    ax.set(ylabel="seconds", title="training vs validation time per epoch"
           + (f"\nvalidation: {share:.0%} of an epoch on average" if share == share else "\nno validation timed"))
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=8)
    add_notes(figure, notes)
    return figure
