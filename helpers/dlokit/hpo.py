"""A hyper-parameter study whose trials are course jobs (Optuna's ask/tell, the kit's queue, a journal file).

    space = dlokit.hpo.load_space(SCRIPTS)                   # <SCRIPTS>/hpo_space.py: the TP3.5 search space
    study = dlokit.hpo.open_study("alice-lr", sampler="tpe", pruner="hyperband")
    dlokit.hpo.run_study(study, space.trial_options, day.command(epochs=4), n_trials=8, name=day.nickname)
    dlokit.hpo.trials_table(study)                           # one row per trial: state, value, params, job
    dlokit.hpo.figures(study)                                # Optuna's own matplotlib plots

Each trial is one job of the training script submitted through the kit, its command line followed by the
options `make_options(trial)` chose. While the jobs run, this loop (in the notebook) reads each job's run
record, reports the validation metric of every new epoch to its trial (`trial.report(value, epochs done)`)
and, when the pruner says so, cancels the job (dlokit.cancel) and marks the trial PRUNED. A job that fails
(bad options, out of memory, time limit) makes a FAIL trial whose `outcome` user attribute says why.

The study lives in Optuna's journal file `<runs>/hpo/<study>.journal`: an append-only log of operations,
written under a lock file made by symlink(), which is atomic on NFS too, so several notebooks or jobs can
write one study on a shared filesystem (where SQLite's locks are not reliable).

Resuming: every trial records its job id (user attribute `job_id`) and the process that follows it
(`driver`). run_study called again, after a kernel died or a cell was interrupted, re-attaches the RUNNING
trials nobody follows any more: a job still running is followed to its end, a job that ended meanwhile is
completed or failed from its record, a job that is gone makes the trial FAIL with the reason; then new
trials go on until the study has n_trials. Two run_study calls on one study (two notebooks) share the
work: trials are asked under a lock, so the study never gets more than n_trials.

Speed is not what a study measures: submitted with alone=False, the trials share the machine (on the local
backend one GPU or one core each, side by side up to n_parallel; on Slurm without --exclusive). HPO
compares accuracies.
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import math
import os
import re
import shlex
import socket
import subprocess
import time
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
from optuna.trial import TrialState

from .in_job import shared_folders
from .submission.jobs import JobCard, all_cards, cancel, find_card, job_outcome
from .submission.profiles import current_profile
from .in_job.runrecord import is_number, read_metrics
from .submission.submit import gpu_jobs_submitter

optuna.logging.set_verbosity(optuna.logging.WARNING)  # this module prints one line per trial event instead

STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("hyperband", "successive-halving", "none")
VAL_FIELDS = ("val_acc", "val_acc5", "val_loss")  # what train_classifier.py logs in each epoch's "val" line
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)  # not WAITING (enqueued)
# TPE draws at random until this many trials have finished (Optuna's default, 10, and any number at or above a
# course-sized study's trials, would make every TPE trial a random one); drawn_by() says which trials its model chose
TPE_STARTUP_TRIALS = 2
STALE_S = 120.0  # a follower on another host whose heartbeat is older than this is taken for dead
QUIET_S = 30.0  # while waiting, a progress line at least this often


@dataclass
class _StudyFile:
    journal: Path
    grid_size: int | None  # grid sampler: how many points the grid has
    sampler: str  # "tpe", "random", "grid", or the class name of a sampler given as an object


_opened: "weakref.WeakKeyDictionary[optuna.Study, _StudyFile]" = weakref.WeakKeyDictionary()


# ---- the study ------------------------------------------------------------------------------------

def study_path(name: str, storage_dir: str | os.PathLike | None = None) -> Path:
    """`<storage_dir>/<name>.journal`; storage_dir defaults to the profile's runs folder + /hpo."""
    if not isinstance(name, str) or not STUDY_NAME.fullmatch(name):
        raise ValueError(f"study name {name!r}: use letters, digits, '_', '-' and '.' (at most 100, "
                         "not starting with '.' or '-'); it names a file")
    folder = Path(storage_dir) if storage_dir is not None else current_profile().runs / "hpo"
    return folder.expanduser().absolute() / f"{name}.journal"


def open_study(name: str, *, storage_dir=None, sampler="tpe", pruner="hyperband", direction: str = "maximize",
               search_space: dict | None = None, seed: int = 0, reduction_factor: int = 3,
               max_epochs: int | None = None) -> optuna.Study:
    """Create the study, or load it when its journal exists (a resumed notebook): an optuna.Study.

    sampler: "tpe", "random", "grid" (search_space = {param: [values]}, e.g. hpo_space.grid(SPACE)) or any
    optuna sampler. pruner: "hyperband", "successive-halving" (both from the first epoch on, keeping the best
    1/reduction_factor of the trials at each rung), "none" or any optuna pruner; max_epochs: the trials' epochs,
    from which Hyperband makes its brackets (None: Optuna's guess, from the first trial that completes). Samplers
    and pruners are not stored: give the same ones when a notebook reopens a study.
    """
    if direction not in ("maximize", "minimize"):
        raise ValueError(f"direction {direction!r}: 'maximize' (accuracy) or 'minimize' (loss)")
    path = study_path(name, storage_dir)
    shared_folders.shared_top(path.parent, "HPO studies")
    storage = JournalStorage(JournalFileBackend(str(path), lock_obj=JournalFileSymlinkLock(str(path))))
    chosen_pruner = _pruner(pruner, reduction_factor, max_epochs)
    study = optuna.create_study(storage=storage, study_name=name, direction=direction, load_if_exists=True,
                                sampler=optuna.samplers.RandomSampler(seed=seed), pruner=chosen_pruner)
    if study.direction.name.lower() != direction:
        raise ValueError(f"study {name!r} ({path}) was created to {study.direction.name.lower()}, not to "
                         f"{direction}: give that direction, or another study name")
    # a reopened study must not draw again what it drew before: the seed moves on with the trials made
    # (not for the grid, whose seed orders the grid points that the trials already hold by index)
    study.sampler = _sampler(sampler, search_space, seed if sampler == "grid" else seed + len(study.trials))
    grid_size = math.prod(len(v) for v in search_space.values()) if sampler == "grid" else None
    named = sampler if isinstance(sampler, str) else type(sampler).__name__
    _opened[study] = _StudyFile(path, grid_size, named)
    return study


def _sampler(sampler, search_space, seed: int) -> optuna.samplers.BaseSampler:
    if isinstance(sampler, optuna.samplers.BaseSampler):
        return sampler
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler {sampler!r}: one of {', '.join(SAMPLERS)}, or an optuna sampler")
    if sampler == "grid":
        if not isinstance(search_space, dict) or not search_space or not all(
                isinstance(v, (list, tuple)) and v for v in search_space.values()):
            raise ValueError("sampler='grid' needs search_space={param: [values, ...]}, e.g. "
                             "hpo_space.grid(SPACE, points=3)")
        return optuna.samplers.GridSampler({k: list(v) for k, v in search_space.items()}, seed=seed)
    if search_space is not None:
        raise ValueError(f"search_space is the grid of sampler='grid'; the {sampler} sampler takes its ranges "
                         "from the trial's suggest_* calls (make_options)")
    if sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=TPE_STARTUP_TRIALS)


def _pruner(pruner, reduction_factor: int = 3, max_epochs: int | None = None) -> optuna.pruners.BasePruner:
    if isinstance(pruner, optuna.pruners.BasePruner):
        return pruner
    if not isinstance(reduction_factor, int) or reduction_factor < 2:
        raise ValueError(f"reduction_factor {reduction_factor!r}: a whole number of at least 2 (each rung keeps "
                         "the best 1/reduction_factor of its trials)")
    if max_epochs is not None and (not isinstance(max_epochs, int) or max_epochs < 1):
        raise ValueError(f"max_epochs {max_epochs!r}: the trials' epochs, a whole number of at least 1, or None")
    if pruner in (None, "none"):
        return optuna.pruners.NopPruner()
    if pruner == "hyperband":  # steps are epochs: a bracket may stop a trial after its first epoch
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max_epochs or "auto",
                                              reduction_factor=reduction_factor)
    if pruner == "successive-halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=reduction_factor)
    raise ValueError(f"pruner {pruner!r}: one of {', '.join(PRUNERS)}, or an optuna pruner")


def load_space(scripts: str | os.PathLike):
    """The module `<scripts>/hpo_space.py` (the TP3.5 search space), freshly read: the notebook's SCRIPTS
    picks yours (../tp_scripts) or the reference (../tp_scripts/solutions)."""
    path = Path(scripts) / "hpo_space.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: SCRIPTS should be '../tp_scripts' (yours) or "
                                "'../tp_scripts/solutions'; regenerate yours with `python -m dlokit.material build`")
    spec = importlib.util.spec_from_file_location(f"hpo_space_{abs(hash(str(path.resolve())))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- who follows a trial --------------------------------------------------------------------------

def _process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' when it does not exist): a pid alone is recycled."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


class _Driver:
    """This process following trials of one study: its id, its heartbeat file and the study's lock."""

    def __init__(self, journal: Path):
        self.id = f"{socket.gethostname()}:{os.getpid()}:{_process_start(os.getpid())}"
        self.beats = Path(f"{journal}.drivers")  # one heartbeat file per follower
        self._lock = JournalFileSymlinkLock(str(self.beats))  # <study>.journal.drivers.lock

    def _beat_file(self, driver: str) -> Path:
        return self.beats / re.sub(r"[^A-Za-z0-9_.-]", "_", driver)

    def beat(self) -> None:
        self.beats.mkdir(parents=True, exist_ok=True)
        self._beat_file(self.id).touch()

    def leave(self) -> None:
        self._beat_file(self.id).unlink(missing_ok=True)

    def alive(self, driver: str) -> bool:
        """Is this follower still there? Same host: its process (same pid, same start); another host: its heartbeat."""
        if not driver:
            return False
        host, _, rest = str(driver).partition(":")
        pid, _, started = rest.partition(":")
        if host == socket.gethostname():
            return pid.isdigit() and bool(started) and _process_start(int(pid)) == started
        try:
            return time.time() - self._beat_file(driver).stat().st_mtime < STALE_S
        except OSError:
            return False

    @contextlib.contextmanager
    def locked(self):
        self.beats.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            yield
        finally:
            self._lock.release()


# ---- following one trial's job ---------------------------------------------------------------------

@dataclass
class _Followed:
    trial: optuna.trial.Trial
    job_id: str
    card: JobCard | None = None
    reported: set = field(default_factory=set)
    state: str = "PENDING"
    last: str = ""  # the last epoch's value, for the progress line
    adopted: bool = False  # re-attached: ask the pruner once even without a new epoch (it may have said so already)

    @property
    def number(self) -> int:
        return self.trial.number


def _val_values(card: JobCard, metric: str) -> list[tuple[int, float]]:
    """(epochs done, value) for each validation the job's rank 0 has logged so far."""
    records, _ = read_metrics(Path(card.run_dir) / "rank0" / "metrics.jsonl")
    return [(int(r["epoch"]) + 1, float(r[metric])) for r in records
            if r.get("kind") == "val" and is_number(r.get("epoch")) and is_number(r.get(metric))]


def _finish(study: optuna.Study, trial, state: TrialState, outcome: str, value: float | None = None) -> None:
    trial.set_user_attr("outcome", outcome[:2000])
    try:
        study.tell(trial, value) if state == TrialState.COMPLETE else study.tell(trial, state=state)
    except RuntimeError as error:
        # GridSampler.after_trial calls study.stop() once the grid is done, which Optuna allows only inside
        # study.optimize (not with ask/tell); the trial's state is stored before that raises
        if "Study.stop" not in str(error):
            raise


def _follow(study: optuna.Study, followed: _Followed, metric: str, say) -> bool:
    """Report the job's new epochs to its trial; prune, complete or fail the trial. True when it is finished."""
    trial, number = followed.trial, followed.number
    try:
        followed.card = followed.card or find_card(followed.job_id)
        outcome = job_outcome(followed.job_id)  # before the record: a finished job's record is complete
    except LookupError as error:
        _finish(study, trial, TrialState.FAIL, f"job {followed.job_id} is gone: {error}")
        say(f"trial {number}: FAIL, job {followed.job_id} is gone ({error})")
        return True
    followed.state = outcome.state + (f" ({outcome.cause})" if outcome.state == "PENDING" and outcome.cause else "")
    new = [(step, value) for step, value in _val_values(followed.card, metric) if step not in followed.reported]
    for step, value in new:
        trial.report(value, step)
        followed.reported.add(step)
        followed.last = f"epoch {step} {metric} {value:.4f}"
        say(f"trial {number} (job {followed.job_id}): {followed.last}")
    if not outcome.finished:
        ask_pruner, followed.adopted = bool(new) or (followed.adopted and bool(followed.reported)), False
        if ask_pruner and trial.should_prune():
            step = max(followed.reported)
            value = _last_value(study, number)
            trial.set_user_attr("pruned_at_epoch", step)  # before the cancel: a resumed loop knows who cancelled
            with contextlib.suppress(subprocess.SubprocessError, OSError, LookupError):
                cancel(followed.job_id, why=f"pruned by the study's pruner after epoch {step}")  # Slurm refuses
                # to cancel a job that has just ended: nothing to stop
            _finish(study, trial, TrialState.PRUNED, f"pruned after epoch {step} ({metric} {value:.4f}); "
                                                     f"job {followed.job_id} cancelled")
            say(f"trial {number}: PRUNED after epoch {step} ({metric} {value:.4f}): job {followed.job_id} cancelled")
            return True
        return False
    if outcome.state == "COMPLETED" and followed.reported:
        value = _last_value(study, number)
        _finish(study, trial, TrialState.COMPLETE, f"job {followed.job_id} COMPLETED", value)
        say(f"trial {number}: COMPLETE, {metric} {value:.4f} after {max(followed.reported)} epoch(s) "
            f"(job {followed.job_id}, {outcome.elapsed or '?'})")
    elif outcome.state == "CANCELLED" and "pruned_at_epoch" in _frozen(study, number).user_attrs:
        step = _frozen(study, number).user_attrs["pruned_at_epoch"]  # pruned by a loop that stopped before saying so
        _finish(study, trial, TrialState.PRUNED, f"pruned after epoch {step}; job {followed.job_id} cancelled")
        say(f"trial {number}: PRUNED after epoch {step} (job {followed.job_id} cancelled)")
    else:
        why = str(outcome) if outcome.state != "COMPLETED" else (
            f"job {followed.job_id} COMPLETED but its record has no validation {metric}: give the command "
            "--epochs N (a --test run does not validate)")
        _finish(study, trial, TrialState.FAIL, why)
        say(f"trial {number}: FAIL, {why}")
    return True


def _frozen(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
    return next(t for t in study.get_trials(deepcopy=False) if t.number == number)


def _last_value(study: optuna.Study, number: int) -> float:
    """The trial's value: its last reported epoch (the run's final validation)."""
    values = _frozen(study, number).intermediate_values
    return values[max(values)]


# ---- submitting and re-attaching ---------------------------------------------------------------------

def _as_options(chosen) -> list[str]:
    if isinstance(chosen, str):
        return shlex.split(chosen)
    if isinstance(chosen, (list, tuple)) and all(isinstance(o, (str, int, float)) for o in chosen):
        return [str(o) for o in chosen]
    raise TypeError(f"make_options(trial) returned {type(chosen).__name__} {chosen!r}: return the options as a "
                    "list of strings, e.g. ['--lr', '0.1', '--batch-size', '32']")


def _new_trial(study: optuna.Study, driver: _Driver, n_trials: int, grid_size: int | None):
    """A new trial, asked under the study's lock so that two notebooks never make more than n_trials; None when done."""
    with driver.locked():
        if _study_full(study, n_trials, grid_size):
            return None
        trial = study.ask()
        trial.set_user_attr("driver", driver.id)
    return trial


NOTHING_DRAWN = "no suggest_* call"  # the trial asked the sampler for nothing


TPE_START, TPE_MODEL = "random start-up", "TPE model"


def drawn_by(sampler: str, finished_before: int) -> str:
    """Who chooses the options of a trial asked when `finished_before` trials had finished (complete or pruned):
    TPE's model only after its random start-up (TPE_STARTUP_TRIALS), which Optuna counts in the same way."""
    if sampler == "tpe":
        return TPE_MODEL if finished_before >= TPE_STARTUP_TRIALS else TPE_START
    return {"grid": "grid point", "random": "random draw"}.get(sampler, sampler)


def _submit(study, trial, make_options, base: list[str], name: str, submit_options: dict, say) -> _Followed:
    finished = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))  # as TPE counts
    try:
        options = _as_options(make_options(trial))
    except Exception as error:  # the space is the student's code: fail this trial, show the error once
        _finish(study, trial, TrialState.FAIL, f"make_options raised {type(error).__name__}: {error}")
        raise
    trial.set_user_attr("drawn_by", drawn_by(_opened[study].sampler, finished) if trial.params else NOTHING_DRAWN)
    argv = [*base, *options]
    trial.set_user_attr("argv", argv)  # before submitting: a resumed loop finds the job by its command
    try:
        [job_id] = gpu_jobs_submitter(shlex.join(argv), name=name, wait=False, verbose=False, **submit_options)
    except Exception as error:  # refused before it ran (no such script, a layout the cluster cannot give)
        _finish(study, trial, TrialState.FAIL, f"not submitted: {type(error).__name__}: {error}")
        raise
    trial.set_user_attr("job_id", job_id)
    say(f"trial {trial.number}: job {job_id} submitted with {shlex.join(options) or '(no options)'}")
    return _Followed(trial, job_id)


def _submitted_job(study: optuna.Study, frozen) -> str | None:
    """The job of a trial whose follower stopped between submitting it and writing its id: same command, after
    the trial started, not another trial's job."""
    argv = frozen.user_attrs.get("argv")
    if not argv:
        return None
    taken = {t.user_attrs.get("job_id") for t in study.get_trials(deepcopy=False)}
    since = frozen.datetime_start.timestamp() - 1 if frozen.datetime_start else 0
    for card in all_cards():
        if card.argv == argv and card.submitted_at >= since and card.job_id not in taken:
            return card.job_id
    return None


def _adopt(study: optuna.Study, driver: _Driver, followed: dict, say) -> None:
    """Take over the RUNNING trials that no living process follows (a kernel that died, an interrupted cell)."""
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if frozen.number in followed:
            continue
        owner = frozen.user_attrs.get("driver", "")
        if owner != driver.id and driver.alive(owner):
            continue  # another notebook follows it
        with driver.locked():  # re-read under the lock: two notebooks must not adopt the same trial
            frozen = _frozen(study, frozen.number)
            if frozen.state != TrialState.RUNNING or frozen.user_attrs.get("driver", "") != owner:
                continue
            trial = optuna.trial.Trial(study, frozen._trial_id)  # a handle on a stored trial (as study.ask makes)
            trial.set_user_attr("driver", driver.id)
        job_id = frozen.user_attrs.get("job_id") or _submitted_job(study, frozen)
        if job_id is None:
            _finish(study, trial, TrialState.FAIL, "no job was submitted: the notebook stopped between choosing "
                                                   "this trial's options and submitting its job")
            say(f"trial {frozen.number}: FAIL, its job was never submitted")
            continue
        trial.set_user_attr("job_id", job_id)
        followed[frozen.number] = _Followed(trial, job_id, reported=set(frozen.intermediate_values), adopted=True)
        say(f"trial {frozen.number}: following job {job_id} again (it was left by {owner or 'an unknown process'})")


# ---- the loop ------------------------------------------------------------------------------------

def _check_run_arguments(make_options, command, n_trials, n_parallel, metric, poll_s, submit_options) -> None:
    if not callable(make_options):
        raise TypeError(f"make_options must be a function of the trial (e.g. space.trial_options), "
                        f"not {make_options!r}")
    if not isinstance(command, str) or not command.strip():
        raise ValueError("command: the training script's command line, e.g. day.command(epochs=3)")
    for label, value in (("n_trials", n_trials), ("n_parallel", n_parallel)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be a whole number >= 1, not {value!r}")
    if metric not in VAL_FIELDS:
        raise ValueError(f"metric {metric!r}: one of {', '.join(VAL_FIELDS)} (what the script logs after each epoch)")
    if not is_number(poll_s) or poll_s <= 0:
        raise ValueError(f"poll_s must be a number of seconds > 0, not {poll_s!r}")
    if isinstance(submit_options.get("n_gpu", 1), (list, tuple)):
        raise ValueError("n_gpu: one number of GPUs per trial's job (a list would make several jobs per trial)")
    known = set(inspect.signature(gpu_jobs_submitter).parameters) - {"command_or_list", "name", "verbose", "wait",
                                                                     "refresh_s", "ignored"}
    unknown = sorted(set(submit_options) - known)
    if unknown:
        raise TypeError(f"run_study: unknown option(s) {', '.join(unknown)}; "
                        f"the job options are {', '.join(sorted(known))}")


def replay(study: optuna.Study, pruner, *, reduction_factor: int = 3, max_epochs: int | None = None) -> optuna.Study:
    """What `pruner` would have stopped among `study`'s trials, each trained to its last epoch once (a study run
    with pruner="none"): a new in-memory study replays every trial's reported values, epoch by epoch and in the order
    the trials were made, under `pruner`. The same draws and the same curves: only the pruner differs, so several
    pruners compare on one training budget. A trial the pruner stops keeps the epochs reported up to there (what it
    would have spent) and its whole curve in the user attribute `full_curve` (what it would have reached); one it
    lets through keeps the run's value and job. A trial that did not complete in `study`
    is copied as it ended."""
    name = pruner if isinstance(pruner, str) else type(pruner).__name__
    replayed = optuna.create_study(study_name=f"{study.study_name}-replay-{name}",
                                   direction=study.direction.name.lower(),
                                   sampler=optuna.samplers.RandomSampler(seed=0),
                                   pruner=_pruner(pruner, reduction_factor, max_epochs))
    replayed.set_user_attr("metric", study.user_attrs.get("metric", "val_acc"))
    replayed.set_user_attr("replayed_from", study.study_name)
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    replayed.set_user_attr("trained_epochs", sum(len(t.intermediate_values) for t in trials))
    for source in trials:
        if source.state != TrialState.COMPLETE:
            replayed.add_trial(source)
            continue
        replayed.enqueue_trial(source.params)
        trial = replayed.ask(fixed_distributions=source.distributions)
        for key, value in source.user_attrs.items():
            trial.set_user_attr(key, value)
        for epoch in sorted(source.intermediate_values):
            trial.report(source.intermediate_values[epoch], epoch)
            if trial.should_prune():
                trial.set_user_attr("pruned_at_epoch", epoch)
                trial.set_user_attr("full_curve", {str(e): v for e, v in source.intermediate_values.items()})
                replayed.tell(trial, state=TrialState.PRUNED)
                break
        else:
            replayed.tell(trial, source.value)
    return replayed


def run_study(study: optuna.Study, make_options, command: str, *, n_trials: int = 4, n_parallel: int = 1,
              name: str = "hpo", metric: str = "val_acc", poll_s: float = 2.0, verbose: bool = True,
              **submit_options):
    """Run the study's trials as jobs until it has n_trials (COMPLETE, PRUNED or FAIL); returns trials_table(study).

    make_options(trial) -> the trial's options, appended to `command` (the training script's command line with
    --epochs: it validates after each epoch). At most n_parallel of this call's jobs are queued or running at
    once. name: the jobs' name (your nickname: the queue shows them). metric: the "val" field reported after
    each epoch (val_acc, val_acc5 or val_loss; open the study with direction="minimize" for the loss).
    Other keywords go to dlokit.gpu_jobs_submitter (n_gpu, time_max, partition, ...). Calling it again
    resumes: see the module's docstring. Interrupting the cell leaves the jobs running; a new call follows them.
    """
    _check_run_arguments(make_options, command, n_trials, n_parallel, metric, poll_s, submit_options)
    if study not in _opened:
        raise ValueError("open the study with dlokit.hpo.open_study(...): run_study needs its journal file")
    opened = _opened[study]
    try:
        base = shlex.split(command)
    except ValueError as error:
        raise ValueError(f"command {command!r} cannot be split into arguments: {error}") from None
    if study.user_attrs.get("metric") != metric:
        study.set_user_attr("metric", metric)
    say = (lambda line: print(line, flush=True)) if verbose else (lambda line: None)
    driver = _Driver(opened.journal)
    followed: dict[int, _Followed] = {}
    last_said = time.time()

    def said(line: str) -> None:
        nonlocal last_said
        last_said = time.time()
        say(line)

    try:
        while True:
            driver.beat()
            _adopt(study, driver, followed, said)
            while len(followed) < n_parallel:
                trial = _new_trial(study, driver, n_trials, opened.grid_size)
                if trial is None:
                    break
                followed[trial.number] = _submit(study, trial, make_options, base, name, submit_options, said)
            for number, one in list(followed.items()):
                if _follow(study, one, metric, said):
                    del followed[number]
            running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if not followed and not running and _study_full(study, n_trials, opened.grid_size):
                break
            if time.time() - last_said > QUIET_S:
                said(_progress(study, followed, running, n_trials))
            time.sleep(poll_s)
    except KeyboardInterrupt:
        if followed:
            say(f"interrupted: job(s) {', '.join(f.job_id for f in followed.values())} keep running; "
                "run_study again follows them (dlokit.cancel(job_id) stops one)")
        raise
    finally:
        driver.leave()
    say(_summary(study, metric))
    return trials_table(study)


def _study_full(study: optuna.Study, n_trials: int, grid_size: int | None) -> bool:
    """The study has its n_trials (or its whole grid, enqueued trials apart): no new trial."""
    trials = study.get_trials(deepcopy=False)
    made = [t for t in trials if t.state in COUNTED]
    grid_full = grid_size is not None and len({t.system_attrs.get("grid_id") for t in made}) >= grid_size
    return len(made) >= n_trials or (grid_full and not any(t.state == TrialState.WAITING for t in trials))


def _progress(study: optuna.Study, followed: dict, running: list, n_trials: int) -> str:
    done = sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))
    parts = [f"trial {f.number}: job {f.job_id} {f.state}" + (f", {f.last}" if f.last else "")
             for f in followed.values()]
    parts += [f"trial {t.number}: followed by {t.user_attrs.get('driver', '?')}" for t in running
              if t.number not in followed]
    return f"  ... {done}/{n_trials} trials done; " + "; ".join(parts or ["waiting"])


def _summary(study: optuna.Study, metric: str) -> str:
    trials = study.get_trials(deepcopy=False)
    counts = {s.name: sum(t.state == s for t in trials)
              for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    line = f"study {study.study_name}: {len(trials)} trials, " + ", ".join(f"{n} {s}" for s, n in counts.items())
    if counts["COMPLETE"]:
        best = study.best_trial
        line += f"; best: trial {best.number}, {metric} {best.value:.4f}, {best.params}"
    return line


# ---- what the study found ----------------------------------------------------------------------------

# short headers of the trials table (its footnote says what each stands for): it fits a notebook's output
TRIAL_LABELS = {"batch_size": "batch", "weight_decay": "wd", "label_smoothing": "ls", "epochs": "ep",
                "duration_s": "time_s"}


def trials_table(study: optuna.Study):
    """One row per trial: state, value (named after the metric), each parameter, epochs reported, who drew its
    options (drawn_by: a grid point, a random draw, TPE's random start-up or TPE's model), job id, duration and
    outcome (why it failed or was pruned; empty for a trial that completed). Shown in a notebook with short
    headers (TRIAL_LABELS) and each long outcome's first clause, its whole text footnoted."""
    import pandas as pd

    metric = study.user_attrs.get("metric", "value")
    rows = []
    for t in study.get_trials(deepcopy=False):
        rows.append({"trial": t.number, "state": t.state.name, metric: t.value, **t.params,
                     "epochs": len(t.intermediate_values), "drawn_by": t.user_attrs.get("drawn_by"),
                     "job_id": t.user_attrs.get("job_id"),
                     "duration_s": round(t.duration.total_seconds(), 1) if t.duration else None,
                     "outcome": "" if t.state == TrialState.COMPLETE else t.user_attrs.get("outcome", "")})
    columns = ["trial", "state", metric, "epochs", "drawn_by", "job_id", "duration_s", "outcome"]
    table = pd.DataFrame(rows, columns=list(dict.fromkeys(columns[:3] + [k for r in rows for k in r] + columns[3:])))
    table.attrs.update(labels=TRIAL_LABELS, footnoted=["outcome"])
    return table


def figures(study: optuna.Study) -> dict:
    """Optuna's own matplotlib plots: {'history', 'intermediate', 'importances'} -> Figure; a figure saying why
    when a plot cannot be drawn yet (no finished trial; importances need two complete trials that differ)."""
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as optuna_plots

    from .analysis.figures import message_figure

    plots = {"history": optuna_plots.plot_optimization_history, "intermediate": optuna_plots.plot_intermediate_values,
             "importances": optuna_plots.plot_param_importances}
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    made = {}
    for key, plot in plots.items():
        if key == "importances" and len(complete) < 2:
            made[key] = message_figure(f"parameter importances need 2 complete trials ({len(complete)} so far)",
                                       title=f"study {study.study_name}")
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                warnings.filterwarnings("ignore", module="optuna")  # e.g. "parameter importances will be equal"
                axes = plot(study)
        except (ValueError, RuntimeError) as error:
            made[key] = message_figure(f"{key}: {error}", title=f"study {study.study_name}")
            continue
        figure = axes.figure
        plt.close(figure)  # shown once, when the cell returns it
        made[key] = figure
    return made
