"""The race notebook's views: what the plan says and where its budget goes, then what the run used of it and its
validation top-1 per segment (dlokit.race plans and runs; analysis.race_history reads the segments back)."""
from __future__ import annotations

from dlokit.analysis.figures import message_figure, new_figure
from dlokit.analysis.run import load_run


def race_line(profile) -> str:
    """What the profile's race is: GPUs per run, budget, leaderboard."""
    budget = (f"{profile.race_budget_minutes:g} min of wall clock" if profile.race_budget_minutes else
              f"{profile.race_budget_gpu_hours:g} GPU-hours")
    return f"race: {profile.race_gpus} GPU(s) per run, budget {budget}; leaderboard {profile.leaderboard}"


def plan_text(plan, test_job) -> str:
    """The plan's formula, why it has no energy figure (if so), and how many epochs fit."""
    lines = [plan.formula()]
    if plan.energy_wh is None:
        summary = load_run(test_job).summary
        why = summary.get("energy_unavailable") or summary.get("host_energy_unavailable") or "no energy counter"
        lines.append(f"energy n/a: the test job read no energy counter ({why})")
    lines.append(f"fits: {plan.epochs} epoch(s)" if plan.fits else
                 "fits NO epoch: a smaller image, model or batch, then test again")
    return "\n".join(lines)


def plan_figure(plan, budget_s: float):
    """Where the budget goes: start-up, then each part of the planned epochs, against the budget and the part of
    it planned on."""
    pieces = [("startup", plan.test.startup_s), (f"{plan.epochs} × training", plan.epochs * plan.train_epoch_s),
              (f"{plan.epochs} × validation", plan.epochs * plan.val_s),
              (f"{plan.epochs} × loader start", plan.epochs * plan.loader_s),
              (f"{plan.epochs} × checkpoint", plan.epochs * plan.checkpoint_s)]
    figure, axes = new_figure(size=(9, 1.9))
    ax, left = axes[0, 0], 0.0
    for label, seconds in pieces:
        if seconds > 0:
            ax.barh(0, seconds, left=left, label=f"{label}: {seconds:.1f} s")
            left += seconds
    ax.axvline(budget_s, color="black", label=f"budget: {budget_s:.0f} s")
    ax.axvline(plan.budget_s, color="black", linestyle="--", label=f"planned on: {plan.budget_s:.0f} s")
    ax.set(yticks=[], xlabel=f"seconds of wall clock on {plan.gpus} GPU(s)", title="the plan")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=3, fontsize=8, frameon=False)
    return figure


def usage_text(history, planned: dict) -> str:
    """What the run took against its plan (`planned`: the plan kept with the job card); empty before it ran."""
    usage = history.usage
    if not usage.elapsed_s:
        return ""
    return (f"planned {planned['planned_s']:.0f} s ({planned['planned_gpu_hours']:.3g} GPU-hours) for "
            f"{planned['epochs']} epochs; took {usage.elapsed_s:.0f} s ({usage.gpu_hours:.3g} GPU-hours), "
            f"{100 * usage.elapsed_s / planned['planned_s']:.0f} % of the plan")


def val_figure(history):
    """The race job's validation top-1 per epoch, a line per segment (a requeued run has several)."""
    if history.val.empty:
        return message_figure(f"race job {history.job_id}: no validation line yet", title="validation top-1")
    segment_of = {run.run_id: k for k, run in enumerate(history.segments)}
    figure, axes = new_figure(size=(7, 3.5))
    for run_id, part in history.val.groupby("run_id", sort=False):
        axes[0, 0].plot(part["epoch"], part["val_acc"], "o-", label=f"segment {segment_of.get(run_id, '?')} ({run_id})")
    axes[0, 0].set(xlabel="epoch", ylabel="validation top-1", ylim=(0, 1), title=f"race job {history.job_id}")
    axes[0, 0].legend(fontsize=8)
    return figure
