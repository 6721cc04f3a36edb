"""The Imagenet Race check: the run completed within its budget, validated every epoch on the held-out split, its
memory levers (if it asked for any) ran, and its leaderboard entry matches its record.

    board = race.Leaderboard(profile=day.profile)
    checks.race(job_id, board)      # ✅, or ❌ with what to do

Every number comes from the run's own records (all its segments, dlokit.race.history), never from the
notebook: the budget is the board's (the one its over-budget flag uses), else the one the run was planned for.
"""
from __future__ import annotations

import math
from pathlib import Path

from .framework import FAILED, INFO, PASSED, check, failed, from_parts, part
from .records import ids, why_not_finished


def planned(job_id: str) -> dict:
    """The plan the race job was submitted with (its job card), {} when unknown."""
    from dlokit.submission.jobs import find_card

    try:
        return find_card(job_id).extra.get("race") or {}
    except (LookupError, ValueError):  # no card here (another log folder), or not a job id
        return {}


def budget_part(used: float, budget: float, plan: dict):
    if not math.isfinite(budget):
        return part("budget", INFO, f"{used:.3g} GPU-hours used; this profile sets no race budget")
    words = f"{used:.3g} of {budget:.3g} GPU-hours ({100 * used / budget:.0f} %)"
    if used <= budget:
        return part("budget", PASSED, words)
    return part("budget", FAILED, f"over budget: {words}; the leaderboard flags it. The epochs ran slower than the "
                "test job's steps: plan with more margin (BUDGET_MARGIN in the race notebook) or from a longer test "
                f"job, then run again (planned: {plan.get('epochs', '?')} epochs, "
                f"{plan.get('planned_gpu_hours') or 0:.3g} GPU-hours)")


def validation_part(found):
    """Every epoch the run was asked for has its validation line, on a data set with a held-out val/ split."""
    config = found.segments[0].config
    data = str(config.get("data"))
    if data == "synthetic":
        return part("validation", FAILED, "trained on --data synthetic: there is no held-out split to score on; "
                    "race on an ImageNet-layout folder (train/ and val/)")
    if config.get("test"):
        return part("validation", FAILED, "this is a --test job (no validation): post and check the full run "
                    "that race.submit_run returned, not the test job")
    wanted = list(range(int(config.get("epochs") or 0)))
    validated = [int(e) for e in found.val["epoch"]]
    missing = sorted(set(wanted) - set(validated))
    if not wanted or missing:
        return part("validation", FAILED, f"epoch(s) {missing or wanted} have no validation line: the race is "
                    "scored on a validation after every epoch; run the full training (--epochs) to its end")
    val_dir = Path(data) / "val"
    size = ""
    if val_dir.is_dir():
        from dlokit.race.planner import count_images

        size = f" ({count_images(val_dir)} images; training reads train/ only)"
    return part("validation", PASSED, f"all {len(wanted)} epochs validated on the held-out split {val_dir}{size}")


def levers_part(found):
    """What the memory levers the run asked for did, read from its own step lines (every segment's; train_classifier.py
    records a step's forward passes and block forwards under --grad-accum and --activation-checkpointing): None when
    it asked for none."""
    import pandas as pd

    from dlokit.race.planner import levers_ran

    config = found.segments[0].config
    asked_k, asked_checkpointing = int(config.get("grad_accum") or 1), bool(config.get("activation_checkpointing"))
    if asked_k == 1 and not asked_checkpointing:
        return None
    steps = pd.concat([run.lines("step") for run in found.segments], ignore_index=True)
    seen = steps.dropna(subset=["forward_images"]) if "forward_images" in steps else steps.iloc[0:0]
    if seen.empty:
        return part("memory levers", INFO, "the run's steps record no forward passes: what its levers did is not known")
    k, recomputed, _ = levers_ran(steps, config)
    said, not_run = [], []
    if asked_k > 1 and k == 1:
        not_run.append(f"your accumulation ran the whole batch in one pass: TODO TP1.5 (accumulate_step in "
                       f"fit_levers.py); --grad-accum {asked_k} held the whole batch's activations")
    elif asked_k > 1:
        images = "+".join(str(n) for n in seen["forward_images"].iloc[0])
        said.append(f"--grad-accum {asked_k}: {k} forward passes a step ({images} images on rank 0), one optimizer step")
    if asked_checkpointing and not recomputed:
        not_run.append("your activation checkpointing recomputed nothing, each block ran once a pass: TODO TP1.5 "
                       "(Checkpointed.forward in fit_levers.py); --activation-checkpointing kept every activation")
    elif asked_checkpointing:
        said.append("--activation-checkpointing: every block ran forward again in backward (its activations "
                    "recomputed, not kept)")
    if not_run:
        return part("memory levers", FAILED, "; ".join(not_run))
    return part("memory levers", PASSED, "; ".join(said) + f" (over {len(seen)} recorded steps)")


def leaderboard_part(board, job_id: str):
    """(the part, the run's rank on the board or None)."""
    table = board.table()  # the verified entries only
    mine = table[table["run_id"] == job_id]
    if not mine.empty:
        rank = int(mine["rank"].iloc[0])
        return part("leaderboard", PASSED, f"its entry verifies against its record: rank {rank} of {len(table)}"), rank
    _, rejected = board.read()
    why = [f"{name}: {reason}" for name, reason in rejected if f"--{job_id}." in f"{name}."]
    if why:
        return part("leaderboard", FAILED, f"its entry is rejected ({why[0]}): post it again with "
                    f"board.post('{job_id}'), which reads every number from the record"), None
    return part("leaderboard", FAILED, f"not on the leaderboard {board.folder} yet: board.post('{job_id}')"), None


@check("Imagenet Race")
def race(job_id, board=None):
    """The race run completed (every segment of a requeued run counted) within the budget, validated every epoch
    on the held-out split, and its leaderboard entry verifies against its record."""
    from dlokit.analysis import load_run
    from dlokit.race import Leaderboard, history

    wanted = ids(job_id)
    if not wanted:
        return failed("no job id given: pass the id race.submit_run returned")
    job_id = wanted[0]
    plan = planned(job_id)
    board = board or Leaderboard(budget_gpu_hours=plan.get("budget_gpu_hours"))
    found = history(job_id, board.runs_dir)
    if found.state != "completed":
        last = found.segments[-1] if found.segments else load_run(job_id, board.runs_dir)
        return failed(why_not_finished(job_id, last), found.events())
    used = found.usage.gpu_hours or 0.0
    completed = part("completed", PASSED, f"completed in {len(found.segments)} segment(s)")
    leaderboard, rank = leaderboard_part(board, found.job_id)
    parts = [completed, budget_part(used, board.budget_gpu_hours, plan), validation_part(found), levers_part(found),
             leaderboard]
    budget = board.budget_gpu_hours
    message = (f"best top-1 {found.best_top1 or 0:.3f} in {len(found.val)} epochs, {used:.3g} GPU-hours"
               + (f" of {budget:.3g}" if math.isfinite(budget) else "") + f", rank {rank} on the leaderboard")
    return from_parts(parts, message, found.events(), job_id=found.job_id, epochs=len(found.val),
                      segments=len(found.segments), best_top1=found.best_top1, gpu_hours=used,
                      budget_gpu_hours=budget if math.isfinite(budget) else None, rank=rank,
                      planned_epochs=plan.get("epochs"))
