"""The race form: the choices a student makes, turned into the training script's options.

    form = race_form(day)        # ipywidgets: sizes, optimiser and LR (scaling, warm-up, schedule), augmentation,
                                 # precision, layout, compile, loader, memory levers
    form                         # shown in the notebook
    options = form.options()     # ['--image-size', '64', '--batch-size', '16', ...], checked by the script's parser

The optimiser, schedule, precision and augmentation choices are read from the script's own parser
(tp_scripts/common/train_options.py), so the form offers exactly what the script accepts. The precision, memory
layout, DataLoader and optimiser fields start from what the week chose (the day's `carried` options: Day 1, Day 2,
Day 3). The memory levers keep a batch that does not fit, at the price of time: `--grad-accum K` runs each GPU's
batch as K micro-batches (the memory of one, K smaller passes), `--activation-checkpointing` recomputes each residual
block in backward (less memory, one forward more); train_classifier.py runs both through the student's own TP1.5 code
(fit_levers.py), and race.planner costs them from what the test job's record shows ran (step_cost, levers_ran). A
script without these options has them greyed.
"""
from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path

from ..script_modules import common_module
from ..submission.week import option_groups

FIELDS = ("image_size", "batch_size", "optimizer", "lr", "base_batch_size", "lr_scaling", "warmup_epochs",
          "lr_schedule", "weight_decay", "label_smoothing", "augment", "amp", "tf32", "channels_last", "compile",
          "num_workers", "pin_memory", "non_blocking", "prefetch_factor", "persistent_workers", "grad_accum",
          "activation_checkpointing")
FLAGS = ("tf32", "channels_last", "compile", "pin_memory", "non_blocking", "persistent_workers",
         "activation_checkpointing")  # --x or --no-x
VALUED = ("optimizer", "base_batch_size", "lr_scaling", "warmup_epochs", "lr_schedule", "label_smoothing", "amp",
          "num_workers", "prefetch_factor", "grad_accum")  # given as --x VALUE when the script has the option
LEVERS = ("grad_accum", "activation_checkpointing")


def option_of(field: str) -> str:
    """The script's option for a form field: 'channels_last' -> '--channels-last'."""
    return "--" + field.replace("_", "-")


def options_module(script: str | Path):
    """common/train_options.py of a training script's folder (yours, or the solution's)."""
    return common_module(Path(script).parent, "train_options")


def _action(parser: argparse.ArgumentParser, option: str):
    return next((a for a in parser._actions if option in a.option_strings), None)


def choices(parser: argparse.ArgumentParser, option: str) -> tuple:
    """The values the script accepts for an option ((): it has no such option)."""
    action = _action(parser, option)
    return tuple(action.choices or ()) if action is not None else ()


def default(parser: argparse.ArgumentParser, option: str, fallback):
    """The script's own default for an option (`fallback` when it has no such option)."""
    action = _action(parser, option)
    return action.default if action is not None and action.default is not None else fallback


def race_options(parser: argparse.ArgumentParser, *, image_size: int, batch_size: int, lr: float,
                 weight_decay: float, augment=("none",), **chosen) -> list[str]:
    """The script options for these choices (a field of VALUED: its value, or None to leave it out; a flag of FLAGS:
    True, False, or None); ValueError with the script's own message when it would refuse one."""
    augment = [augment] if isinstance(augment, str) else list(augment or ["none"])
    options = ["--image-size", str(int(image_size)), "--batch-size", str(int(batch_size)), "--lr", repr(float(lr)),
               "--weight-decay", repr(float(weight_decay)), "--augment", ",".join(augment) or "none"]
    for name, value in chosen.items():
        if name not in VALUED + FLAGS:
            raise TypeError(f"race_options: unknown choice {name!r}")
        if value is None:
            continue
        if _action(parser, option_of(name)) is None:
            raise ValueError(f"{option_of(name)} {value}: this training script has no {option_of(name)} option")
        if name in FLAGS:  # off: --no-x where the script has it (a store_true flag is off when left out)
            options += [option_of(name)] if value else [option_of("no_" + name)] if _action(
                parser, option_of("no_" + name)) else []
        else:
            options += [option_of(name), str(value)]
    if int(batch_size) < 2 or int(image_size) < 32:
        raise ValueError("batch size must be at least 2 (BatchNorm) and image size at least 32 px")
    accumulation = int(chosen.get("grad_accum") or 1)
    if int(batch_size) % accumulation or int(batch_size) // accumulation < 2:
        raise ValueError(f"accumulation steps {accumulation}: the batch of {batch_size} per GPU must split into "
                         f"{accumulation} micro-batches of 2 images or more (BatchNorm)")
    if not float(lr) > 0 or float(weight_decay) < 0:
        raise ValueError(f"learning rate must be positive and weight decay not negative (lr {lr}, wd {weight_decay})")
    messages = io.StringIO()
    try:
        with contextlib.redirect_stderr(messages):
            parser.parse_args([*options, "--data", "synthetic"])
    except SystemExit:
        error = [line for line in messages.getvalue().splitlines() if "error:" in line]
        raise ValueError(error[-1] if error else messages.getvalue().strip()) from None
    return options


class RaceForm:
    """The widgets of the race form; `options()` reads them. Shown when it is a cell's value."""

    def __init__(self, parser: argparse.ArgumentParser, augmentations=("none", "randaugment", "mixup", "cutmix"), *,
                 image_size: int = 64, batch_size: int = 16, lr: float = 0.1, weight_decay: float = 5e-5,
                 carried=()):
        import ipywidgets as widgets

        self.parser = parser
        style = {"description_width": "150px"}
        optimizers, schedules = choices(parser, "--optimizer"), choices(parser, "--lr-schedule")
        precisions, scalings = choices(parser, "--amp"), choices(parser, "--lr-scaling")
        week = dict(option_groups(carried))  # what the earlier days chose: the start of the precision and loader fields

        def chosen(option, fallback):
            return week[option][0] if week.get(option) else default(parser, option, fallback)

        def flag(name, description):
            return widgets.Checkbox(value=option_of(name) in week, description=description, style=style,
                                    disabled=_action(parser, option_of(name)) is None)
        self.fields = {
            "image_size": widgets.BoundedIntText(value=image_size, min=32, max=1024, step=16,
                                                 description="image size (px)", style=style),
            "batch_size": widgets.BoundedIntText(value=batch_size, min=2, max=65536, description="batch per GPU",
                                                 style=style),
            "optimizer": widgets.Dropdown(options=optimizers or ["sgd"], value=chosen("--optimizer", "sgd"),
                                          description="optimiser", style=style, disabled=not optimizers),
            "lr": widgets.FloatLogSlider(value=float(chosen("--lr", lr)), base=10, min=-5, max=1, step=0.1,
                                         description="learning rate", readout_format=".1e", style=style),
            "base_batch_size": widgets.BoundedIntText(value=int(chosen("--base-batch-size", 256)), min=1, max=65536,
                                                      description="... set for batch", style=style),
            "lr_scaling": widgets.Dropdown(options=scalings or ["none"], value=chosen("--lr-scaling", "none"),
                                           description="LR scaling", style=style, disabled=not scalings),
            "warmup_epochs": widgets.BoundedFloatText(value=float(chosen("--warmup-epochs", 0)), min=0, max=100,
                                                      step=0.5, description="warm-up epochs", style=style),
            "lr_schedule": widgets.Dropdown(options=schedules or ["onecycle"], value=chosen("--lr-schedule", "onecycle"),
                                            description="LR schedule", style=style, disabled=not schedules),
            "weight_decay": widgets.FloatText(value=weight_decay, description="weight decay", style=style),
            "label_smoothing": widgets.BoundedFloatText(value=float(chosen("--label-smoothing", 0.0)), min=0, max=0.5,
                                                        step=0.05, description="label smoothing", style=style),
            "augment": widgets.SelectMultiple(options=list(augmentations), value=["none"],
                                              description="augmentation", style=style),
            "amp": widgets.Dropdown(options=precisions or ["none"], value=chosen("--amp", "none"),
                                    description="mixed precision", style=style, disabled=not precisions),
            "tf32": flag("tf32", "TF32 (GPU)"),
            "channels_last": flag("channels_last", "channels_last"),
            "compile": flag("compile", "torch.compile"),
            "num_workers": widgets.BoundedIntText(value=int(chosen("--num-workers", 0)), min=0, max=64,
                                                  description="DataLoader workers", style=style),
            "pin_memory": flag("pin_memory", "pinned memory"),
            "non_blocking": flag("non_blocking", "non-blocking copies"),
            "prefetch_factor": widgets.BoundedIntText(value=int(chosen("--prefetch-factor", 2)), min=1, max=64,
                                                      description="prefetch factor", style=style),
            "persistent_workers": flag("persistent_workers", "persistent workers"),
            "grad_accum": widgets.BoundedIntText(value=int(chosen("--grad-accum", 1)), min=1, max=64,
                                                 description="accumulation steps", style=style,
                                                 disabled=_action(parser, "--grad-accum") is None),
            "activation_checkpointing": flag("activation_checkpointing", "activation checkpointing"),
        }
        self._has = {name: _action(parser, option_of(name)) is not None for name in VALUED + FLAGS}
        self._has.update({"optimizer": bool(optimizers), "lr_schedule": bool(schedules), "amp": bool(precisions),
                          "lr_scaling": bool(scalings)})
        missing = [option_of(name) for name in LEVERS if not self._has[name]]
        self.greyed = f"greyed: this training script has no {' or '.join(missing)} option" if missing else ""
        self.message = widgets.HTML(self.greyed)
        self.box = widgets.VBox([*self.fields.values(), self.message])

    def values(self) -> dict:
        values = {name: widget.value for name, widget in self.fields.items()}
        for name, present in self._has.items():
            if not present:
                values[name] = None
        values["augment"] = [a for a in values["augment"] if a != "none" or len(values["augment"]) == 1]
        return values

    def options(self) -> list[str]:
        """The script options of the current choices (ValueError, also shown under the form, if refused)."""
        try:
            options = race_options(self.parser, **self.values())
        except ValueError as error:
            self.message.value = f"<b style='color:#cf222e'>{error}</b>"
            raise
        values = self.values()
        k = values["grad_accum"] or 1
        effective = "" if k == 1 else (f"<br>each step: {values['batch_size']} images per GPU in {k} micro-batches of "
                                       f"{values['batch_size'] // k} (the memory of one)")
        self.message.value = f"<code>{' '.join(options)}</code>{effective}" + (f"<br>{self.greyed}" if self.greyed else "")
        return options

    def _ipython_display_(self):
        from IPython.display import display

        display(self.box)


def race_form(day, **defaults) -> RaceForm:
    """The form for this day's training script; defaults from the day (image size, batch, and what the earlier
    days chose) unless given."""
    defaults = {"image_size": day.image_size, "batch_size": day.batch_size, "carried": day.carried, **defaults}
    module = options_module(day.script)
    return RaceForm(module.build_parser(), getattr(module, "AUGMENTATIONS", ("none",)), **defaults)
