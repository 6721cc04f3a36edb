"""Hyper-parameter search (dlokit.hpo): an Optuna study whose trials are real jobs of the training script,
pruned from the validation accuracy each epoch, kept in a journal file, resumed after its notebook died."""
from __future__ import annotations

import functools
import io
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

import dlokit
from dlokit import checks, hpo
from dlokit.analysis import samplers
from dlokit.submission import jobs
from dlokit.in_job.runrecord import read_rank

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = REPO / "tp_scripts" / "solutions"
SMALL_SPACE = {"lr": ("log", 0.01, 0.2), "label_smoothing": ("float", 0.0, 0.2)}

DRIVER = """
import functools, sys
from dlokit import hpo
name, command, n_trials, scripts = sys.argv[1:]
space = hpo.load_space(scripts)
study = hpo.open_study(name, sampler="random", pruner="none")
hpo.run_study(study, functools.partial(space.trial_options, space={"lr": ("log", 0.01, 0.2)}), command,
              n_trials=int(n_trials), poll_s=0.5)
"""


@pytest.fixture(scope="module")
def tiny_images(tmp_path_factory):
    root = tmp_path_factory.mktemp("images") / "tiny"
    subprocess.run([sys.executable, str(REPO / "data" / "make_synthetic_imagenet.py"), "--out", str(root),
                    "--classes", "4", "--train-per-class", "8", "--val-per-class", "4", "--size", "40",
                    "--quiet"], check=True)
    return root


def command(images, epochs: int = 2) -> str:
    return (f"{SOLUTIONS / 'train_classifier.py'} --data {images} --model resnet18 --image-size 32 "
            f"--batch-size 8 --epochs {epochs} --print-every 100")


def options(space=SMALL_SPACE):
    return functools.partial(hpo.load_space(SOLUTIONS).trial_options, space=space)


def test_study_of_four_trials_completes(workspace, tiny_images, capsys):
    space = hpo.load_space(SOLUTIONS)
    grid = {"lr": [0.01, 0.1], "label_smoothing": [0.0, 0.1]}
    study = hpo.open_study("grid4", sampler="grid", pruner="none", search_space=grid)
    table = hpo.run_study(study, options(), command(tiny_images), n_trials=10, n_parallel=2, name="hpo4",
                          poll_s=0.5)

    trials = study.trials
    assert len(trials) == 4  # the grid has 4 points: the study stops there, not at n_trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    assert {(t.params["lr"], t.params["label_smoothing"]) for t in trials} == {(a, b) for a in grid["lr"]
                                                                              for b in grid["label_smoothing"]}
    ids = [t.user_attrs["job_id"] for t in trials]
    assert len(set(ids)) == 4 and {c.job_id for c in jobs.all_cards()} == set(ids)
    for trial in trials:
        card = jobs.find_card(trial.user_attrs["job_id"])
        record = read_rank(card.run_dir / "rank0")
        assert record["state"] == "completed"
        assert trial.value == record["summary"]["val_acc"]  # the study's value is the run's last validation
        assert sorted(trial.intermediate_values) == [1, 2]  # one report per epoch, steps are epochs done
        assert record["run"]["config"]["lr"] == trial.params["lr"]  # the job ran the options the trial chose
        assert record["run"]["config"]["label_smoothing"] == trial.params["label_smoothing"]
    assert list(table["state"]) == ["COMPLETE"] * 4 and {"val_acc", "lr", "label_smoothing", "job_id"} <= set(table)
    assert list(table["drawn_by"]) == ["grid point"] * 4
    compared = samplers.compare_studies({"grid": study})  # the side-by-side table, on the jobs' own records
    row = compared.iloc[0]
    assert (row.trials, row.complete, row.epochs_run, row.distinct_options) == (4, 4, 8, 4)
    assert row.best_job == study.best_trial.user_attrs["job_id"] and row.verdict == samplers.HIGHEST
    assert row.best_top1 == pytest.approx(study.best_value) and row.top1_low <= row.best_top1 <= row.top1_high
    side_by_side = checks.samplers({"grid": study})
    assert side_by_side.status == "passed" and side_by_side.part("grid points").message.startswith("4 distinct")
    history = samplers.history_figure({"grid": study})  # Optuna's plot, its legend naming the sampler
    assert [t.get_text() for t in history.axes[0].get_legend().get_texts()] == ["grid: trial value", "grid: best so far"]
    assert len(samplers.sampled_figure({"grid": study}, x="lr", y="label_smoothing").axes[0].collections[0]
               .get_offsets()) == 4  # every trial completed: one point each, no cross for a pruned one
    assert (workspace / "runs" / "hpo" / "grid4.journal").is_file()
    figures = hpo.figures(study)
    assert set(figures) == {"history", "intermediate", "importances"}
    assert all(f.axes for f in figures.values())
    printed = capsys.readouterr().out
    assert printed.count("submitted with --lr") == 4 and "epoch 2 val_acc" in printed
    reopened = hpo.open_study("grid4", sampler="grid", pruner="none", search_space=grid)  # from the journal
    assert [t.value for t in reopened.trials] == [t.value for t in trials]
    assert space.grid({"lr": ("log", 0.01, 0.1)}, points=2) == {"lr": [0.01, 0.1]}


def test_pruner_cancels_the_job_of_a_pruned_trial(workspace, tiny_images):
    """ThresholdPruner(lower=1.01) prunes any accuracy after the first epoch: both 30-epoch jobs stop early."""
    study = hpo.open_study("pruned", sampler="random", pruner=optuna.pruners.ThresholdPruner(lower=1.01))
    hpo.run_study(study, options(), command(tiny_images, epochs=30), n_trials=2, poll_s=0.5)

    assert [t.state for t in study.trials] == [TrialState.PRUNED] * 2
    for trial in study.trials:
        assert 1 <= trial.user_attrs["pruned_at_epoch"] < 30 and "cancelled" in trial.user_attrs["outcome"]
        [outcome] = dlokit.wait(trial.user_attrs["job_id"], timeout_s=60)
        assert outcome.state == "CANCELLED"
        record = read_rank(jobs.find_card(outcome.job_id).run_dir / "rank0")
        assert record["summary"]["status"] == "cancelled"
        assert record["summary"]["steps"] < record["run"]["config"]["total_steps"]  # stopped before its 30 epochs


def test_failed_job_makes_a_fail_trial_with_its_error(workspace, tiny_images):
    study = hpo.open_study("bad", sampler="random", pruner="none")
    table = hpo.run_study(study, lambda trial: ["--no-such-option", str(trial.suggest_int("x", 1, 3))],
                          command(tiny_images), n_trials=1, poll_s=0.5)
    [trial] = study.trials
    assert trial.state == TrialState.FAIL
    assert "FAILED" in trial.user_attrs["outcome"]
    assert "unrecognized arguments: --no-such-option" in trial.user_attrs["outcome"]
    assert table.loc[0, "state"] == "FAIL"


def test_killed_notebook_resumes_the_study_without_duplicate_jobs(workspace, tiny_images, capsys):
    script = workspace / "driver.py"
    script.write_text(DRIVER)
    first = subprocess.Popen([sys.executable, str(script), "resumed", command(tiny_images, epochs=3), "2",
                              str(SOLUTIONS)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    study = hpo.open_study("resumed", sampler="random", pruner="none")
    deadline = time.time() + 120
    while True:  # kill the "notebook" while trial 0's job runs
        assert first.poll() is None and time.time() < deadline, first.stderr.read() if first.poll() else "too slow"
        trials = study.trials
        job_id = trials[0].user_attrs.get("job_id") if trials else None
        if job_id and dlokit.job_outcome(job_id).state == "RUNNING":
            break
        time.sleep(0.3)
    first.send_signal(signal.SIGKILL)
    first.wait()
    orphan = study.trials[0]
    assert orphan.state == TrialState.RUNNING

    hpo.run_study(study, options({"lr": ("log", 0.01, 0.2)}), command(tiny_images, epochs=3), n_trials=2, poll_s=0.5)

    trials = study.trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    assert trials[0].user_attrs["job_id"] == orphan.user_attrs["job_id"]  # followed again, not submitted again
    assert sorted(trials[0].intermediate_values) == [1, 2, 3]
    assert sorted(c.job_id for c in jobs.all_cards()) == sorted(t.user_attrs["job_id"] for t in trials)
    assert f"following job {orphan.user_attrs['job_id']} again" in capsys.readouterr().out


def test_two_notebooks_share_one_study(workspace, tiny_images):
    """Two run_study processes on one journal at once: n_trials in all, one job each, nothing lost."""
    script = workspace / "driver.py"
    script.write_text(DRIVER)
    argv = [sys.executable, str(script), "shared", command(tiny_images), "2", str(SOLUTIONS)]
    drivers = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [driver.communicate(timeout=240)[0] for driver in drivers]
    assert [d.returncode for d in drivers] == [0, 0], outputs

    study = hpo.open_study("shared", sampler="random", pruner="none")
    trials = study.trials
    assert len(trials) == 2 and [t.state for t in trials] == [TrialState.COMPLETE] * 2
    ids = [t.user_attrs["job_id"] for t in trials]
    assert len(set(ids)) == 2 and sorted(c.job_id for c in jobs.all_cards()) == sorted(ids)
    assert all(len(t.intermediate_values) == 2 for t in trials)
    assert [t.user_attrs["drawn_by"] for t in trials] == ["random draw"] * 2


def test_samplers_pruners_and_the_student_space(tmp_path):
    """Sampler and pruner names give Optuna's own; the solution's space makes trials differ, the untouched
    student copy (generated, TODO TP3.5) makes every trial the same and records no parameter."""
    solution, student = hpo.load_space(SOLUTIONS), hpo.load_space(REPO / "tp_scripts")
    expected = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler,
                "grid": optuna.samplers.GridSampler}
    for name, kind in expected.items():
        grid = solution.grid(SMALL_SPACE, points=2) if name == "grid" else None
        study = hpo.open_study(f"s-{name}", storage_dir=tmp_path, sampler=name, search_space=grid)
        assert isinstance(study.sampler, kind)
        asked = [study.ask() for _ in range(4)]
        chosen = [solution.trial_options(trial, SMALL_SPACE) for trial in asked]
        assert len({tuple(c) for c in chosen}) == 4 and all(t.params for t in asked)
    pruners = {"hyperband": optuna.pruners.HyperbandPruner, "none": optuna.pruners.NopPruner,
               "successive-halving": optuna.pruners.SuccessiveHalvingPruner}
    for name, kind in pruners.items():
        assert isinstance(hpo.open_study(f"p-{name}", storage_dir=tmp_path, pruner=name).pruner, kind)

    study = hpo.open_study("student", storage_dir=tmp_path, sampler="random")
    asked = [study.ask() for _ in range(3)]
    assert len({tuple(student.trial_options(t, SMALL_SPACE)) for t in asked}) == 1
    assert not any(t.params for t in asked)


def test_tpe_draws_at_random_until_its_start_up_trials_have_finished_and_the_check_says_so(tmp_path):
    """The label follows Optuna's own rule: TPE's model chooses only once TPE_STARTUP_TRIALS trials have finished
    (complete or pruned). A study that never got past its start-up is told so by the check, as information."""
    startup = hpo.TPE_STARTUP_TRIALS
    assert [hpo.drawn_by("tpe", n) for n in range(startup + 1)] == ["random start-up"] * startup + ["TPE model"]
    assert hpo.drawn_by("grid", 0) == "grid point" and hpo.drawn_by("random", 9) == "random draw"
    study = hpo.open_study("tpe", storage_dir=tmp_path, sampler="tpe")
    assert study.sampler._n_startup_trials == startup  # the sampler Optuna runs is the one the label describes
    # Day 3 says so: from one seed, TPE's start-up draws are the random study's, so the two part ways at TPE's model
    space = hpo.load_space(SOLUTIONS)
    twins = [hpo.open_study(f"twin-{name}", storage_dir=tmp_path, sampler=name) for name in ("random", "tpe")]
    drawn = [[space.trial_options(twin.ask(), SMALL_SPACE) for _ in range(startup)] for twin in twins]
    assert drawn[0] == drawn[1] and drawn[0][0] != drawn[0][1]

    def tell(n: int, drawn: str) -> None:
        for _ in range(n):
            trial = study.ask()
            trial.suggest_float("lr", 0.01, 1.0, log=True)
            trial.set_user_attr("drawn_by", drawn)
            study.tell(trial, 0.5)

    tell(startup, "random start-up")
    drawn = checks.hpo(study).part("drawn")
    assert drawn.status == "info" and f"random start-up {startup}" in drawn.message
    assert "its model chose none" in drawn.message and f"until {startup} trials had finished" in drawn.message
    tell(1, "TPE model")
    drawn = checks.hpo(study).part("drawn")
    assert "TPE model 1" in drawn.message and "chose none" not in drawn.message


def test_samplers_side_by_side_check_fails_on_the_untouched_space_a_repeated_grid_point_and_unequal_budgets(tmp_path):
    def study_of(name: str, sampler: str, n: int, params=True, grid=None):
        study = hpo.open_study(name, storage_dir=tmp_path, sampler=sampler, search_space=grid)
        for k in range(n):
            trial = study.ask()
            if params:
                trial.suggest_float("lr", 0.01, 0.2, log=True) if grid is None else trial.suggest_categorical(
                    "lr", grid["lr"])
            study.tell(trial, 0.1 * (k + 1))
        return study

    grid = {"lr": [0.01, 0.05, 0.1, 0.2]}  # more points than trials: the grid sampler stops a study it has covered
    fair = {"grid": study_of("g", "grid", 2, grid=grid), "random": study_of("r", "random", 2)}
    result = checks.samplers(fair)
    assert result.status == "passed" and result.part("budget").status == "passed"
    assert result.part("best top-1").message == "no best trial with a validation"  # told values, no job behind them
    table = samplers.compare_studies(fair)
    assert list(table["verdict"]) == ["no complete trial with a validation"] * 2 and list(table["complete"]) == [2, 2]

    unequal = checks.samplers({**fair, "tpe": study_of("t", "tpe", 3)})
    assert unequal.status == "failed" and "not the same budget" in unequal.message
    nothing_drawn = {"random": study_of("u", "random", 2, params=False)}
    untouched = checks.samplers(nothing_drawn)
    assert untouched.status == "failed" and "TODO TP3.5" in untouched.message
    samplers.sampled_figure(nothing_drawn).savefig(io.BytesIO())  # no option to place: drawn empty, no error
    cut = study_of("p", "random", 1)
    trial = cut.ask()
    trial.suggest_float("lr", 0.01, 0.2, log=True)
    cut.tell(trial, state=TrialState.PRUNED)
    legend = samplers.sampled_figure({"random": cut}, x="lr", y="lr").axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["pruned or failed"]  # a cross, said in the panel
    again = study_of("g2", "grid", 2, grid=grid)
    again.enqueue_trial(again.trials[0].params)  # a grid point asked for a second time
    trial = again.ask()
    trial.suggest_categorical("lr", grid["lr"])
    again.tell(trial, 0.5)
    repeated = checks.samplers({"grid": again})
    assert repeated.part("grid points").status == "failed", repeated


def test_successive_halving_stops_more_than_hyperband_on_the_same_draws_and_the_check_reports_both(tmp_path):
    """Four trials on the same random draws, each reporting a lower value per epoch than the one before it, under
    each pruner (rungs at epochs 1, 2, 4): successive halving stops every trial but the first at its first rung;
    Hyperband's brackets (one never prunes) stop fewer and spend more epochs. The check passes and says so."""
    def study_under(pruner: str, name: str = "", params=True, reduction=2):
        study = hpo.open_study(name or f"prune-{pruner}", storage_dir=tmp_path, sampler="random", pruner=pruner,
                               reduction_factor=reduction, max_epochs=4)
        for k in range(4):
            trial = study.ask()
            if params:
                trial.suggest_float("lr", 0.01, 0.2, log=True)
            for epoch in range(1, 5):
                trial.report(0.5 - 0.1 * k - 0.01 * epoch, epoch)
                if trial.should_prune():
                    study.tell(trial, state=TrialState.PRUNED)
                    break
            else:
                study.tell(trial, 0.5 - 0.1 * k)
        return study

    pruned = {name: study_under(name) for name in ("successive-halving", "hyperband")}
    stopped = {name: sum(t.state == TrialState.PRUNED for t in s.trials) for name, s in pruned.items()}
    assert stopped["successive-halving"] == 3 and stopped["hyperband"] < 3, stopped
    result = checks.pruners(pruned)
    assert result.status == "passed", result
    assert result.part("pruners").message == ("successive-halving: SuccessiveHalvingPruner, "
                                              "hyperband: HyperbandPruner")
    assert result.part("same draws").status == "passed" and result.part("budget").status == "passed"
    assert "successive-halving: 3 of 4 pruned, 7 epochs run" in result.part("stopped").message
    figure = samplers.pruned_figure(pruned)
    crosses = [len([line for line in ax.lines if line.get_marker() == "x"]) for ax in figure.axes]
    assert crosses == [stopped["successive-halving"], stopped["hyperband"]]

    same_kind = checks.pruners({"a": pruned["hyperband"], "b": study_under("hyperband", "hb-again")})
    assert same_kind.status == "failed" and "one kind of pruner" in same_kind.part("pruners").message
    untouched = checks.pruners({"successive-halving": study_under("successive-halving", "u", params=False),
                                "hyperband": pruned["hyperband"]})
    assert untouched.status == "failed" and "TODO TP3.5" in untouched.message
    assert isinstance(hpo.open_study("hb", storage_dir=tmp_path, pruner="hyperband", max_epochs=4).pruner,
                      optuna.pruners.HyperbandPruner)
    for kwargs, match in (({"reduction_factor": 1}, "reduction_factor"), ({"max_epochs": 0}, "max_epochs")):
        with pytest.raises(ValueError, match=match):
            hpo.open_study("bad", storage_dir=tmp_path, pruner="hyperband", **kwargs)


def test_pruners_replayed_on_full_runs_stop_what_they_would_have_stopped_live(tmp_path):
    """Four trials trained to their last epoch once (pruner "none"), each reporting less than the one before it:
    replayed under each pruner, successive halving stops every trial but the first at its first rung, as it does on
    live trials (the test above), Hyperband fewer; the replays keep the runs' draws, curves and jobs, and the check
    says the pruners judged the same curves. A failed trial is copied as it ended."""
    full = hpo.open_study("curves", storage_dir=tmp_path, sampler="random", pruner="none")
    for k in range(4):
        trial = full.ask()
        trial.suggest_float("lr", 0.01, 0.2, log=True)
        trial.set_user_attr("job_id", f"job-{k}")
        for epoch in range(1, 5):
            trial.report(0.5 - 0.1 * k - 0.01 * epoch, epoch)
            assert not trial.should_prune()
        full.tell(trial, 0.5 - 0.1 * k - 0.04)
    failed_trial = full.ask()
    failed_trial.suggest_float("lr", 0.01, 0.2, log=True)
    full.tell(failed_trial, state=TrialState.FAIL)

    replays = {name: hpo.replay(full, name, reduction_factor=2, max_epochs=4)
               for name in ("successive-halving", "hyperband")}
    states = {name: [t.state for t in study.trials] for name, study in replays.items()}
    assert states["successive-halving"] == [TrialState.COMPLETE] + [TrialState.PRUNED] * 3 + [TrialState.FAIL]
    assert states["hyperband"].count(TrialState.PRUNED) < 3, states
    sh = replays["successive-halving"]
    assert [t.params for t in sh.trials] == [t.params for t in full.trials]
    assert [t.user_attrs.get("job_id") for t in sh.trials[:4]] == [f"job-{k}" for k in range(4)]
    assert sh.trials[0].value == full.trials[0].value and sh.trials[1].user_attrs["pruned_at_epoch"] == 1
    assert sum(len(t.intermediate_values) for t in sh.trials[:4]) == 4 + 3 < 16  # epochs it would have run
    result = checks.pruners(replays)
    assert result.status == "passed", result
    assert "replayed the trials of study 'curves'" in result.part("same curves").message
    assert "successive-halving: 3 of 5 pruned, 7 epochs it would have run" in result.part("stopped").message
    assert "0.160 (trial 3)" in result.part("had they run on").message  # 0.5 - 0.3 - 0.04: where its run ended
    figure = samplers.pruned_figure(replays)
    assert "7 of the 16 epochs trained" in figure.axes[0].get_title()
    assert len([line for line in figure.axes[0].lines if line.get_linestyle() == ":"]) == 3  # where each went on


def test_no_study_is_refused_with_what_to_give():
    for view in (samplers.compare_studies, samplers.history_figure, samplers.sampled_figure):
        with pytest.raises(ValueError, match="name: study"):
            view({})


def test_best_accuracies_side_by_side_are_ranked_only_beyond_noise():
    import pandas as pd

    table = pd.DataFrame({"study": ["grid", "random", "tpe"], "best_top1": [0.40, 0.10, 0.42],
                          "top1_low": [0.31, 0.05, 0.33], "top1_high": [0.50, 0.18, 0.52]})
    assert samplers._verdicts(table) == [samplers.WITHIN_NOISE, samplers.BELOW, samplers.HIGHEST]
    # two pruners that kept the same best trial (2026-11-29: successive halving and Hyperband, 0.335 each): both highest
    tie = pd.DataFrame({"study": ["successive-halving", "hyperband"], "best_top1": [0.335, 0.335],
                        "top1_low": [0.291, 0.291], "top1_high": [0.383, 0.383]})
    assert samplers._verdicts(tie) == [samplers.HIGHEST, samplers.HIGHEST]


def test_bad_arguments_are_refused_with_a_reason(workspace, tmp_path):
    for name in ("../escape", "a/b", ".hidden", "", "x" * 101):
        with pytest.raises(ValueError, match="study name"):
            hpo.open_study(name, storage_dir=tmp_path)
    with pytest.raises(ValueError, match="sampler='grid' needs search_space"):
        hpo.open_study("g", storage_dir=tmp_path, sampler="grid")
    with pytest.raises(ValueError, match="sampler 'bayes'"):
        hpo.open_study("g", storage_dir=tmp_path, sampler="bayes")
    with pytest.raises(ValueError, match="pruner 'median'"):
        hpo.open_study("g", storage_dir=tmp_path, pruner="median")
    hpo.open_study("d", storage_dir=tmp_path)
    with pytest.raises(ValueError, match="created to maximize"):
        hpo.open_study("d", storage_dir=tmp_path, direction="minimize")
    study = hpo.open_study("r", storage_dir=tmp_path)
    for kwargs, match in (({"n_trials": 0}, "n_trials"), ({"metric": "best_val_acc"}, "metric"),
                          ({"poll_s": -1}, "poll_s"), ({"n_gpu": [1, 2]}, "n_gpu"), ({"gpus": 2}, "unknown option")):
        with pytest.raises((ValueError, TypeError), match=match):
            hpo.run_study(study, options(), "train_classifier.py --epochs 1", **kwargs)
    with pytest.raises(FileNotFoundError, match="hpo_space.py"):
        hpo.load_space(tmp_path)
    assert study.trials == []  # nothing was asked or submitted


@pytest.mark.slurm
def test_study_on_the_local_slurm(slurm_cluster, workspace, tiny_images):
    """Two trials as Slurm jobs: one completes, the other is pruned after its first epoch and scancelled."""
    dlokit.use_profile("local-slurm")

    class PruneSecondTrial(optuna.pruners.BasePruner):
        def prune(self, study, trial):
            return trial.number == 1

    def make_options(trial):  # the trial to prune runs long enough to be caught running
        return [*options()(trial), "--epochs", "2" if trial.number == 0 else "30"]

    study = hpo.open_study("on-slurm", sampler="random", pruner=PruneSecondTrial())
    hpo.run_study(study, make_options, command(tiny_images), n_trials=2, name="hposlurm", poll_s=1.0,
                  time_max="00:05:00")
    first, second = study.trials
    assert first.state == TrialState.COMPLETE and sorted(first.intermediate_values) == [1, 2]
    assert second.state == TrialState.PRUNED
    [outcome] = dlokit.wait(second.user_attrs["job_id"], timeout_s=120)
    assert outcome.state == "CANCELLED"
