"""The Imagenet Race: plan a run that fits a budget, run it so that it survives the cluster, rank it.

    from dlokit import race
    form = race.race_form(day)                          # the choices -> form.options()
    test_id = race.submit_test(day, form.options())     # a short timed test job
    plan = race.make_plan(test_id, profile=day.profile) # epochs that fit the profile's budget
    print(plan.formula())
    job_id = race.submit_run(day, plan, form.options(), begin="22:00")   # begin: Slurm only
    race.history(job_id)                                # segments, per-epoch top-1, GPU-hours, energy
    board = race.Leaderboard(profile=day.profile); board.post(job_id); board.widget(); board.plot()

planner.py (the budget formula), form.py (the ipywidgets form), submit.py (test job, full run, --begin),
requeue.py (checkpoint on a signal, requeue, resume; the segments are read back by
dlokit.analysis.race_history), leaderboard.py, verify.py
(the instructor's re-scoring of every entry on a test split no student reads).
"""
from .form import RaceForm, race_form, race_options
from .leaderboard import Leaderboard, LeaderboardError, pareto_front
from .planner import RacePlan, RacePlanError, TestRun, make_plan, measure
from ..analysis.race_history import RaceHistory, history
from .requeue import RequeueingTask
from .launch import check_begin, submit_run, submit_test
from .verify import VerifyError, verify_race

__all__ = ["Leaderboard", "LeaderboardError", "RaceForm", "RaceHistory", "RacePlan", "RacePlanError",
           "RequeueingTask", "TestRun", "check_begin", "history", "make_plan", "measure", "pareto_front",
           "race_form", "race_options", "submit_run", "submit_test", "VerifyError", "verify_race"]
