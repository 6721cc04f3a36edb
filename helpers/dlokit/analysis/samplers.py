"""TP3.5's samplers and pruners side by side: studies run on one search space and one budget (trials, epochs), read
as one table and a few figures.

    studies = {"grid": grid_study, "random": random_study, "tpe": tpe_study}    # dlokit.hpo.open_study each
    samplers.compare_studies(studies)      # one row per study: budget spent, options tried, best top-1 and interval
    samplers.history_figure(studies)       # Optuna's optimisation history, the studies overlaid
    samplers.sampled_figure(studies)       # where each sampler looked: two options of each trial, coloured by value
    samplers.pruned_figure(pruned)         # each trial's validation per epoch, one panel per pruner: who stopped when

A best accuracy is measured on the validation images of one run: its 95 % interval (Wilson) says how far another
draw of those images could move it. With a handful of trials on a small data set, the samplers' bests are usually
within noise of each other; where each one looked is what differs. Pruners compared on the same random draws
differ in what they stopped and when, so in the epochs they spent.
"""
from __future__ import annotations

import warnings
from collections import Counter

import pandas as pd
from optuna.exceptions import ExperimentalWarning
from optuna.trial import TrialState

from dlokit.analysis import stats
from dlokit.analysis.figures import message_figure, new_figure
from dlokit.analysis.large_batch import top1_estimate

HIGHEST, BELOW, WITHIN_NOISE = "highest", "below the highest beyond noise", "within noise of the highest"


def _at_least_one(studies) -> None:
    if not isinstance(studies, dict) or not studies:
        raise ValueError(f"give the studies as {{name: study}}, at least one (got {studies!r}), e.g. "
                         "{'grid': grid_study, 'random': random_study}")


def drawn_counts(trials) -> Counter:
    """How the trials' options were chosen (the `drawn_by` user attribute dlokit.hpo.run_study records)."""
    return Counter(t.user_attrs.get("drawn_by") or "not recorded" for t in trials)


def drawn_text(counts: Counter) -> str:
    """'random start-up 3, TPE model 1'"""
    return ", ".join(f"{who} {n}" for who, n in counts.items())


def compare_studies(studies: dict) -> pd.DataFrame:
    """One row per study: its trials (complete, pruned), the epochs they ran in all (what the budget bought), the
    distinct option sets it tried, how they were drawn, and its best trial with that run's validation top-1 and its
    95 % interval. `verdict`: the highest best, or each other best below it beyond noise (the intervals do not
    overlap) or within noise of it."""
    _at_least_one(studies)
    rows = []
    for name, study in studies.items():
        trials = study.get_trials(deepcopy=False)
        complete = [t for t in trials if t.state == TrialState.COMPLETE]
        best = study.best_trial if complete else None
        job = best.user_attrs.get("job_id") if best else None
        by_accuracy = study.user_attrs.get("metric", "val_acc") == "val_acc"  # a study of the loss has no top-1 best
        top1 = top1_estimate(job) if job and by_accuracy else stats.NO_ESTIMATE
        rows.append({"study": name, "trials": len(trials), "complete": len(complete),
                     "pruned": sum(t.state == TrialState.PRUNED for t in trials),
                     "epochs_run": sum(len(t.intermediate_values) for t in trials),
                     "distinct_options": len({tuple(sorted(t.params.items())) for t in trials if t.params}),
                     "drawn_by": drawn_text(drawn_counts(trials)),
                     "best_trial": best.number if best else None, "best_job": job,
                     "best_top1": top1.value, "top1_low": top1.low, "top1_high": top1.high,
                     "best_params": best.params if best else {}})
    table = pd.DataFrame(rows)
    table["verdict"] = _verdicts(table)
    table.attrs["basis"] = ("best_top1: the best trial's last validation top-1, top1_low–top1_high its 95 % Wilson "
                            "interval over the validation images; verdict follows from the intervals")
    return table


def _verdicts(table: pd.DataFrame) -> list[str]:
    usable = table.dropna(subset=["best_top1", "top1_low", "top1_high"])
    if usable.empty:
        return ["no complete trial with a validation"] * len(table)
    leader = usable.loc[usable["best_top1"].idxmax()]
    said = []
    for row in table.itertuples():
        if pd.isna(row.best_top1):
            said.append("no complete trial with a validation")
        elif row.study == leader["study"] or row.best_top1 == leader["best_top1"]:  # a tie: each is the highest
            said.append(HIGHEST)
        else:
            said.append(BELOW if row.top1_high < leader["top1_low"] else WITHIN_NOISE)
    return said


def history_figure(studies: dict):
    """Optuna's optimisation history with the studies overlaid (each trial's value, and the best so far)."""
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as optuna_plots

    _at_least_one(studies)
    finished = {name: s for name, s in studies.items()
                if s.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}
    if not finished:
        return message_figure("no study has a complete trial yet", title="samplers side by side")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)  # Optuna's matplotlib plots are all "experimental"
        axes = optuna_plots.plot_optimization_history(list(finished.values()))
    axes.set_title("samplers side by side: each trial's value and the best so far")
    legend = axes.get_legend()
    for text in legend.get_texts() if legend else []:  # "Best Value of alice-day3-grid" -> "grid: best so far"
        label = text.get_text()
        names = [name for name, study in finished.items() if label.endswith(f" of {study.study_name}")]
        names = names or (list(finished) if len(finished) == 1 else [])  # one study: Optuna names none
        if names:
            text.set_text(f"{names[0]}: {'best so far' if label.startswith('Best') else 'trial value'}")
    figure = axes.figure
    figure.set_size_inches(9, 4)
    figure.tight_layout()
    plt.close(figure)  # shown once, when the cell returns it
    return figure


def sampled_figure(studies: dict, x: str = "lr", y: str = "batch_size"):
    """Where each sampler looked: one panel per study, each trial at its two options, coloured by its value (grey:
    pruned or failed)."""
    _at_least_one(studies)
    figure, axes = new_figure(1, len(studies), size=(4 * len(studies), 3.4), sharex=True, sharey=True)
    trials_of = {name: study.get_trials(deepcopy=False) for name, study in studies.items()}
    values = [t.value for trials in trials_of.values() for t in trials if t.value is not None]
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    shown = None
    for ax, (name, all_trials) in zip(axes[0], trials_of.items()):
        trials = [t for t in all_trials if x in t.params and y in t.params]
        done = [t for t in trials if t.state == TrialState.COMPLETE]
        others = [t for t in trials if t.state != TrialState.COMPLETE]
        if others:
            ax.scatter([t.params[x] for t in others], [t.params[y] for t in others], c="grey", marker="x",
                       label="pruned or failed")
            ax.legend(fontsize=7, loc="upper right")
        shown = ax.scatter([t.params[x] for t in done], [t.params[y] for t in done], c=[t.value for t in done],
                           cmap="viridis", vmin=low, vmax=high + 1e-9, edgecolors="black")
        ax.set(title=f"{name}: {len(trials)} trials", xlabel=x)
        if not trials:
            ax.text(0.5, 0.5, f"no trial chose {x} and {y}", transform=ax.transAxes, ha="center", fontsize=8)
    axes[0][0].set_ylabel(y)
    chosen = [t.params[x] for trials in trials_of.values() for t in trials if x in t.params]
    if x == "lr" and chosen and min(chosen) > 0:  # learning rates are searched on a log scale
        axes[0][0].set_xscale("log")
    if shown is not None and values:
        figure.colorbar(shown, ax=list(axes[0]), label="trial value (validation)")
    return figure


def trial_colour(index: int):
    """One of ten distinct colours (the ggplot style's cycle has seven: trials 0 and 7 would share one)."""
    import matplotlib

    return matplotlib.colormaps["tab10"](index)


def pruned_figure(studies: dict):
    """Each trial's reported value per epoch, one panel per study (the same draws under each pruner): a completed
    trial's line is solid, a pruned one's dashed and ends with a cross where its pruner stopped it (on a replay,
    hpo.replay, a faint dotted line goes on to where that run went); a trial has one colour in every panel."""
    _at_least_one(studies)
    figure, axes = new_figure(1, len(studies), size=(5 * len(studies), 3.6), sharex=True, sharey=True)
    for ax, (name, study) in zip(axes[0], studies.items()):
        trials = study.get_trials(deepcopy=False)
        for trial in trials:
            steps = sorted(trial.intermediate_values)
            if not steps:
                continue
            values = [trial.intermediate_values[s] for s in steps]
            pruned = trial.state == TrialState.PRUNED
            colour = trial_colour(trial.number % 10)
            ax.plot(steps, values, "--" if pruned else "-", marker="o", markersize=3, color=colour)
            if pruned:
                ax.plot(steps[-1], values[-1], "x", color=colour, markersize=9, mew=2)
                rest = sorted((int(e), v) for e, v in trial.user_attrs.get("full_curve", {}).items()
                              if int(e) >= steps[-1])  # a replay: where the stopped run went on to
                if len(rest) > 1:
                    ax.plot(*zip(*rest), ":", color=colour, alpha=0.4)
            ax.annotate(f"{trial.number}", (steps[-1], values[-1]), xytext=(4, 0), textcoords="offset points",
                        fontsize=7, color=colour)
        pruned = sum(t.state == TrialState.PRUNED for t in trials)
        epochs = sum(len(t.intermediate_values) for t in trials)
        trained = study.user_attrs.get("trained_epochs")
        spent = f"{epochs} of the {trained} epochs trained" if trained else f"{epochs} epochs run"
        ax.set_title(f"{name}\n{pruned} of {len(trials)} trials pruned, {spent}", fontsize=9)
        ax.set_xlabel("epoch")
        if not any(t.intermediate_values for t in trials):
            ax.text(0.5, 0.5, "no trial reported an epoch", transform=ax.transAxes, ha="center", fontsize=8)
    axes[0][0].set_ylabel("validation (reported each epoch)")
    axes[0][0].xaxis.get_major_locator().set_params(integer=True)
    return figure
