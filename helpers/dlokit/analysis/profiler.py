"""Step-time breakdown of a torch.profiler Chrome trace, by the TensorBoard profiler's categories.

Every instant of a profiler step goes to the first category active then, in this order:
Kernel (GPU kernels), Memcpy, Memset (GPU copies and fills), Runtime (CUDA runtime/driver calls on
the host), DataLoader (inside `enumerate(DataLoader)#...__next__`), CPU Exec (host operators),
Other (the rest: Python, waiting). A CPU-only trace has no GPU categories.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd

from dlokit.analysis.figures import message_figure, new_figure

CATEGORIES = ("Kernel", "Memcpy", "Memset", "Runtime", "DataLoader", "CPU Exec", "Other")
COLORS = dict(zip(CATEGORIES, ("tab:green", "tab:orange", "tab:olive", "tab:red", "tab:purple",
                               "tab:blue", "tab:gray")))
EVENT_CATEGORY = {"kernel": "Kernel", "gpu_memcpy": "Memcpy", "gpu_memset": "Memset",
                  "cuda_runtime": "Runtime", "cuda_driver": "Runtime", "cpu_op": "CPU Exec"}
DEVICE_CATEGORIES = ("Kernel", "Memcpy", "Memset")


def trace_files(path, rank: int | None = None) -> list[Path]:
    """Chrome traces in a file, a tensorboard_trace_handler folder or a run folder, oldest first.

    rank=k keeps the files named 'rank<k>.*' (the training scripts' worker_name).
    """
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        return []
    found = [p for p in path.rglob("*") if p.is_file() and p.name.endswith((".pt.trace.json", ".pt.trace.json.gz"))]
    if not found:
        found = [p for p in path.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz"))
                 and p.name not in ("run.json", "summary.json")]
    if rank is not None:
        found = [p for p in found if p.name.startswith(f"rank{rank}.")]
    return sorted(found, key=lambda p: (p.stat().st_mtime, p.name))


def _load_events(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as handle:
        data = json.load(handle)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "ts" in e and "dur" in e]


def _category(event: dict) -> str | None:
    if str(event.get("name", "")).startswith("enumerate(DataLoader)"):
        return "DataLoader"
    return EVENT_CATEGORY.get(event.get("cat"))


def _merge(intervals):
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def _length(merged) -> float:
    return sum(end - start for start, end in merged)


def _overlap(a, b) -> float:
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _step_windows(events) -> list[tuple[float, float]]:
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if str(e.get("name", "")).startswith("ProfilerStep#"))
    if not steps:
        return [(min(e["ts"] for e in events), max(e["ts"] + e["dur"] for e in events))]
    windows = [(start, steps[i + 1][0]) for i, (start, _) in enumerate(steps[:-1])]
    last_start, last_end = steps[-1]
    device_end = [e["ts"] + e["dur"] for e in events
                  if _category(e) in DEVICE_CATEGORIES and e["ts"] >= last_start]
    windows.append((last_start, max([last_end, *device_end])))
    return windows


def _breakdown_events(events) -> tuple[dict, int, float]:
    windows = _step_windows(events)
    by_category = {c: [] for c in CATEGORIES[:-1]}
    for event in events:
        category = _category(event)
        if category:
            by_category[category].append((event["ts"], event["ts"] + event["dur"]))
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for start, end in windows:
        covered = []
        for category in CATEGORIES[:-1]:
            clipped = _merge((max(s, start), min(e, end)) for s, e in by_category[category] if e > start and s < end)
            totals[category] += _length(clipped) - _overlap(clipped, covered)
            covered = _merge(covered + clipped)
        totals["Other"] += (end - start) - _length(covered)
    return totals, len(windows), sum(end - start for start, end in windows)


def profiler_breakdown(trace, rank: int | None = None) -> pd.DataFrame:
    """Time per category of a trace file, or of the newest trace in a folder (a run folder works too).

    Columns: ms_per_step and percent of the step; attrs: trace, steps, step_ms.
    """
    trace = getattr(trace, "path", trace)
    files = trace_files(trace, rank)
    if not files:
        raise FileNotFoundError(f"no Chrome-trace JSON under {trace}")
    events = _load_events(files[-1])
    if not events:
        raise ValueError(f"{files[-1]} holds no timed events")
    totals_us, n_steps, span_us = _breakdown_events(events)
    table = pd.DataFrame({"ms_per_step": [totals_us[c] / 1000 / n_steps for c in CATEGORIES]},
                         index=pd.Index(CATEGORIES, name="category"))
    table["percent"] = 100 * table["ms_per_step"] / (span_us / 1000 / n_steps)
    table.attrs.update(trace=str(files[-1]), steps=n_steps, step_ms=span_us / 1000 / n_steps)
    return table


def _short_name(trace: str) -> str:
    path = Path(trace)
    return f"{path.parent.name}/{path.name[:24]}…" if len(path.name) > 24 else f"{path.parent.name}/{path.name}"


def breakdown_pie(breakdowns, titles=None):
    """One pie per breakdown (a profiler_breakdown table or a trace path), e.g. large vs small batch."""
    if isinstance(breakdowns, (pd.DataFrame, str, Path)) or hasattr(breakdowns, "path"):
        breakdowns = [breakdowns]
    tables, problems = [], []
    for item in breakdowns:
        try:
            tables.append(item if isinstance(item, pd.DataFrame) else profiler_breakdown(item))
        except (OSError, ValueError, KeyError) as error:
            problems.append(f"{item}: {error}")
    if not tables:
        return message_figure(problems or ["no trace"], title="step-time breakdown")
    figure, axes = new_figure(1, len(tables), size=(4.5 * len(tables), 4.5))
    titles = titles or [_short_name(t.attrs.get("trace", "trace")) for t in tables]
    for ax, table, title in zip(axes[0], tables, titles):
        shown = table[table["ms_per_step"] > 0]
        ax.pie(shown["ms_per_step"], labels=shown.index, colors=[COLORS[c] for c in shown.index],
               autopct="%1.0f%%", textprops={"fontsize": 8})
        ax.set_title(f"{title}\n{table.attrs.get('step_ms', float('nan')):.1f} ms/step", fontsize=9)
    if problems:
        figure.text(0.01, 0.0, "\n".join(problems), fontsize=8, color="dimgray")
    return figure
