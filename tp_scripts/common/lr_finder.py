"""--lr-finder in train_classifier.py: the LR range test instead of training (TP3.2 writes the test itself, in your
lr_range_test.py; TP3.1 the optimisers, in your optim_setup.py). The script hands both modules in: this shared
module never imports a file you edit.

A module shared by tp_scripts/train_classifier.py (yours) and tp_scripts/solutions/train_classifier.py:
not part of any TP.
"""
from __future__ import annotations

import copy
from functools import partial


def find_lr(t, ins, optim_setup, lr_range_test) -> None:
    """Log-spaced learning rates, each trained on the same first batches from the same initial weights
    (lr_range_test.lr_range_test), for each optimiser of --lr-finder-optimizers; one 'lr_trial' record line per
    trial, the suggestions in the summary (--optimizer's at its top level)."""
    args = t.args
    batches = lr_range_test.first_batches(t.data.train_loader, args.lr_finder_steps, t.device, args.channels_last)
    lrs = lr_range_test.log_spaced(args.lr_finder_min, args.lr_finder_max, args.lr_finder_trials)
    start = copy.deepcopy(t.raw_model.state_dict())  # every optimiser's test starts from these weights

    def make_optimizer(name: str, lr: float):
        return optim_setup.build_optimizer(name, t.raw_model.parameters(), lr, args.momentum, args.weight_decay)

    def record(name: str, trial: dict) -> None:
        ins.log("lr_trial", optimizer=name, **trial)
        first, smoothed = (float("nan") if trial[k] is None else trial[k] for k in ("first_loss", "smoothed_loss"))
        t.say(f"{name} trial {trial['trial'] + 1:2d}/{len(lrs)} | lr {trial['lr']:.2e} | first loss {first:.4f} | "
              f"smoothed loss {smoothed:.4f}" + (" | diverged" if trial["diverged"] else ""))

    by_optimizer, steps = {}, 0
    for name in args.lr_finder_optimizers:
        t.raw_model.load_state_dict(start)
        trials = lr_range_test.lr_range_test(t.model, partial(make_optimizer, name), batches, t.criterion,
                                             t.amp_dtype, lrs, seed=args.seed, on_trial=partial(record, name))
        found = by_optimizer[name] = lr_range_test.suggest_lr(trials)
        steps += sum(trial["steps"] for trial in trials)
        if found["lr_finder_no_descent"]:
            t.say(f"{name}: no descent seen: the lowest loss is the smallest lr's ({_g(found['lr_finder_min_loss_lr'])}); "
                  "no suggestion (more --lr-finder-steps per trial, or a lower --lr-finder-min)")
        t.say(f"{name}: suggested lr {_g(found['lr_finder_suggested_lr'])} (rule {found['lr_finder_rule']}; "
              f"steepest descent at {_g(found['lr_finder_steepest_lr'])}); first losses differ by "
              f"{_g(found['lr_finder_first_loss_spread'])} (relative)")
    ins.finish(steps=steps, epochs=0, **by_optimizer[args.optimizer], lr_finder_optimizers=list(by_optimizer),
               lr_finder_by_optimizer=by_optimizer)


def _g(value) -> str:
    return "none" if value is None else f"{value:.3g}"
