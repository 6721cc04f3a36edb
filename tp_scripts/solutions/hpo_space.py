"""The hyper-parameter search space of TP3.5: which training options an Optuna trial chooses.

A space is a plain dict, one entry per option of train_classifier.py (name as in `--name`, with `_`):

    SPACE = {"lr": ("log", 0.01, 1.0),                  # log-uniform: a factor matters, not a difference
             "weight_decay": ("log", 1e-6, 1e-3),
             "batch_size": ("categorical", [16, 32, 64]),
             "label_smoothing": ("float", 0.0, 0.2)}     # uniform
    trial_options(trial, SPACE)   # -> ['--lr', '0.0316...', '--weight-decay', '2.1...e-05', '--batch-size', '32', ...]

Kinds: "log" and "float" (a real number between two bounds, on a log or a linear scale), "int"
(an integer between two bounds), "categorical" (one of a list; True/False become a flag or nothing).
dlokit.hpo.run_study calls `trial_options` once per trial and appends the options to the job's command
line (the last value of an option wins). `grid(space)` lists the values a grid search tries.
"""
from __future__ import annotations

SPACE = {
    "lr": ("log", 0.01, 1.0),
    "weight_decay": ("log", 1e-6, 1e-3),
    "batch_size": ("categorical", [16, 32, 64]),
    "label_smoothing": ("float", 0.0, 0.2),
}
KINDS = ("log", "float", "int", "categorical")


def check_space(space: dict) -> None:
    """A ValueError naming the entry when one is not (kind, low, high) or ("categorical", [choices])."""
    for name, entry in space.items():
        kind = entry[0] if isinstance(entry, (tuple, list)) and entry else None
        if kind not in KINDS:
            raise ValueError(f"search space entry {name!r}: {entry!r} should start with a kind among {KINDS}")
        if kind == "categorical":
            if len(entry) != 2 or not isinstance(entry[1], (list, tuple)) or not entry[1]:
                raise ValueError(f"search space entry {name!r}: write ('categorical', [choice, ...])")
        elif len(entry) != 3 or not entry[1] < entry[2] or (kind == "log" and entry[1] <= 0):
            raise ValueError(f"search space entry {name!r}: write ({kind!r}, low, high) with low < high"
                             + (" and low > 0" if kind == "log" else ""))


def suggest(trial, space: dict = SPACE) -> dict:
    """The value of each option of the space for this trial: {name: value}."""
    check_space(space)
    values = {}
    for name, (kind, *bounds) in space.items():
        # >>> SOLUTION TP3.5: ask the trial: its sampler picks each value (and the study records it in trial.params)
        if kind == "categorical":
            values[name] = trial.suggest_categorical(name, bounds[0])
        elif kind == "int":
            values[name] = trial.suggest_int(name, bounds[0], bounds[1])
        else:
            values[name] = trial.suggest_float(name, bounds[0], bounds[1], log=kind == "log")
        # --- STUDENT
        # values[name] = bounds[0][0] if kind == "categorical" else bounds[0]  # the same value in every trial
        # <<< SOLUTION
    return values


def as_options(values: dict) -> list[str]:
    """{'lr': 0.03, 'batch_size': 32, 'channels_last': True}
    -> ['--lr', '0.03', '--batch-size', '32', '--channels-last']"""
    options = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            options += [flag] if value else []
        else:
            options += [flag, str(value)]  # all the digits: the job runs with the value the study records
    return options


def trial_options(trial, space: dict = SPACE) -> list[str]:
    """The command-line options of this trial's job."""
    return as_options(suggest(trial, space))


def grid(space: dict = SPACE, points: int = 3) -> dict:
    """The values a grid search tries: every choice of a categorical entry, `points` values spread over a range
    (geometrically for "log"). Give it to dlokit.hpo.open_study(..., sampler="grid", search_space=...)."""
    check_space(space)
    if isinstance(points, bool) or not isinstance(points, int) or points < 1:
        raise ValueError(f"points must be a whole number >= 1, not {points!r}")
    values = {}
    for name, (kind, *bounds) in space.items():
        if kind == "categorical":
            values[name] = list(bounds[0])
            continue
        low, high = bounds
        shares = [i / (points - 1) for i in range(points)] if points > 1 else [0.0]
        if kind == "log":
            spread = [low * (high / low) ** share for share in shares]
        else:
            spread = [low + (high - low) * share for share in shares]
        if kind == "int":
            values[name] = sorted({round(value) for value in spread})
        else:  # 4 digits read better in a table; kept inside the bounds
            values[name] = list(dict.fromkeys(min(high, max(low, float(f"{value:.4g}"))) for value in spread))
    return values
