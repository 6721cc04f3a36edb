"""The week's thread: what each day chose, carried into the command lines of the days after it.

Day 1 keeps the precision, the batch and the memory layout its measurements showed best; Day 2 keeps the
DataLoader settings; Day 3 the optimiser and its learning rate (with the batch it was set for and the rule that
scales it to another batch, the warm-up and the schedule). A day saves a choice with `day.remember(amp="bf16")`
in the student's course notes
(`<runs>/course-notes-<nickname>.json`). A later day asks for them, `setup_day(..., carry_from=[1, 2])`: the
set-up cell prints what it carries ("from Day 1: bf16, batch 64, channels_last"), and every `day.command()`
starts from those options. A TP's own options win where they name the same option (`--amp none`,
`--no-channels-last`). A choice that was never saved is said so, and the script's default is used.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Choice:
    key: str                                 # its name in the course notes
    day: int                                 # the day whose measurement makes it
    options: Callable[[object], list[str]]   # the training script's options that repeat it
    shown: Callable[[object], str]           # how the set-up cell prints it ("" : nothing to print)


def _loader_shown(options) -> str:
    values = dict(option_groups(options))
    workers = values.get("--num-workers", ["0"])[0]
    words = [f"{workers} DataLoader worker{'' if workers == '1' else 's'}"]
    words += [word for flag, word in (("--pin-memory", "pinned memory"), ("--non-blocking", "non-blocking copies"),
                                      ("--persistent-workers", "persistent workers")) if flag in values]
    if "--prefetch-factor" in values:
        words.append(f"prefetch {values['--prefetch-factor'][0]}")
    return ", ".join(words)


def _optimizer_options(chosen: dict) -> list[str]:
    return [word for key, value in chosen.items() for word in ("--" + key.replace("_", "-"), str(value))]


def _optimizer_shown(chosen: dict) -> str:
    if not chosen:
        return "nothing kept (TP3.1's SGD training did not finish): the script's optimiser"
    words = [f"{chosen['optimizer']}, lr {float(chosen['lr']):.3g}"]
    if chosen.get("lr_scaling", "none") != "none":
        words[0] += f" at batch {chosen['base_batch_size']} ({chosen['lr_scaling']} scaling to another batch)"
    if float(chosen.get("warmup_epochs") or 0):
        words.append(f"{float(chosen['warmup_epochs']):g} warm-up epoch(s)")
    if chosen.get("lr_schedule"):
        words.append(f"{chosen['lr_schedule']} schedule")
    return ", ".join(words)


CHOICES = (
    Choice("amp", 1, lambda v: ["--amp", str(v)], lambda v: {"none": "fp32"}.get(v, str(v))),
    Choice("tf32", 1, lambda v: ["--tf32"] if v else [], lambda v: "TF32" if v else ""),
    Choice("batch_size", 1, lambda v: [], lambda v: f"batch {v}"),  # the day's batch_size: it is in every command
    Choice("channels_last", 1, lambda v: ["--channels-last"] if v else [], lambda v: "channels_last" if v else "NCHW"),
    Choice("loader", 2, lambda v: [str(o) for o in v], lambda v: _loader_shown(v) if v else "no DataLoader workers"),
    Choice("optimizer", 3, _optimizer_options, _optimizer_shown),
)
DEFAULTS = {1: "fp32, NCHW and the day's batch", 2: "no DataLoader workers",  # the script's, when nothing is saved
            3: "SGD at its default learning rate"}


# Day 4's train_llm.py computes in fp32 or bf16 (--dtype) and takes --tf32: Day 1's precision in its words.
# Day 1's fp16 has no counterpart there (no loss scaling in that script): it runs fp32.
LLM_PRECISION = {"bf16": ["--dtype", "bf16"]}


def llm_carried_options(notes: dict, days) -> list[str]:
    """train_llm.py's options that repeat Day 1's precision (its batch and memory layout are the images')."""
    if 1 not in days:
        return []
    return LLM_PRECISION.get(notes.get("amp"), []) + (["--tf32"] if notes.get("tf32") else [])


def llm_describe(notes: dict, days) -> list[str]:
    """What Day 1's precision becomes on train_llm.py, under describe()'s lines."""
    if 1 not in days or "amp" not in notes:
        return []
    options = llm_carried_options(notes, days)
    said = shlex.join(options) if "--dtype" in options else ", ".join(["fp32, its default", *options])
    said += " (it has no fp16)" if notes["amp"] == "fp16" else ""
    return [f"  on train_llm.py: {said}"]


def option_groups(argv) -> list[tuple[str, list[str]]]:
    """['--amp', 'bf16', '--channels-last'] -> [('--amp', ['bf16']), ('--channels-last', [])]."""
    groups = []
    for word in map(str, argv):
        if word.startswith("--"):
            groups.append((word, []))
        elif groups:
            groups[-1][1].append(word)
    return groups


def carried_options(notes: dict, days) -> list[str]:
    """The options that repeat what `days` chose, in the notes."""
    chosen = [choice for choice in CHOICES if choice.day in days and choice.key in notes]
    return [option for choice in chosen for option in choice.options(notes[choice.key])]


def without_overridden(carried: list[str], options) -> list[str]:
    """`carried` less each option that `options` names itself (or switches off with --no-...)."""
    named = {name for name, _ in option_groups(options)}
    named |= {"--" + name[len("--no-"):] for name in named if name.startswith("--no-")}
    return [word for name, values in option_groups(carried) if name not in named for word in (name, *values)]


def describe(notes: dict, days) -> list[str]:
    """One line per day carried: what it chose, or that it saved nothing (and what the script then does)."""
    lines = []
    for day in sorted(days):
        saved = [choice for choice in CHOICES if choice.day == day and choice.key in notes]
        if saved:
            shown = [choice.shown(notes[choice.key]) for choice in saved]
            lines.append(f"  from Day {day}: {', '.join(s for s in shown if s)}")
        else:
            lines.append(f"  from Day {day}: nothing saved yet (run Day {day}'s notebook to choose): "
                         f"the script's defaults ({DEFAULTS.get(day, 'its own')})")
    return lines
