"""Day 3 views: top-1 per optimiser × batch beside the course's published accuracies, and the LR range test.

    optimizer_table(job_ids)      # one row per training: optimiser, global batch, peak lr, warm-up, val loss, top-1
    optimizer_plot(job_ids)       # grouped bars, ours beside DLO-JZ's (GPU, CIFAR-10, 30 / 75 epochs)
    large_batch_lesson(job_ids)   # does this run show the lesson? validation losses, the interval of their difference
    lr_finder_plot(job_ids)       # loss reached per learning rate, per optimiser and batch, suggestions marked
    lr_suggestions(finder_jobs, trainings)  # the suggested lr per optimiser x batch, beside the lr a training used
    range_test_trainings(tuned, found)      # each optimiser at the range test's lr against TP3.1's scaled lr
    range_test_against_untuned(untuned, found)  # SGD at the range test's lr against the badly tuned SGD
    kept_optimizer(tuned, found)            # what Day 3 hands to the race
"""
from __future__ import annotations

import math

import pandas as pd

from dlokit.analysis import stats
from dlokit.analysis.figures import add_notes, message_figure, new_figure
from dlokit.analysis.run import load_run, load_runs
from dlokit.analysis.table import as_number

# DLO-JZ Day 3 (../shared/reference/figures.md): ResNet-18 on CIFAR-10, top-1 at batch 256 (30 epochs) and
# 8192 (75 epochs), on GPUs. Quoted beside ours, never as ours.
PUBLISHED_TOP1 = {"sgd": (0.784, 0.746), "adamw": (0.832, 0.845), "lamb": (0.777, 0.850), "lars": (0.852, 0.814),
                  "lion": (0.842, 0.798)}
PUBLISHED_SOURCE = "DLO-JZ Day 3, ResNet-18 on CIFAR-10, GPUs: batch 256 for 30 epochs / 8192 for 75 epochs"
PUBLISHED_BATCHES = (256, 8192)  # the batches of PUBLISHED_TOP1's two figures


def optimizer_table(job_ids, runs_dir=None) -> pd.DataFrame:
    """One row per run: what it trained with and the validation loss and top-1 it ended at; published figures
    beside."""
    rows = []
    for run in load_runs(job_ids, runs_dir):
        config, vals = run.config, run.lines("val")
        top1 = pd.to_numeric(vals.get("val_acc", pd.Series(dtype=float)), errors="coerce").dropna()
        loss = pd.to_numeric(vals.get("val_loss", pd.Series(dtype=float)), errors="coerce").dropna()
        name = config.get("optimizer")
        global_batch = config.get("global_batch_size")
        rows.append({"run_id": run.run_id, "state": run.state, "optimizer": name,
                     "optimizer_class": (config.get("optimizer_class") or "").rsplit(".", 1)[-1] or None,
                     "global_batch": global_batch, "lr_scaling": config.get("lr_scaling"),
                     "lr_peak": as_number(config.get("lr_peak")), "warmup_steps": config.get("warmup_steps"),
                     "schedule": config.get("lr_schedule"), "epochs": config.get("epochs"),
                     "steps": run.summary.get("steps"), "val_loss": float(loss.iloc[-1]) if len(loss) else None,
                     "top1": float(top1.iloc[-1]) if len(top1) else None,
                     "best_top1": float(top1.max()) if len(top1) else None})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    batches = sorted(b for b in table["global_batch"].dropna().unique())
    small = batches[0] if batches else None
    table["published_top1"] = [
        PUBLISHED_TOP1.get(o, (None, None))[0 if b == small else 1] if o in PUBLISHED_TOP1 and len(batches) > 1
        else None for o, b in zip(table["optimizer"], table["global_batch"])]
    table.attrs["published_source"] = PUBLISHED_SOURCE
    return table


def optimizer_plot(job_ids, runs_dir=None):
    """Top-1 per optimiser, one bar per global batch (ours, solid, with its 95 % interval) beside the published one
    (hatched, at the course's own batch)."""
    table = optimizer_table(job_ids, runs_dir)
    if table.empty or table["top1"].isna().all():
        return message_figure(["no completed training with validation among these runs"], title="optimisers")
    figure, axes = new_figure(1, 1, size=(9, 4))
    ax = axes[0][0]
    intervals = [top1_estimate(run_id, runs_dir) for run_id in table["run_id"]]
    table = table.assign(label=_bar_labels(table), top1_low=[e.low for e in intervals],
                         top1_high=[e.high for e in intervals])
    table.loc[table["label"] != table["optimizer"], "published_top1"] = None  # DLO-JZ's figures are tuned runs
    optimizers = list(dict.fromkeys(table["label"]))
    batches = sorted(table["global_batch"].dropna().unique())
    width = 0.8 / (2 * len(batches))
    for b_index, batch in enumerate(batches):
        for kind, column, hatch in (("ours", "top1", None), ("DLO-JZ", "published_top1", "//")):
            xs, ys, spans = [], [], []
            for o_index, name in enumerate(optimizers):
                row = table[(table["label"] == name) & (table["global_batch"] == batch)]
                value = as_number(row[column].iloc[-1]) if len(row) else None
                if value is not None:
                    xs.append(o_index + (2 * b_index + (kind != "ours")) * width - 0.4 + width / 2)
                    ys.append(value)
                    low, high = (as_number(row["top1_low"].iloc[-1]), as_number(row["top1_high"].iloc[-1]))
                    spans.append((value - low, high - value) if kind == "ours" and None not in (low, high)
                                 else (0.0, 0.0))
            if xs:
                published = PUBLISHED_BATCHES[min(b_index, len(PUBLISHED_BATCHES) - 1)]
                ax.bar(xs, ys, width, color=f"C{b_index}", alpha=1.0 if kind == "ours" else 0.35, hatch=hatch,
                       yerr=list(zip(*spans)) if kind == "ours" else None, capsize=3,
                       label=f"ours, global batch {int(batch)}" if kind == "ours" else
                       f"DLO-JZ, global batch {published}")
    ax.set_xticks(range(len(optimizers)), optimizers)
    ax.set(ylabel="validation top-1", ylim=(0, 1), title="top-1 per optimiser and batch (same epochs)")
    ax.legend(fontsize=7, ncol=2)
    notes = [f"hatched: {PUBLISHED_SOURCE} (not ours)", "error bars: 95 % interval of our top-1 over the validation images"]
    notes += [f"{r.run_id}: {r.state}" for r in table.itertuples() if r.state != "completed"]
    add_notes(figure, notes)
    return figure


def _bar_labels(table: pd.DataFrame) -> list[str]:
    """The optimiser's name; a run whose LR was not scaled, beside one of the same optimiser and batch
    that was, gets a bar of its own (the untuned large batch the lesson starts from)."""
    scaled = {(r.optimizer, r.global_batch) for r in table.itertuples() if r.lr_scaling not in (None, "none")}
    return [f"{r.optimizer}\n(LR not scaled)" if r.lr_scaling in (None, "none") and (r.optimizer, r.global_batch)
            in scaled else r.optimizer for r in table.itertuples()]


def lr_trials(job_id, runs_dir=None) -> pd.DataFrame:
    """The 'lr_trial' lines of an --lr-finder run: optimiser, lr, first/final/smoothed loss, diverged."""
    trials = load_run(job_id, runs_dir).lines("lr_trial")
    keep = [c for c in ("optimizer", "trial", "lr", "first_loss", "final_loss", "smoothed_loss", "steps", "diverged")
            if c in trials]
    return trials[keep].reset_index(drop=True)


def range_tests(run) -> dict:
    """{optimiser: its range test's summary}; a run from before --lr-finder-optimizers: its one optimiser."""
    found = run.summary.get("lr_finder_by_optimizer")
    return found if isinstance(found, dict) else {run.config.get("optimizer", "sgd"): run.summary}


def lr_suggestions(finder_jobs, trainings=(), runs_dir=None) -> pd.DataFrame:
    """One row per optimiser and global batch of the --lr-finder runs: the learning rate each range test suggests
    (and the lr of its lowest loss, of its steepest descent, the first that diverged); beside it, with
    `trainings`, the peak lr a training of that optimiser and batch used (a scaled one first) and their ratio."""
    finder_jobs = finder_jobs if isinstance(finder_jobs, (list, tuple)) else [finder_jobs]
    trained = optimizer_table(list(trainings), runs_dir) if len(trainings) else pd.DataFrame()
    if not trained.empty:
        trained = trained.assign(unscaled=trained["lr_scaling"].isin([None, "none"])).sort_values("unscaled")
    rows = []
    for run in load_runs(finder_jobs, runs_dir):
        batch = run.config.get("global_batch_size")
        for name, found in range_tests(run).items():
            row = {"optimizer": name, "global_batch": batch, "suggested_lr": as_number(found.get("lr_finder_suggested_lr")),
                   "min_loss_lr": as_number(found.get("lr_finder_min_loss_lr")),
                   "steepest_lr": as_number(found.get("lr_finder_steepest_lr")),
                   "no_descent": bool(found.get("lr_finder_no_descent")),
                   "diverged_at_lr": as_number(found.get("lr_finder_diverged_at_lr"))}
            if not trained.empty:
                same = trained[(trained["optimizer"] == name) & (trained["global_batch"] == batch)]
                row["trained_lr"] = as_number(same["lr_peak"].iloc[0]) if len(same) else None
                row["trained_over_suggested"] = (row["trained_lr"] / row["suggested_lr"]
                                                 if row["trained_lr"] and row["suggested_lr"] else None)
            rows.append(row)
    table = pd.DataFrame(rows)
    table.attrs["basis"] = ("one range test per optimiser and batch: suggested_lr its pick, min_loss_lr and steepest_lr "
                            "where the loss was lowest and fell fastest, diverged_at_lr the first that diverged")
    return table


def suggested_lrs(finder_job, runs_dir=None) -> dict:
    """{optimiser: the learning rate its range test suggests} for one --lr-finder run; the optimisers whose test
    suggested none (no descent, every trial diverged) are left out."""
    found = range_tests(load_run(finder_job, runs_dir))
    lrs = {name: as_number(test.get("lr_finder_suggested_lr")) for name, test in found.items()}
    return {name: lr for name, lr in lrs.items() if lr}


def range_test_trainings(tuned_jobs, found_jobs, runs_dir=None) -> pd.DataFrame:
    """One row per optimiser trained at the range test's learning rate (`found_jobs`), beside TP3.1's training of
    the same optimiser and batch at the learning rate scaled from the small batch (`tuned_jobs`): both peak lrs,
    both validation losses and top-1s, and the difference of the losses (range test's minus TP3.1's) with Welch's
    95 % interval, said in words: lower, higher or within noise."""
    tuned = optimizer_table(list(tuned_jobs), runs_dir)
    rows = []
    for found in optimizer_table(list(found_jobs), runs_dir).itertuples():
        same = tuned[(tuned["optimizer"] == found.optimizer) & (tuned["global_batch"] == found.global_batch)]
        row = {"optimizer": found.optimizer, "global_batch": found.global_batch, "found_run": found.run_id,
               "found_lr": found.lr_peak, "found_loss": found.val_loss, "found_top1": found.top1}
        if same.empty:
            rows.append({**row, "said": "no TP3.1 training of this optimiser at this batch to compare with"})
            continue
        base = same.iloc[0]
        difference = stats.NO_ESTIMATE
        samples = val_loss_sample(base["run_id"], runs_dir), val_loss_sample(found.run_id, runs_dir)
        if None not in samples:
            difference = stats.difference_of_means(*samples)
        said = ("a training did not finish, or recorded no spread of its loss" if not difference.usable else
                "lower with the range test's lr" if difference.high < 0 else
                "higher with the range test's lr" if difference.low > 0 else "within noise")
        rows.append({**row, "tuned_run": base["run_id"], "tuned_lr": base["lr_peak"], "tuned_loss": base["val_loss"],
                     "tuned_top1": base["top1"], "loss_difference": difference.value, "difference_low": difference.low,
                     "difference_high": difference.high, "said": said})
    table = pd.DataFrame(rows, columns=["optimizer", "global_batch", "tuned_lr", "found_lr", "tuned_loss", "found_loss",
                                        "loss_difference", "difference_low", "difference_high", "said", "tuned_top1",
                                        "found_top1", "tuned_run", "found_run"])
    table.attrs["basis"] = ("one training each; losses: the mean validation loss over the validation images; "
                            "loss_difference: the range test's minus TP3.1's, difference_low–difference_high its "
                            "Welch 95 % interval; said follows from it")
    return table


def range_test_against_untuned(untuned_job, found_jobs, runs_dir=None) -> str:
    """The case the range test is for, in a sentence: SGD at its range test's lr (among `found_jobs`) against SGD at the
    large batch with the small batch's lr and no warm-up, by validation loss with Welch's interval of the difference."""
    found_sgd = [run for run in load_runs(list(found_jobs), runs_dir) if run.config.get("optimizer") == "sgd"]
    untuned = val_loss_sample(untuned_job, runs_dir)
    found = val_loss_sample(found_sgd[0].run_id, runs_dir) if found_sgd else None
    if not untuned or not found:
        return "no SGD training at the range test's lr, or one without its loss's spread: nothing to compare"
    gain = stats.difference_of_means(found, untuned)  # untuned minus range test: above 0 when the range test's is lower
    found_lr, untuned_lr = (as_number(run.config.get("lr_peak")) for run in (found_sgd[0], load_run(untuned_job, runs_dir)))
    beyond = ", beyond noise" if gain.low > 0 or gain.high < 0 else ", within noise (the interval contains 0)"
    return (f"SGD at the range test's lr{f' {found_lr:.3g}' if found_lr else ''} ended at validation loss "
            f"{found[0]:.3f}, the badly tuned run ({f'lr {untuned_lr:.3g}, ' if untuned_lr else ''}no warm-up) at "
            f"{untuned[0]:.3f}: the range test's is {lower_or_higher(gain)}{beyond}")


def lr_finder_plot(job_ids, runs_dir=None):
    """One panel per --lr-finder run (one global batch each): per optimiser, the loss reached per learning rate
    (log scale), its suggestion marked; the trials' first losses in grey (flat when each restarted)."""
    runs = load_runs(job_ids if isinstance(job_ids, (list, tuple)) else [job_ids], runs_dir)
    tables = [lr_trials(run.run_id, runs_dir) for run in runs]
    if not runs or all(t.empty for t in tables):
        return message_figure([run.describe_state() for run in runs] or ["no run"], title="LR range test")
    figure, axes = new_figure(1, len(runs), size=(7 * len(runs), 4))
    for ax, run, trials in zip(axes[0], runs, tables):
        if trials.empty:  # a run that recorded no trial (failed, cancelled): its state in its panel
            ax.text(0.5, 0.5, run.describe_state(), ha="center", va="center", wrap=True, fontsize=8)
            ax.set_axis_off()
            continue
        if "optimizer" not in trials:
            trials = trials.assign(optimizer=run.config.get("optimizer", "sgd"))
        suggestions = range_tests(run)
        for index, (name, mine) in enumerate(trials.groupby("optimizer", sort=False)):
            finite = mine.dropna(subset=["smoothed_loss"])
            found = suggestions.get(name) or {}
            label = f"{name}: loss reached (mean of each trial's last steps)" if index == 0 else name
            ax.plot(finite["lr"], finite["smoothed_loss"], "o-", color=f"C{index}",
                    label=label + (" — no descent seen: no suggestion" if found.get("lr_finder_no_descent") else ""))
            suggested = as_number(found.get("lr_finder_suggested_lr"))
            if suggested is not None:  # labelled: two optimisers' suggestions can fall on the same lr
                ax.axvline(suggested, color=f"C{index}", linestyle="--", linewidth=1,
                           label=f"{name} suggests {suggested:.3g}")
        ax.plot(trials["lr"], trials["first_loss"], "x", color="grey", label="each trial's first loss")
        ax.set(xscale="log", xlabel="learning rate", ylabel="training loss",
               title=f"LR range test, global batch {run.config.get('global_batch_size')}")
        finite = trials.dropna(subset=["smoothed_loss"])
        top = finite["smoothed_loss"].max() if len(finite) else None
        if top is not None and math.isfinite(top):
            ax.set_ylim(top=min(top, 3 * trials["first_loss"].max()) * 1.05)
        ax.legend(fontsize=7)
    add_notes(figure, ["dashed: each optimiser's suggested lr (a tenth of the lr of its lowest loss)"])
    return figure


def top1_estimate(job_id, runs_dir=None) -> stats.Estimate:
    """A run's last validation top-1 as a proportion of its validation images, with its 95 % Wilson interval."""
    run = load_run(job_id, runs_dir)
    vals = pd.to_numeric(run.lines("val").get("val_acc", pd.Series(dtype=float)), errors="coerce").dropna()
    n = as_number(run.config.get("val_images"))
    if vals.empty or not n:
        return stats.NO_ESTIMATE
    return stats.proportion(round(float(vals.iloc[-1]) * n), int(n))


def val_loss_sample(job_id, runs_dir=None) -> tuple | None:
    """A run's last validation loss as (mean, standard deviation, images): the mean cross-entropy over its
    validation images and their spread, which the script records as val_loss_sd. None without them."""
    run = load_run(job_id, runs_dir)
    vals = run.lines("val")
    n = as_number(run.config.get("val_images"))
    if vals.empty or "val_loss_sd" not in vals or not n:
        return None
    last = vals.dropna(subset=["val_loss", "val_loss_sd"])
    return (float(last["val_loss"].iloc[-1]), float(last["val_loss_sd"].iloc[-1]), int(n)) if len(last) else None


def lower_or_higher(gain: stats.Estimate) -> str:
    """"lower by 0.41 [0.30–0.52]" or "higher by ...": a loss difference (the reference's minus this one's) and its
    interval, in words."""
    word, (value, low, high) = ("lower", (gain.value, gain.low, gain.high)) if gain.value >= 0 else \
        ("higher", (-gain.value, -gain.high, -gain.low))
    return f"{word} by {value:.3f} [{low:.3f}–{high:.3f}]"


def large_batch_lesson(job_ids, runs_dir=None) -> dict:
    """Does this run show the large-batch lesson of the published table: at the largest batch, LAMB or LARS (the
    learning rate scaled, a warm-up) trained better than SGD run with the small batch's learning rate and no warm-up?

    "Better" is a lower validation loss: the mean cross-entropy over the validation images, whose spread the
    script records, so the difference of two runs has Welch's interval (dlokit.analysis.stats). Top-1 over the few
    validation images of a short course run moves with the seed and the hardware by as much as the effect
    (2026-11-28: untuned SGD reached 0.113, 0.138 and 0.163 in three runs of the same cell), so it is reported but
    does not decide. The lesson *agrees* when the best of LAMB and LARS has a lower loss with an interval of the
    difference above 0, *contradicts* when both have a higher one beyond noise, and is *within noise* otherwise.
    Returns {"outcome", "text", "rows"}; outcome None when a training is missing."""
    table = optimizer_table(job_ids, runs_dir)
    if table.empty:
        return {"outcome": None, "text": "no training among these runs", "rows": []}
    large = table["global_batch"].max()
    at_large = table[table["global_batch"] == large]
    untuned = at_large[(at_large["optimizer"] == "sgd") & (at_large["lr_scaling"].fillna("none") == "none")
                       & (at_large["warmup_steps"].fillna(0) == 0)]
    layerwise = at_large[at_large["optimizer"].isin(["lamb", "lars"])]
    if untuned.empty or layerwise.empty:
        return {"outcome": None, "text": f"the lesson needs, at batch {large}, untuned SGD and LAMB or LARS", "rows": []}
    built_else = [f"--optimizer {row.optimizer} built {row.optimizer_class}" for row in layerwise.itertuples()
                  if row.optimizer_class and row.optimizer_class.lower() != row.optimizer]
    if built_else:  # the untouched TODO builds SGD whatever is asked: SGD against SGD shows no optimiser's effect
        return {"outcome": stats.SAME_COMPUTATION, "rows": [],
                "text": f"same computation, no lesson to read: at batch {large}, {'; '.join(built_else)}, as the "
                        "untuned run did (TODO TP3.1 in optim_setup.py)"}
    base_row = next(untuned.itertuples())
    base_sample = val_loss_sample(base_row.run_id, runs_dir)
    samples = {row.optimizer: val_loss_sample(row.run_id, runs_dir) for row in layerwise.itertuples()}
    top1 = {row.optimizer: row.top1 for row in layerwise.itertuples()}
    if base_sample is None or None in samples.values():
        return {"outcome": None, "text": "a training of the lesson did not finish, or its record has no spread of "
                "the validation loss (see the table)", "rows": []}
    base = stats.mean_of(*base_sample)
    others = {name: stats.mean_of(*sample) for name, sample in samples.items()}
    gains = {name: stats.difference_of_means(sample, base_sample) for name, sample in samples.items()}  # SGD − it
    best = min(others, key=lambda k: others[k].value)
    steps = int(untuned["steps"].iloc[0] or 0)

    def described(name, e):
        return f"{name.upper()} {e.value:.3f} [{e.low:.3f}–{e.high:.3f}] (top-1 {top1[name]:.3f})"

    words = "; ".join(described(name, e) for name, e in others.items())
    gain = gains[best]
    by = lower_or_higher

    if gain.low > 0:
        outcome, verdict = stats.AGREES, (f"{best.upper()}'s loss is {by(gain)}, an interval of the difference "
                                          "above 0: this run shows the lesson")
    elif all(g.high < 0 for g in gains.values()):
        outcome, verdict = stats.CONTRADICTS, (f"even {best.upper()}'s loss is {by(gain)}, beyond noise: this run "
                                               f"contradicts the lesson, after {steps} optimizer steps at this batch")
    else:
        outcome, verdict = stats.WITHIN_NOISE, (
            f"{best.upper()}'s loss is {by(gain)}, an interval of the difference that contains 0: this run could not "
            f"show the lesson ({steps} optimizer steps at batch {int(large)}, {base.steps} validation images; the "
            "published table trained 75 epochs at batch 8192)")
    others_at_large = at_large.drop(index=untuned.index.union(layerwise.index))  # what the verdict leaves unsaid
    text = (f"at global batch {int(large)}, the validation loss (mean over {base.steps} images, 95 % intervals): "
            f"untuned SGD (the small batch's lr, no warm-up) {base.value:.3f} [{base.low:.3f}–{base.high:.3f}] "
            f"(top-1 {base_row.top1:.3f}), {words}; {verdict}{_scaled_but_worse(others_at_large, base_sample, runs_dir)}")
    return {"outcome": outcome, "text": text, "rows": [base, *others.values()]}


SHOWN = {"adamw": "AdamW", "lion": "Lion"}


def _scaled_but_worse(tuned: pd.DataFrame, base_sample, runs_dir) -> str:
    """The other tuned runs at the large batch (SGD, AdamW, Lion) whose loss ended above the untuned run's beyond
    noise, said beside the verdict: a scaled learning rate and a warm-up are no guarantee (2026-11-29: SGD's lr
    scaled ×9 with a 3-step warm-up ended at a loss of 3,205 against the untuned run's 2.22)."""
    worse = []
    for row in tuned.itertuples():
        sample = val_loss_sample(row.run_id, runs_dir)
        gain = stats.difference_of_means(sample, base_sample) if sample is not None else None
        if gain is not None and gain.high < 0:
            scaling = row.lr_scaling if isinstance(row.lr_scaling, str) else "no"
            worse.append(f"{SHOWN.get(row.optimizer, row.optimizer.upper())} ({scaling} scaling, {int(row.warmup_steps or 0)} warm-up steps) "
                         f"{lower_or_higher(gain)}")
    return (f". Not every tuned run beat the untuned one: {'; '.join(worse)}: a learning rate scaled from the small "
            "batch's and a warm-up do not by themselves make a large batch train (TP3.2's range test measures which "
            "learning rates do)") if worse else ""


RACE_KEYS = ("optimizer", "lr", "base_batch_size", "lr_scaling", "warmup_epochs", "lr_schedule")


def kept_optimizer(tuned_jobs, range_test_jobs=(), runs_dir=None) -> tuple[dict, str]:
    """What Day 3 hands to the race: the options of one large-batch training, and why.

    `tuned_jobs` are TP3.1's tuned large-batch trainings, SGD's among them; `range_test_jobs` TP3.2's trainings at
    the range test's learning rates. A training is kept over TP3.1's SGD only when its top-1 interval lies above
    SGD's entirely (their intervals do not overlap: a conservative test); among those, the highest top-1. The options
    are those the kept run trained with (its lr, the batch that lr was set for, the scaling rule to another batch,
    the warm-up, the schedule), so the race starts from what was measured."""
    found_ids = set(range_test_jobs)
    runs = {run.run_id: run for run in load_runs(list(tuned_jobs) + list(range_test_jobs), runs_dir)}
    top1 = {run_id: top1_estimate(run_id, runs_dir) for run_id in runs}
    sgd = next((r for r in runs.values() if r.config.get("optimizer") == "sgd" and r.run_id not in found_ids), None)
    if sgd is None or not top1[sgd.run_id].usable:
        return {}, ("TP3.1's SGD training at the large batch did not finish: nothing kept, the race uses the "
                    "script's defaults")

    def said(run_id):
        e = top1[run_id]
        return f"top-1 {e.value:.3f} [{e.low:.3f}–{e.high:.3f}]"

    above = [r for r in runs.values() if r.run_id != sgd.run_id and top1[r.run_id].usable
             and top1[r.run_id].low > top1[sgd.run_id].high]
    if not above:
        return ({key: sgd.config[key] for key in RACE_KEYS if sgd.config.get(key) is not None},
                f"SGD: no other optimiser or lr trained above its {said(sgd.run_id)} beyond noise")
    best = max(above, key=lambda r: top1[r.run_id].value)
    name = best.config["optimizer"]
    if best.run_id in found_ids:
        why = (f"{'SGD' if name == 'sgd' else name} at the range test's lr: {said(best.run_id)}, above SGD at its "
               f"scaled lr ({said(sgd.run_id)})")
    else:
        why = f"{name}: {said(best.run_id)}, above SGD's {said(sgd.run_id)} at the large batch"
    return {key: best.config[key] for key in RACE_KEYS if best.config.get(key) is not None}, why


def curve_endings(jobs, batch_per_rank: int, epochs: int, classes: int = 10, runs_dir=None) -> str:
    """TP2.2's short trainings on 1 and N ranks: each one's last validation top-1 with its 95 % interval, then what
    the larger global batch did to it (or that neither left chance: too short to say anything)."""
    from dlokit.analysis.table import runs_table

    from dlokit.analysis.scaling import not_data_parallel

    ends = runs_table(jobs, runs_dir)
    top1 = {job: top1_estimate(job, runs_dir) for job in jobs}
    apart = {run.run_id: not_data_parallel(run) for run in load_runs(jobs, runs_dir)}
    batch = {row.run_id: f"batch {batch_per_rank} on each of its own models" if apart.get(row.run_id)
             else f"global batch {row.world_size * batch_per_rank}" for row in ends.itertuples()}
    lines = [f"{row.world_size} rank(s), {batch[row.run_id]}: validation top-1 "
             f"{top1[row.run_id].value:.3f} [{top1[row.run_id].low:.3f}–{top1[row.run_id].high:.3f}] after {epochs} "
             "epochs" if top1[row.run_id].usable else f"{row.world_size} rank(s), {batch[row.run_id]}: no validation "
             f"accuracy ({row.state})"
             for row in ends.itertuples()]
    one, many, chance = top1[jobs[0]], top1[jobs[-1]], 1 / classes
    if apart.get(jobs[-1]):
        lines.append(f"this run: no larger global batch to compare - its ranks trained a model each, apart, so "
                     "the second curve is one rank's own training (complete TODO TP2.2: DDP and a DistributedSampler)")
    elif one.usable and many.usable and max(one.value, many.value) <= chance + 0.05:
        lines.append(f"this run: neither training got past chance ({chance:.2f}) in {int(ends['steps'].max())} steps "
                     "or fewer: too short to say anything about accuracy; raise CURVE_EPOCHS or TRAIN_PER_CLASS for "
                     "curves that teach")
    elif one.usable and many.usable:
        said = ("lower" if many.high < one.low else "higher" if many.low > one.high else
                "within noise of one rank's (the 95 % intervals overlap)")
        lines.append(f"this run: the larger global batch, with the same learning rate and epochs, ended {said} - Day 3 "
                     "is about keeping accuracy when the global batch grows (learning-rate scaling, warm-up, LARS/LAMB)")
    return "\n".join(lines)


def tuning_labels(jobs, runs_dir=None) -> list[str]:
    """How TP3.1's trainings were tuned, from their records: the base lr (at the base batch), an LR scaling rule
    with a warm-up, or none (the small batch's lr at a larger batch)."""
    labels = []
    for run in load_runs(jobs, runs_dir):
        scaling, batch, base = (run.config.get(k) for k in ("lr_scaling", "batch_size", "base_batch_size"))
        labels.append("unknown (no record)" if batch is None else f"{scaling} scaling + warm-up"
                      if scaling not in (None, "none") else "base lr" if batch == base else "none (small batch's lr)")
    return labels


OPTIMIZER_COLUMNS = ["run_id", "tuning", "optimizer", "optimizer_class", "global_batch", "lr_peak", "warmup_steps",
                     "steps", "val_loss", "top1", "top1_low", "top1_high", "published_top1"]


def optimizer_summary(job_ids, runs_dir=None) -> pd.DataFrame:
    """TP3.1's table: optimizer_table with how each training was tuned and its top-1's 95 % interval."""
    table = optimizer_table(job_ids, runs_dir)
    table.insert(1, "tuning", tuning_labels(job_ids, runs_dir))
    intervals = [top1_estimate(job, runs_dir) for job in job_ids]
    table["top1_low"], table["top1_high"] = [e.low for e in intervals], [e.high for e in intervals]
    summary = table[OPTIMIZER_COLUMNS].round(4)
    summary.attrs = {**table.attrs, "basis": "one training each; top1: the last epoch's validation top-1, "
                                             "top1_low–top1_high its 95 % Wilson interval over the validation images"}
    return summary


def found_lrs(finder_job, optimizers, runs_dir=None) -> dict:
    """suggested_lrs of TP3.2's range test, saying which of `optimizers` got none (not trained again)."""
    found = suggested_lrs(finder_job, runs_dir)
    skipped = [name for name in optimizers if name not in found]
    if skipped:
        print(f"no learning rate suggested for {', '.join(skipped)} (no descent seen, every trial diverged, or the "
              "finder failed: the check above says which): not trained again")
    return found
