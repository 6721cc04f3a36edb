"""Day 3 checks: the optimisers and schedules (TP3.1), the LR range test (TP3.2), compilation (TP3.3), the
storage formats (TP3.4) and the search space of the hyper-parameter study (TP3.5)."""
from __future__ import annotations

import pandas as pd

from dlokit.analysis.compile_storage import fastest_read, read_table
from dlokit.analysis.large_batch import range_tests

from .framework import FAILED, INFO, PASSED, check, failed, from_parts, not_applicable, part, passed, three_digits
from .records import load_completed, load_last

EXPECTED_CLASS = {"sgd": "SGD", "adamw": "AdamW", "lamb": "Lamb", "lars": "Lars", "lion": "Lion"}
SAME_START = 1e-4  # relative spread of the trials' first losses below which they started from the same weights


def _lr_shape(run) -> str | None:
    """What is wrong with the learning rate the run's steps recorded, given its schedule (None: fine)."""
    steps = run.steps
    if "lr" not in steps or len(steps) < 3:
        return None
    lr = pd.to_numeric(steps["lr"], errors="coerce").dropna().tolist()
    config = run.config
    warmup, schedule = int(config.get("warmup_steps") or 0), config.get("lr_schedule")
    if warmup > 1 and len(lr) > warmup and not lr[0] < lr[warmup - 1]:
        return f"--warmup-steps {warmup} asked, but the lr did not rise over the first steps ({lr[0]:.3g} → {lr[warmup - 1]:.3g})"
    after = lr[warmup:]
    if schedule == "constant" and len(after) > 1 and max(after) - min(after) > 1e-12 * max(after):
        return f"constant schedule, but the lr moved after the warm-up ({min(after):.3g} … {max(after):.3g})"
    if schedule in ("cosine", "onecycle") and len(after) > 1 and not after[-1] < max(lr):
        return f"{schedule} schedule, but the lr did not fall by the end ({after[-1]:.3g}, peak {max(lr):.3g})"
    return None


@check("TP3.1 optimisers and schedules")
def optimizers(job_ids):
    """Each run built the optimiser it was asked for (the class read back from its record) and its learning rate
    moved as its schedule says (warm-up rising, cosine/one-cycle falling, constant flat)."""
    runs, problem = load_completed(job_ids)
    if problem:
        return problem
    details, wrong_class, wrong_lr = [], [], []
    for run in runs:
        asked = run.config.get("optimizer", "sgd")
        built = (run.config.get("optimizer_class") or "?").rsplit(".", 1)[-1]
        details.append(f"run {run.run_id}: --optimizer {asked} built {built}, schedule {run.config.get('lr_schedule')}"
                       f", peak lr {three_digits(run.config.get('lr_peak'))}")
        if built != EXPECTED_CLASS.get(asked, built):
            wrong_class.append(f"run {run.run_id} asked for --optimizer {asked} but built {built} "
                               f"(TODO TP3.1 in optim_setup.py)")
        shape = _lr_shape(run)
        if shape:
            wrong_lr.append(f"run {run.run_id}: {shape}")
    names = sorted({EXPECTED_CLASS.get(r.config.get("optimizer", "sgd"), "?") for r in runs})
    code = part("optimiser", FAILED, wrong_class[0]) if wrong_class else part(
        "optimiser", PASSED, f"every run built the optimiser it asked for ({', '.join(names)})")
    schedule = part("schedule", FAILED, wrong_lr[0]) if wrong_lr else part(
        "schedule", PASSED, "the recorded learning rates follow each schedule")
    from dlokit.analysis import stats
    from dlokit.analysis.large_batch import large_batch_lesson

    shown = large_batch_lesson([r.run_id for r in runs])
    lesson = None if shown["outcome"] is None else part(
        "large-batch lesson", PASSED if shown["outcome"] == stats.AGREES else INFO, shown["text"])
    return from_parts([code, schedule, lesson], f"{len(runs)} runs built {', '.join(names)} with the schedules asked"
                      + ("; the large-batch lesson shows" if lesson and lesson.status == PASSED else ""), details)


@check("TP3.2 LR range test")
def lr_finder(job_ids):
    """In every --lr-finder run (one per batch), every optimiser's trials started from the same weights with a
    fresh optimiser (their first losses are the same number), and each range test suggested a learning rate."""
    runs = []
    for job_id in job_ids if isinstance(job_ids, (list, tuple)) else [job_ids]:
        run, problem = load_last(job_id)
        if problem:
            return problem
        runs.append(run)
    if not runs:
        return failed("no --lr-finder run given")
    tests = [(run, name, found) for run in runs for name, found in range_tests(run).items()]
    details = [f"run {run.run_id} (batch {run.config.get('global_batch_size')}), {name}: "
               f"{found.get('lr_finder_trials') or 0} trials, first-loss spread {_g(found.get('lr_finder_first_loss_spread'))}, "
               f"suggested lr {_g(found.get('lr_finder_suggested_lr'))} (rule {found.get('lr_finder_rule')})"
               for run, name, found in tests]
    for run, name, found in tests:
        trials, spread = found.get("lr_finder_trials") or 0, found.get("lr_finder_first_loss_spread")
        if trials < 3:
            return failed(f"run {run.run_id} ran {trials} {name} trial(s): an LR range test needs several (is "
                          "--lr-finder on?)", details)
        if spread is None or spread > SAME_START:
            return failed(f"the {name} trials of run {run.run_id} did not start from the same loss (relative spread "
                          f"{_g(spread)}): each trial must reload the initial weights and build a fresh optimiser "
                          "(TODO TP3.2 in lr_range_test.py)", details)
        if found.get("lr_finder_no_descent"):
            return failed(f"the {name} range test of run {run.run_id} saw no descent: its lowest loss is the smallest "
                          f"lr's ({_g(found.get('lr_finder_min_loss_lr'))}), so it suggests nothing; give each trial "
                          "more steps (--lr-finder-steps) or start lower (--lr-finder-min)", details)
        if found.get("lr_finder_suggested_lr") is None:
            return failed(f"every {name} trial of run {run.run_id} diverged: no learning rate to suggest; lower "
                          "--lr-finder-max", details)
    return passed(f"{len(tests)} range test(s) ({', '.join(dict.fromkeys(name for _, name, _ in tests))} at "
                  f"{len(runs)} batch(es)), each trial from the same weights and a fresh optimiser, each with a "
                  "suggested lr", details)


def _g(value) -> str:
    return three_digits(value, missing="none")


@check("TP3.5 hyper-parameter search")
def hpo(study):
    """The study's trials chose their options through the trial (so the sampler really searched), and the
    completed ones reported a value; pruned trials are counted."""
    trials = study.trials
    states = [t.state.name for t in trials]
    done = [t for t in trials if t.state.name == "COMPLETE"]
    pruned = states.count("PRUNED")
    details = [f"trial {t.number}: {t.state.name}, params {t.params}, value {t.value}" for t in trials]
    if not done:
        return failed(f"no trial of study {study.study_name!r} completed ({', '.join(states) or 'no trial'}): "
                      "look at the outcome column of the trials table", details)
    if not any(t.params for t in trials):
        return failed("no trial asked the sampler for a value (trial.params is empty): every trial ran the same "
                      "options — hpo_space.suggest must call trial.suggest_* (TODO TP3.5)", details)
    distinct = {tuple(sorted(t.params.items())) for t in trials if t.params}
    search = part("search", PASSED if len(distinct) > 1 or len(trials) == 1 else FAILED,
                  f"{len(distinct)} distinct option sets over {len(trials)} trials")
    pruning = part("pruning", INFO, f"{pruned} trial(s) pruned, " + (
        "replayed on runs trained to their last epoch" if study.user_attrs.get("replayed_from") else
        "their jobs cancelled early"))
    best = study.best_trial  # the study's direction: highest accuracy, or lowest loss
    return from_parts([search, pruning, _drawn(trials)],
                      f"{len(done)} trials completed, best {best.value:.3f} with {best.params}", details)


def _drawn(trials):
    """Which trials the sampler's model chose: TPE draws at random until TPE_STARTUP_TRIALS trials have finished."""
    from dlokit.analysis.samplers import drawn_counts, drawn_text  # here: the other days' checks need no Optuna
    from dlokit.hpo import TPE_MODEL, TPE_START, TPE_STARTUP_TRIALS

    counts = drawn_counts(trials)
    text = drawn_text(counts)
    if TPE_START in counts and TPE_MODEL not in counts:
        text += (f": TPE drew at random until {TPE_STARTUP_TRIALS} trials had finished, so its model chose none of "
                 "these; give the study more trials to see it search")
    return part("drawn", INFO, f"how the trials' options were chosen: {text}")


def _side_by_side(studies: dict, headline: str, own_parts) -> object:
    """What TP3.5's two comparisons judge alike: every study passes the search check, all ran the same number of
    trials, and their best top-1s with their intervals are reported, not judged (a handful of trials cannot rank
    them). `own_parts(table)` gives what one comparison judges besides (table: samplers.compare_studies)."""
    from dlokit.analysis.samplers import compare_studies

    results = {name: hpo.__wrapped__(study) for name, study in studies.items()}
    for name, result in results.items():
        if result.status == FAILED:
            return failed(f"study {name!r}: {result.message}", result.details)
    table = compare_studies(studies)
    trials = set(table["trials"])
    budget = part("budget", PASSED if len(trials) == 1 else FAILED,
                  f"{', '.join(f'{r.study} {r.trials}' for r in table.itertuples())} trials: "
                  + ("the same budget" if len(trials) == 1 else "not the same budget: give each study n_trials"))
    best = "; ".join(f"{r.study} {r.best_top1:.3f} [{r.top1_low:.3f}–{r.top1_high:.3f}] ({r.verdict})"
                     for r in table.itertuples() if pd.notna(r.best_top1))
    return from_parts([*own_parts(table), budget, part("best top-1", INFO, best or "no best trial with a validation")],
                      headline, [line for name, r in results.items() for line in [f"{name}: {r.message}", *r.details]])


@check("TP3.5 samplers side by side")
def samplers(studies: dict):
    """Each study ({sampler: study}, one space and one budget) searched, on the same budget, and a grid study never
    tried one grid point twice."""
    def grid_points(table):
        for name, study in studies.items():
            points = [tuple(sorted(t.params.items())) for t in study.trials if t.params]
            if type(study.sampler).__name__ == "GridSampler":
                yield part(f"{name} points", PASSED if len(set(points)) == len(points) else FAILED,
                           f"{len(set(points))} distinct grid points over {len(points)} trials")

    return _side_by_side(studies, f"{len(studies)} samplers on one budget, each searched", grid_points)


@check("TP3.5 pruners side by side")
def pruners(studies: dict):
    """Each study ({pruner name: study}, one sampler's seed, one space and one budget) searched, under pruners of
    different kinds, and drew the same options in the same order (so that only the pruner differs); what each
    pruner stopped and the epochs it spent are reported."""
    def pruning(table):
        kinds = {name: type(study.pruner).__name__ for name, study in studies.items()}
        distinct = len(set(kinds.values())) == len(kinds)
        yield part("pruners", PASSED if distinct else FAILED,
                   ", ".join(f"{name}: {kind}" for name, kind in kinds.items())
                   + ("" if distinct else ": two studies under one kind of pruner"))
        draws = {name: [tuple(sorted(t.params.items())) for t in study.trials] for name, study in studies.items()}
        shortest = min(len(d) for d in draws.values())
        same = len({tuple(d[:shortest]) for d in draws.values()}) == 1
        yield part("same draws", PASSED if same else INFO,
                   f"the first {shortest} trials drew the same options in every study" if same else
                   "the studies drew different options (a study resumed after a stop draws on from its seed): "
                   "the comparison mixes the pruners' effect with the draws'")
        sources = {study.user_attrs.get("replayed_from") for study in studies.values()}
        replayed = sources != {None}
        if replayed:  # hpo.replay: the pruners judged the same trained curves
            one = len(sources) == 1 and None not in sources
            source = min(sources, key=str)
            yield part("same curves", PASSED if one else INFO,
                       f"every pruner replayed the trials of study {source!r}, each trained to its last epoch once: "
                       "only the pruner differs" if one else
                       "the studies replayed different runs: the comparison mixes the pruners' effect with the runs'")
        if replayed:
            yield part("had they run on", INFO, "; ".join(_stopped_finals(name, study) for name, study in studies.items()))
        yield part("stopped", INFO, "; ".join(f"{r.study}: {r.pruned} of {r.trials} pruned, {r.epochs_run} epochs "
                                              f"{'it would have run' if replayed else 'run'}"
                                              for r in table.itertuples()))

    return _side_by_side(studies, f"{len(studies)} pruners on the same draws and budget", pruning)


def _stopped_finals(name: str, study) -> str:
    """On a replay: where the stopped trials' runs ended, beside the best completed trial (one run each: read, not
    ranked)."""
    finals = {t.number: t.user_attrs["full_curve"][max(t.user_attrs["full_curve"], key=int)]
              for t in study.trials if t.state.name == "PRUNED" and t.user_attrs.get("full_curve")}
    done = [t.value for t in study.trials if t.state.name == "COMPLETE" and t.value is not None]
    if not finals:
        return f"{name}: stopped no trial"
    best = f", the best completed {max(done):.3f}" if done else ""
    return (f"{name}: its stopped trials' runs ended at " + ", ".join(f"{v:.3f} (trial {n})" for n, v in finals.items())
            + best)


@check("TP3.3 compilation")
def compilation(job_id):
    """The compile variants really compiled (an OptimizedModule that produced graphs), agree with eager, and
    recorded their compile time apart from their step time."""
    run, problem = load_last(job_id)
    if problem:
        return problem
    results = run.lines("compile_result")
    if results.empty:
        return failed(f"run {run.run_id} recorded no compile_result line: was it compile_bench.py?")
    compiles = results[results["variant"].astype(str).str.contains("compile")]
    details = [f"{r.part}/{r.variant}: {r.status}" + (f", compile {r.t_compile:.2f} s, step {1e3 * r.t_step:.3g} ms, "
                                                      f"compiled {r.compiled}, graphs {r.graphs}"
                                                      if r.status == "ok" else f" ({r.reason})")
               for r in results.itertuples()]
    if run.summary.get("compile_unavailable"):
        return not_applicable(f"torch.compile cannot run here: {run.summary['compile_unavailable']}", details)
    ran = compiles[compiles["status"] == "ok"]
    if ran.empty:
        return failed(f"no compile variant of run {run.run_id} ran ({', '.join(compiles['status'].astype(str))})",
                      details)
    not_compiled = ran[~ran["compiled"].astype(bool) | (ran["graphs"].fillna(0) <= 0)]
    if len(not_compiled):
        row = not_compiled.iloc[0]
        return failed(f"{row['part']}/{row['variant']} ran uncompiled (no graph): compile_with must call "
                      "torch.compile (TODO TP3.3 in compile_bench.py)", details)
    disagree = ran[~ran["agrees"].astype(bool)]
    code = part("compiled", PASSED, f"{len(ran)} compiled variant(s), each with its own graphs")
    same = part("same results", FAILED if len(disagree) else PASSED,
                f"{len(disagree)} variant(s) differ from eager" if len(disagree) else
                "every compiled variant agrees with eager (largest |Δ|: " + ", ".join(
                    f"{name} {rows['max_abs_diff'].max():.2g}" for name, rows in ran.groupby("part", sort=False)) + ")")
    timing = part("compile time apart", PASSED if ran["t_compile"].notna().all() else FAILED,
                  "compile time recorded apart from the steady step time")
    return from_parts([code, same, timing], "compiled, same results as eager, compile time measured apart", details)


@check("TP3.4 storage formats")
def storage(job_id):
    """Every format gave the same samples (the read benchmark's pixel sum and image count agree across formats
    for each worker count) and every format was read."""
    run, problem = load_last(job_id)
    if problem:
        return problem
    reads = run.lines("read_result")
    if reads.empty:
        return failed(f"run {run.run_id} recorded no read_result line: was it read_bench.py?")
    details = [f"{r.format}, {r.num_workers} workers: {r.images} images, {r.images_per_s:.0f} img/s"
               + (f" [{r.low:.0f}–{r.high:.0f}] over {r.repeats} reads" if pd.notna(r.low) else "")
               + f", pixel sum {r.pixel_sum}" for r in read_table(run.run_id, run.path.parent).itertuples()]
    formats = sorted(reads["format"].unique())
    for workers, group in reads.groupby("num_workers"):
        if group["pixel_sum"].nunique() > 1 or group["images"].nunique() > 1:
            return failed(f"with {workers} workers the formats did not yield the same samples "
                          f"({dict(zip(group['format'], group['pixel_sum']))}): read each format's whole split (a part "
                          "holds different images in each format's order); if they still differ, convert again "
                          "with data/convert_formats.py --force, then --verify", details)
    return passed(f"{', '.join(formats)} yield the same samples; {fastest_read(run.run_id, run.path.parent)}", details)
