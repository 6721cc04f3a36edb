"""The instructor's check of the race: every entry's final weights scored again, on a test split no student reads.

    python -m dlokit.classroom verify-race --profile course [--test /instructors/race-test]
    dlokit.race.verify_race(test_dir=...)     # the same table, in a notebook cell (the current profile)

A student owns their run records, so a record can always be edited (its validation lines and summary set to
0.999 together pass every consistency check of the leaderboard). Only a score the instructor computes can be
trusted: for each accepted entry, one job of its own (dlokit.race.score_checkpoint) loads the run's last
checkpoint and measures its top-1 on the profile's `race_test_dir`. The table ranks by that score and flags an
entry whose claimed final top-1 (on the validation split) and tested top-1 disagree beyond noise: their 95 %
Wilson intervals do not overlap, and an entry whose checkpoint was refused (it holds more than weights: loading
it could run code as the instructor; score_checkpoint never unpickles it) or could not be scored, saying why.
"""
from __future__ import annotations

import shlex
from pathlib import Path

import pandas as pd

from ..analysis import stats
from ..analysis.run import load_run
from ..submission.jobs import wait
from ..submission.profiles import current_profile
from ..in_job.runrecord import is_number
from ..in_job.untrusted import printable
from ..submission.submit import gpu_jobs_submitter
from .leaderboard import Leaderboard
from ..analysis.race_history import history

SCORER = Path(__file__).with_name("score_checkpoint.py")
VERIFY_TAG = "race-verify"  # the scoring jobs' tag: the instructor's jobs, not a student's (the class report skips them)
COLUMNS = ["rank", "nickname", "run_id", "claimed_top1", "claimed_low", "claimed_high", "test_top1", "test_low",
           "test_high", "flag", "score_job"]


class VerifyError(ValueError):
    """The race cannot be verified (no test split); the message says what to set."""


def scoring_command(entry: dict, runs_dir: Path, test_dir: Path) -> str:
    """The job that scores one entry: its last segment's checkpoint, the model as the run built it."""
    found = history(entry["run_id"], runs_dir)
    config = found.segments[0].config
    argv = [str(SCORER), "--checkpoint", str(Path(runs_dir) / found.segments[-1].run_id / "checkpoint.pt"),
            "--test", str(test_dir), "--model", str(config.get("model")), "--image-size", str(config.get("image_size"))]
    if config.get("cifar_stem"):
        argv.append("--cifar-stem")
    return shlex.join(argv)


def _claimed(entry: dict, runs_dir: Path) -> stats.Estimate:
    images = history(entry["run_id"], runs_dir).segments[0].config.get("val_images")
    if not is_number(images) or not images:
        return stats.NO_ESTIMATE
    return stats.proportion(round(entry["final_top1"] * images), int(images))


def _tested(job_id: str, runs_dir: Path) -> stats.Estimate:
    summary = load_run(job_id, runs_dir).summary
    acc, images = summary.get("test_acc"), summary.get("test_images")
    if not (is_number(acc) and is_number(images) and images):
        return stats.NO_ESTIMATE
    return stats.proportion(round(acc * images), int(images))


def verify_race(test_dir=None, board: Leaderboard | None = None, time_max: str = "00:10:00") -> pd.DataFrame:
    """Score every accepted entry's final checkpoint on the test split, in jobs of their own through the current
    profile (dlokit.use_profile); rank by that score."""
    profile = current_profile()
    test_dir = Path(test_dir or profile.race_test_dir or "")
    if not str(test_dir) or str(test_dir) == "." or not test_dir.is_dir():
        raise VerifyError(f"no test split at {str(test_dir) or '(none)'}: set race_test_dir in the profile (or --test) "
                          "to a folder of class folders that only instructors can read")
    board = board or Leaderboard(profile=profile)
    accepted, _ = board.read()
    jobs = [gpu_jobs_submitter(scoring_command(e, board.runs_dir, test_dir), n_gpu=1, name="verify",
                               time_max=time_max, tag=VERIFY_TAG, verbose=False)[0] for e in accepted]
    outcomes = {o.job_id: o for o in wait(jobs)} if jobs else {}
    rows = []
    for entry, job in zip(accepted, jobs):
        claimed = _claimed(entry, board.runs_dir)
        tested = _tested(job, profile.runs) if outcomes[job].state == "COMPLETED" else stats.NO_ESTIMATE
        if not tested.usable:
            outcome = outcomes[job]
            lines = outcome.cause.strip().splitlines() or ["no cause found"]
            said = next((line for line in lines if "refused" in line), lines[-1])
            flag = printable(f"refused: {said}" if outcome.state == "REFUSED" else f"not scored ({outcome.state}): "
                             f"{lines[-1]}", 300)
        elif claimed.usable and (claimed.low > tested.high or claimed.high < tested.low):
            flag = (f"claimed {claimed.value:.3f} [{claimed.low:.3f}–{claimed.high:.3f}] on validation, scored "
                    f"{tested.value:.3f} [{tested.low:.3f}–{tested.high:.3f}] on the test split: they disagree "
                    "beyond noise")
        else:
            flag = ""
        rows.append({"nickname": entry["nickname"], "run_id": entry["run_id"], "claimed_top1": claimed.value,
                     "claimed_low": claimed.low, "claimed_high": claimed.high, "test_top1": tested.value,
                     "test_low": tested.low, "test_high": tested.high, "flag": flag, "score_job": job})
    table = pd.DataFrame(rows, columns=COLUMNS[1:])
    table = table.sort_values("test_top1", ascending=False, na_position="last").reset_index(drop=True)
    table.insert(0, "rank", range(1, len(table) + 1))
    return table
