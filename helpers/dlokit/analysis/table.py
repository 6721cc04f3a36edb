"""runs_table: one tidy row per run, the common input of every comparison.

What is measured every step (throughputs, the phases' times) is the median of the run's settled steps, the value
compare_runs, the verdicts and the checks show (dlokit.analysis.stats); a run without step lines keeps its
summary's figure."""
from __future__ import annotations

import html
import math
import re
from typing import NamedTuple

import numpy as np
import pandas as pd

from dlokit.analysis import stats
from dlokit.analysis.run import Run, load_runs

CONFIG_ALIASES = {
    "name": ("name", "tag", "job_name"),
    "model": ("model", "arch"),
    "batch_size": ("batch_size", "per_gpu_batch_size", "local_batch_size"),
    "amp": ("amp", "amp_dtype", "precision", "dtype"),
    "channels_last": ("channels_last",),
    "workers": ("num_workers", "workers"),
    "pin_memory": ("pin_memory",),
    "non_blocking": ("non_blocking",),
    "prefetch_factor": ("prefetch_factor",),
    "persistent_workers": ("persistent_workers",),
    "drop_last": ("drop_last",),
    "image_size": ("image_size",),
    "compile": ("compile",),
}
SPLITS = ("t_data", "t_h2d", "t_forward", "t_backward", "t_optimizer", "t_metrics", "t_step")
COLUMNS = ("run_id", "name", "state", "script", "model", "batch_size", "global_batch_size", "amp",
           "channels_last", "workers", "pin_memory", "non_blocking", "prefetch_factor",
           "persistent_workers", "world_size", "steps", "throughput_train", "throughput_compute",
           *SPLITS, "first_step_load_s", "gpu_mem_peak_mb", "host_rss_peak_mb", "energy_j",
           "peak_power_w", "val_acc", "best_val_acc", "wall_time_s", "oom", "truncated", "error", "overlapped_by",
           "foreign_cpu", "problems")


def config_value(run: Run, key: str, default=None):
    """A config option under any of its usual names (see CONFIG_ALIASES), else from run.json."""
    for name in CONFIG_ALIASES.get(key, (key,)):
        if run.config.get(name) is not None:
            return run.config[name]
        if run.info.get(name) is not None:
            return run.info[name]
    return default


def as_number(value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def run_metric(run: Run, key: str):
    """A step figure: the median of the run's settled steps (stats.step_values: the warm-up read from the step
    times), as every comparison reads it; else rank 0's summary."""
    settled = stats.step_values(run, key)
    return float(np.median(settled)) if len(settled) else as_number(run.summary.get(key))


def _peak(run: Run, key: str, step_key: str | None = None):
    values = [as_number(s.get(key)) for s in run.summaries]
    values = [v for v in values if v is not None]
    if not values and step_key:
        metrics = run.metrics
        if step_key in metrics:
            values = pd.to_numeric(metrics[step_key], errors="coerce").dropna().tolist()
    return max(values) if values else None


def _energy(run: Run):
    """NVML's counter is a whole GPU's: ranks naming the same gpu_uuid count once (largest reading);
    readings without a uuid (older records) add up per rank."""
    per_gpu, total, found = {}, 0.0, False
    for summary in run.summaries:
        value = as_number(summary.get("energy_j"))
        if value is None:
            continue
        found, uuid = True, summary.get("gpu_uuid")
        if isinstance(uuid, str) and uuid:
            per_gpu[uuid] = max(per_gpu.get(uuid, 0.0), value)
        else:
            total += value
    return total + sum(per_gpu.values()) if found else None


def _val_acc(run: Run, key: str):
    value = as_number(run.summary.get(key))
    if value is not None:
        return value
    vals = run.lines("val")
    if "val_acc" not in vals or vals.empty:
        return None
    series = pd.to_numeric(vals["val_acc"], errors="coerce").dropna()
    if series.empty:
        return None
    return float(series.max() if key == "best_val_acc" else series.iloc[-1])


def run_row(run: Run) -> dict:
    steps = run.steps
    batch = config_value(run, "batch_size")
    global_batch = config_value(run, "global_batch_size")
    if global_batch is None and "batch_size" in steps and not steps.empty:
        global_batch = steps["batch_size"].iloc[-1]
    if global_batch is None and batch is not None:
        global_batch = batch * run.world_size
    row = {
        "run_id": run.run_id, "state": run.state, "script": run.info.get("script"),
        "world_size": run.world_size, "global_batch_size": global_batch,
        "steps": run.summary.get("steps", len(steps)),
        **{k: config_value(run, k) for k in ("name", "model", "batch_size", "amp", "channels_last",
                                             "workers", "pin_memory", "non_blocking",
                                             "prefetch_factor", "persistent_workers")},
        **{k: run_metric(run, k) for k in ("throughput_train", "throughput_compute", *SPLITS)},
        "first_step_load_s": as_number(run.summary.get("first_step_load_s")),
        "gpu_mem_peak_mb": _peak(run, "gpu_mem_peak_mb", "gpu_mem_mb"),
        "host_rss_peak_mb": _peak(run, "host_rss_peak_mb"),
        "energy_j": _energy(run), "peak_power_w": _peak(run, "peak_power_w"),
        "val_acc": _val_acc(run, "val_acc"), "best_val_acc": _val_acc(run, "best_val_acc"),
        "wall_time_s": as_number(run.summary.get("wall_time_s")),
        "oom": run.oom, "truncated": run.truncated, "error": run.error,
        # what the reader skipped or dropped (an unreadable file is in `state` already)
        "problems": "; ".join(p for p in run.problems if p != run.unreadable),
    }
    return row


def runs_table(runs=None, runs_dir=None) -> pd.DataFrame:
    """One row per run (ids, paths or Run objects; default: every run under runs_dir).

    A run whose record cannot be read is a row too: `state` says "unreadable: rank<k>/<file>: <why>",
    `problems` lists lines skipped and fields dropped by the reader (empty when none).

    `overlapped_by` lists the runs that ran at the same time on the same devices (see overlap.py):
    such a row's speed is not a valid measurement. `foreign_cpu` is the share of its cores that work outside
    the course kept busy (see overlap.foreign_cpu_share); above overlap.BUSY_SHARE, neither is it."""
    from dlokit.analysis.overlap import foreign_cpu_share, overlapping

    runs = load_runs(runs, runs_dir)
    overlaps = overlapping(runs)
    rows = [{**run_row(r), "overlapped_by": ", ".join(overlaps.get(r.run_id, [])), "foreign_cpu": foreign_cpu_share(r)}
            for r in runs]
    for row in rows:
        row["state"] = state_as_expected(row["run_id"], row["state"])
    return pd.DataFrame(rows, columns=list(COLUMNS))


def state_as_expected(run_id: str, state: str) -> str:
    """A run whose job failed as its job card expected (a demonstration, e.g. TP4.2's DDP out of memory):
    "failed as expected (why)"; any other state as it is. Looked up only for runs that did not complete."""
    if state == "completed":
        return state
    from dlokit.submission import jobs

    try:
        card = jobs.find_card(run_id)
    except (LookupError, ValueError, OSError):  # not a job of this profile (another folder, another user's)
        return state
    if not card.expected:
        return state
    why = jobs.card_outcome(card).expected
    return f"{state} as expected ({why})" if why else state


# ---- how every table reads in a notebook -------------------------------------------------------------------
# One renderer for every DataFrame a notebook shows (use_in_notebook: the day's set-up cell installs it): each
# number column to one count of decimals, ids on one line, long texts footnoted, columns with nothing in them left
# out (said so), and a footnote saying what each number is: `frame.attrs["basis"]` (the table's own word),
# `frame.attrs["notes"]`, and COLUMN_BASIS for the columns it shows. A table may also name columns to leave out
# (`attrs["hidden"]`), columns whose long texts are footnoted (`attrs["footnoted"]`, besides FOOTNOTED's), and short
# labels for its headers (`attrs["labels"]`, {column: label}: the footnote says what each label stands for).

COLUMN_BASIS = {  # what a runs_table column's number is, wherever a table shows that column
    "throughput_train": "images/s (tokens/s on Day 4) over the whole step, data included",
    "throughput_compute": "images/s of the step's compute, data wait left out",
    **{k: "seconds per step in this phase" for k in SPLITS},
    "first_step_load_s": "seconds the first batch waited for the loader",
    "gpu_mem_peak_mb": "peak over the run, MiB (the largest rank's)",
    "host_rss_peak_mb": "peak resident memory of the process, MiB (the largest rank's)",
    "energy_j": "joules over the run, each GPU counted once",
    "peak_power_w": "the highest power reading, W",
    "val_acc": "validation accuracy at the last epoch",
    "best_val_acc": "best validation accuracy over the epochs",
    "wall_time_s": "seconds from the script's start to its end",
    "foreign_cpu": "share of the run's cores that other programs kept busy",
}
SETTLED = "median of the run's settled steps (the warm-up left out)"
STEP_COLUMNS = ("throughput_train", "throughput_compute", *SPLITS)
ID = re.compile(r"^(?=.*[-_…])[\w.@…-]*\d[\w.@…-]*$")  # 1128-143005-d3b7, 12_1, 1128-…-d3b7: never broken
NO_WRAP = ("run_id", "job_id", "job", "runs", "run", "arm", "name", "state", "mode", "layout", "study")
SCIENTIFIC = -1  # a column's count of decimals: scientific notation, three significant digits
SAME_ROWS = 3  # a column with one value in this many rows or more is said once, in the footnote ...
FOLDABLE = ("state", "script", "model", "amp", "source", "world_size", "schedule")  # ... a number's, or one of these
LONG_TEXT = 40  # characters: a text cell longer than this is footnoted in FOOTNOTED columns, wraps elsewhere
FOOTNOTED = ("basis", "why", "verdict", "note")
OUTPUT_PX, CHAR_PX, CELL_PAD_PX = 968, 7.2, 14  # JupyterLab's output width, one character, a cell's padding


def decimals(values) -> int | None:
    """One count of decimals for a whole column: three significant digits of its typical (median) value, never
    more than the values carry (a column rounded to 2 keeps 2) nor more than 4; whole numbers none. None: a column
    spanning orders of magnitude, or holding a tiny value (learning rates, loss differences, times of 0.2 ms), which
    reads in scientific notation."""
    numbers = np.abs(np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float))
    if not len(numbers) or (numbers == np.round(numbers)).all():  # counts, bytes, batch sizes: whole numbers
        return 0
    nonzero = numbers[numbers > 0]
    if len(nonzero) and (nonzero.max() / nonzero.min() > 1e3 or nonzero.min() < 1e-3):
        return None
    typical = float(np.median(numbers[numbers > 0])) if (numbers > 0).any() else 1.0
    wanted = min(4, max(0, 2 - math.floor(math.log10(typical))))
    carried = max(next((k for k in range(7) if abs(round(v, k) - v) < 1e-9 * max(1.0, abs(v))), 6) for v in numbers)
    return min(wanted, carried)


def _groups(columns) -> dict[str, str]:
    """{column: its group}: a value and its interval share their decimals (x, x_low, x_high; x, low, high; or an
    interval named its own way, load_low after load_s_per_step, right after its value)."""
    columns = [str(c) for c in columns]
    group, last = {}, None
    for column in columns:
        base = "" if column in ("low", "high") else re.sub(r"_(low|high)(?=$|_)", "", column)
        if base == column:
            last = column
        elif base not in columns and last is not None:
            base = last
        group[column] = base
    return group


def _interval_decimals(frame: pd.DataFrame, members: list) -> int | None:
    """A value with its interval: the decimals the intervals support (stats.decimals, the most any row needs, at
    most 4); None when the group has no interval."""
    low = next((c for c in members if "low" in c), None)
    high = next((c for c in members if "high" in c), None)
    if low is None or high is None:
        return None
    found = [stats.decimals(a, b) for a, b in zip(pd.to_numeric(frame[low], errors="coerce"),
                                                  pd.to_numeric(frame[high], errors="coerce"))]
    found = [d for d in found if d is not None]
    return min(4, max(found)) if found else None


def _is_number_column(series: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series)


def _short(text: str) -> str:
    """A long text's first clause, for a cell whose whole text goes to a footnote."""
    head = re.split(r" \(|: |; ", text, maxsplit=1)[0]
    if len(head) > 28:
        head = head[:28].rsplit(", ", 1)[0] if ", " in head[:28] else head[:27] + "…"
    return head


def _cell(value, column: str, places: int | None, footnotes: list, footnoted=FOOTNOTED) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return "–"
    if places == SCIENTIFIC:
        return f"{float(value):.2e}"
    if places is not None:  # thousands apart by a narrow no-break space: 12 345 never breaks over two lines
        return f"{float(value):,.{places}f}".replace(",", "\u202f")
    text = _text(value)
    if column in footnoted and len(text) > LONG_TEXT:
        if text not in footnotes:
            footnotes.append(text)
        return f"{html.escape(_short(text))}<sup>{footnotes.index(text) + 1}</sup>"
    if (column in NO_WRAP and len(text) <= 24) or ID.match(text):
        return f'<span style="white-space:nowrap">{html.escape(text)}</span>'
    if len(text) > LONG_TEXT:
        return f'<div style="min-width:14em;white-space:normal">{_unbroken_ids(text)}</div>'
    return _unbroken_ids(text)


def _text(value) -> str:
    """A cell's text: a dict as 'allreduce 1, allgather 2', a list as 'a, b', not Python's repr."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {_text(v)}" for k, v in value.items()) or "none"
    if isinstance(value, (list, tuple)):
        return ", ".join(_text(v) for v in value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _unbroken_ids(text: str) -> str:
    """The text, escaped, each id in it on one line (a browser breaks 1128-143005-d3b7 at its hyphens)."""
    def one(word: str) -> str:
        unbroken = "-" in word and ID.match(word.rstrip(",;:)"))
        return f'<span style="white-space:nowrap">{html.escape(word)}</span>' if unbroken else html.escape(word)
    return " ".join(one(word) for word in text.split(" "))


def _empty(series: pd.Series) -> bool:
    return all(v is None or v == "" or (isinstance(v, float) and math.isnan(v)) for v in series)


def _min_chars(cell: str) -> float:
    """The narrowest a rendered cell can be, in characters: a nowrap span whole, a long text its min-width, else its
    longest word (what a browser's table layout shrinks a column to)."""
    if "min-width:14em" in cell:
        return 14 * 1.6  # an em is about 1.6 characters of the table's font
    cell = re.sub(r'<span style="white-space:nowrap">(.*?)</span>', lambda m: m.group(1).replace(" ", "\u00a0"),
                  cell.replace("<wbr>", " "))  # a nowrap span: one unbreakable unit
    text = html.unescape(re.sub(r"<[^>]+>", "", cell))
    return max((len(word) for word in text.split(" ")), default=0)


def width_px(cells: pd.DataFrame) -> float:
    """About the narrowest a table of these rendered cells (html_of's) can be laid out, in pixels: each column as
    wide as its widest unbreakable cell or header part (headers break at '_')."""
    widths = [max([_min_chars(str(v)) for v in cells[c]] + [_min_chars(str(c))]) for c in cells]
    index = max((len(str(i)) for i in cells.index), default=0) if not isinstance(cells.index, pd.RangeIndex) else 0
    return (sum(widths) + index) * CHAR_PX + CELL_PAD_PX * (len(widths) + 1)


def named(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy whose column names are text (a MultiIndex's joined by spaces)."""
    frame = frame.copy()
    frame.columns = [str(c) if not isinstance(c, tuple) else " ".join(map(str, c)) for c in frame.columns]
    return frame


class Rendered(NamedTuple):
    cells: pd.DataFrame  # as html_of writes them
    footnotes: list  # the long texts a cell shows the start of, numbered from 1
    said: list  # the columns said once: one value in every row, or nothing in them
    shown: list  # the frame's columns still there, alone or with their interval


def rendered(frame: pd.DataFrame) -> Rendered:
    """The table's cells as html_of writes them, and what goes to its footnote."""
    frame = named(frame).drop(columns=frame.attrs.get("hidden", []), errors="ignore")
    empty = [c for c in frame.columns if _empty(frame[c])] if len(frame) else []
    frame = frame.drop(columns=empty)
    for column in frame.columns:  # numbers beside None (a GPU figure on a CPU run) read as numbers
        values = [v for v in frame[column] if v is not None and not (isinstance(v, float) and math.isnan(v))]
        if frame[column].dtype == object and values and all(isinstance(v, (int, float, np.number)) and
                                                             not isinstance(v, (bool, np.bool_)) for v in values):
            frame[column] = pd.to_numeric(frame[column], errors="coerce")
    wanted = frame.attrs.get("decimals", {})
    group = _groups(frame.columns)
    own = {c: decimals(pd.to_numeric(frame[c], errors="coerce")) for c in frame.columns if _is_number_column(frame[c])}
    places = {}
    for column in own:  # a group with one column in scientific notation reads all of it so
        members = [c for c in own if group[c] == group[column]]
        shared = [own[c] for c in members]
        supported = _interval_decimals(frame, members)
        places[column] = wanted.get(column, SCIENTIFIC if None in shared else
                                    max(shared) if supported is None else supported)
    footnotes: list[str] = []
    footnoted = (*FOOTNOTED, *frame.attrs.get("footnoted", ()))
    cells = pd.DataFrame({c: [_cell(v, c, places.get(c), footnotes, footnoted) for v in frame[c]]
                          for c in frame.columns}, index=frame.index)
    cells = _with_intervals(cells, _groups(frame.columns))
    foldable = [*places, *FOLDABLE]  # numbers and settings; never a verdict, a check's result or an outcome
    same = [c for c in cells.columns if c in foldable and len(cells) >= SAME_ROWS and cells[c].nunique() == 1]
    said = [f"{c}: {html.unescape(re.sub(r'<[^>]+>', '', cells[c].iloc[0]))} in every row" for c in same]
    if empty:
        said.append(f"left out, nothing in them here: {', '.join(map(str, empty))}")
    cells = cells.drop(columns=same)
    labels = {c: str(label) for c, label in frame.attrs.get("labels", {}).items() if c in cells.columns}
    if labels:
        said.append("labels: " + ", ".join(f"{label} = {c}" for c, label in labels.items()))
    cells.columns = [labels.get(c, c).replace("_", "_<wbr>") for c in cells.columns]  # a long header wraps at "_"
    return Rendered(cells, footnotes, said, list(frame.columns))


def _with_intervals(cells: pd.DataFrame, group: dict) -> pd.DataFrame:
    """A value and its interval's two columns (x, x_low, x_high; x, low, high) as one: "1.52 [1.34–1.71]", headed
    "x [low–high]": three columns' width in one."""
    columns, out = list(cells.columns), {}
    k = 0
    while k < len(columns):
        column = columns[k]
        pair = columns[k + 1:k + 3]
        if (len(pair) == 2 and all(group[c] == column and c != column for c in pair)
                and "low" in pair[0] and "high" in pair[1]):
            out[f"{column} [low–high]"] = [_with_interval(v, low, high)
                                           for v, low, high in zip(cells[column], cells[pair[0]], cells[pair[1]])]
            k += 3
        else:
            out[column] = list(cells[column])
            k += 1
    return pd.DataFrame(out, index=cells.index)


def _with_interval(value: str, low: str, high: str) -> str:
    """'1.52 [1.34–1.71]'; the value alone where there is no interval, or one of no width (a baseline's 1)."""
    if value in ("", "–"):
        return "–"
    if low in ("", "–") or high in ("", "–") or low == high == value:
        return value
    return f'<span style="white-space:nowrap">{value} [{low}–{high}]</span>'


def basis_lines(frame: pd.DataFrame) -> list[str]:
    """The footnote's lines: what the table's numbers are (its own basis, then each known column's)."""
    lines = [frame.attrs["basis"]] if frame.attrs.get("basis") else []
    steps = [c for c in frame.columns if c in STEP_COLUMNS]
    if steps and not frame.attrs.get("basis"):
        lines.append(f"{', '.join(steps)}: {SETTLED}")
    by_text: dict[str, list[str]] = {}
    for column in frame.columns:
        if column in COLUMN_BASIS:
            by_text.setdefault(COLUMN_BASIS[column], []).append(str(column))
    lines += [f"{', '.join(columns)}: {text}" for text, columns in by_text.items()]
    return lines + [str(n) for n in frame.attrs.get("notes", [])]


def html_of(frame: pd.DataFrame) -> str:
    """The table as a notebook shows it (see this section's head)."""
    table = rendered(frame)
    body = table.cells.to_html(escape=False, index=not isinstance(frame.index, pd.RangeIndex), border=0,
                               classes="dataframe dlokit-table", na_rep="–")
    notes = [f"<sup>{k}</sup> {html.escape(text)}" for k, text in enumerate(table.footnotes, 1)]
    notes += [html.escape(line) for line in [*basis_lines(named(frame)[table.shown]), *table.said]]
    foot = "".join(f"<div>{n}</div>" for n in notes)
    return (f'<div class="dlokit-table-box" style="max-width:100%;overflow-x:auto">{body}'
            f'<div class="dlokit-basis" style="font-size:85%;color:#555;margin-top:2px">{foot}</div></div>')


def use_in_notebook() -> None:
    """Every DataFrame this kernel shows goes through html_of (the day's set-up cell calls it); nothing outside
    IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, _shown)


def _shown(frame: pd.DataFrame) -> str:
    """html_of, or pandas' own table should a frame defeat it: showing a table never fails a cell."""
    if type(frame)._repr_html_ is not pd.DataFrame._repr_html_:
        return frame._repr_html_()  # a table that draws itself (the checks' scoreboard, with what to do next)
    try:
        return html_of(frame)
    except Exception as error:  # noqa: BLE001 (any frame a cell displays)
        return frame._repr_html_() + f"<p><small>(shown as pandas does: {html.escape(repr(error))[:200]})</small></p>"
