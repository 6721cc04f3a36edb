"""Read torch.profiler Chrome traces: the step-time breakdown, the profiled steps, the collectives.

Every instant of a profiler step goes to the first category active then, in this order:
Kernel (GPU compute kernels), Memcpy, Memset (GPU copies and fills), Communication (NCCL kernels
not hidden behind the ones before), Runtime (CUDA runtime/driver calls on the host), DataLoader
(inside `enumerate(DataLoader)#...__next__`), CPU Exec (host operators), Other (the rest: Python,
waiting). A CPU-only trace has no GPU categories.

Kineto (the profiler's tracer) writes two kinds of events on a CUDA run: host events (`cpu_op`,
`user_annotation`, `cuda_runtime`...) and device events on the GPU streams (`kernel`, `gpu_memcpy`,
`gpu_memset`, `gpu_user_annotation`). A `record_function` span, `ProfilerStep#N` included, is
written twice: once on the host and once (`gpu_user_annotation`) over the GPU work it launched.
Steps are counted once, from the host copy; device categories come from device events only.

`read_trace` is the one loader of trace files (plain or .gz) used here and by dlokit.checks.
"""
from __future__ import annotations

import gzip
import io
import json
import math
import zlib
from pathlib import Path

import pandas as pd

from dlokit.analysis import stats
from dlokit.analysis.figures import message_figure, new_figure
from dlokit.analysis.run import load_run, load_runs
from dlokit.in_job import untrusted

CATEGORIES = ("Kernel", "Memcpy", "Memset", "Communication", "Runtime", "DataLoader", "CPU Exec", "Other")
COLORS = dict(zip(CATEGORIES, ("tab:green", "tab:orange", "tab:olive", "tab:brown", "tab:red", "tab:purple",
                               "tab:blue", "tab:gray")))
# event "cat" (lower case; older Kineto versions capitalised some) -> category
EVENT_CATEGORY = {"kernel": "Kernel", "gpu_memcpy": "Memcpy", "memcpy": "Memcpy", "gpu_memset": "Memset",
                  "memset": "Memset", "cuda_runtime": "Runtime", "cuda_driver": "Runtime", "runtime": "Runtime",
                  "cpu_op": "CPU Exec", "operator": "CPU Exec"}
DEVICE_CATEGORIES = ("Kernel", "Memcpy", "Memset", "Communication")
OPTIONAL_CATEGORIES = ("Communication",)  # a key of _breakdown_events' totals only when the trace has some
STEP_PREFIX = "ProfilerStep#"
TYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "int": 4, "long int": 8,
              "long": 8, "bool": 1, "unsigned char": 1, "signed char": 1, "short int": 2}


TRACE_BYTES = 1024 ** 3  # a Chrome trace of a few profiled steps: tens of MiB


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


def read_trace(path) -> list[dict]:
    """Every event of a Chrome trace file (.json or .json.gz).

    A truncated or corrupted file (a job killed while the profiler wrote it) raises ValueError naming
    the file; a missing one FileNotFoundError.
    """
    path = Path(path)
    try:
        with untrusted.open_regular(path, TRACE_BYTES) as raw:  # in a run folder: see dlokit.in_job.untrusted
            handle = gzip.open(raw, "rt", encoding="utf-8") if path.name.endswith(".gz") else io.TextIOWrapper(
                raw, encoding="utf-8")
            data = json.load(handle)
    except (ValueError, EOFError, zlib.error, gzip.BadGzipFile) as error:  # JSONDecodeError is a ValueError
        raise ValueError(f"{path} is not a complete Chrome trace ({type(error).__name__}: {error}): was the job "
                         "killed while the profiler wrote it? Profile again") from error
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{path} holds JSON but no 'traceEvents' list: not a torch.profiler Chrome trace")
    return [e for e in events if isinstance(e, dict)]


def _is_timed(event: dict) -> bool:
    if event.get("ph") != "X":
        return False
    ts, dur = event.get("ts"), event.get("dur")
    return (isinstance(ts, (int, float)) and isinstance(dur, (int, float)) and math.isfinite(ts)
            and math.isfinite(dur) and dur >= 0)


def timed_events(events) -> list[dict]:
    """The complete ('X') events with a start and a duration, in microseconds."""
    return [e for e in events if _is_timed(e)]


def _load_events(path: Path) -> list[dict]:
    return timed_events(read_trace(path))


def on_device(event: dict) -> bool:
    """An event of a GPU stream (kernel, copy, fill, the GPU copy of an annotation)."""
    category = str(event.get("cat", "")).lower()
    return category.startswith("gpu_") or category in ("kernel", "memcpy", "memset")


def is_nccl(event: dict) -> bool:
    return "nccl" in str(event.get("name", "")).lower()


def profiler_steps(events) -> list[dict]:
    """One event per profiled step, oldest first: the host's `ProfilerStep#N` span.

    Kineto also writes each step as a gpu_user_annotation over the GPU work it launched; that copy is
    used only for a step that has no host span.
    """
    chosen: dict[str, dict] = {}
    for event in events:
        name = str(event.get("name", ""))
        if not name.startswith(STEP_PREFIX) or not _is_timed(event):
            continue
        if name not in chosen or (on_device(chosen[name]) and not on_device(event)):
            chosen[name] = event
    return sorted(chosen.values(), key=lambda e: e["ts"])


def _category(event: dict) -> str | None:
    if not on_device(event) and str(event.get("name", "")).startswith("enumerate(DataLoader)"):
        return "DataLoader"
    category = EVENT_CATEGORY.get(str(event.get("cat", "")).lower())
    if category == "Kernel" and is_nccl(event):
        return "Communication"
    return category


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
    """[start, end) of each profiled step: from its host span to the next one's; the last one ends with
    its host span or its last device event, whichever is later. No step marks: the whole trace."""
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in profiler_steps(events)]
    if not steps:
        return [(min(e["ts"] for e in events), max(e["ts"] + e["dur"] for e in events))]
    windows = [(start, steps[i + 1][0]) for i, (start, _) in enumerate(steps[:-1])]
    last_start, last_end = steps[-1]
    device_end = [e["ts"] + e["dur"] for e in events
                  if _category(e) in DEVICE_CATEGORIES and e["ts"] >= last_start]
    windows.append((last_start, max([last_end, *device_end])))
    return windows


def _breakdown_events(events) -> tuple[dict, int, float]:
    """(µs per category summed over the steps, number of steps, µs spanned by the steps)."""
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
    for category in OPTIONAL_CATEGORIES:
        if not by_category[category]:
            del totals[category]
    return totals, len(windows), sum(end - start for start, end in windows)


def profiler_breakdown(trace, rank: int | None = None) -> pd.DataFrame:
    """Time per category of a trace file, or of the newest trace in a folder (a run folder works too).

    Columns: ms_per_step and percent of the step, one row per CATEGORIES; attrs: trace, steps, step_ms,
    gpu (the trace holds GPU events).
    """
    trace = getattr(trace, "path", trace)
    files = trace_files(trace, rank)
    if not files:
        raise FileNotFoundError(f"no Chrome-trace JSON under {trace}")
    events = _load_events(files[-1])
    if not events:
        raise ValueError(f"{files[-1]} holds no timed events")
    totals_us, n_steps, span_us = _breakdown_events(events)
    table = pd.DataFrame({"ms_per_step": [totals_us.get(c, 0.0) / 1000 / n_steps for c in CATEGORIES]},
                         index=pd.Index(CATEGORIES, name="category"))
    table["percent"] = 100 * table["ms_per_step"] / (span_us / 1000 / n_steps)
    table.attrs.update(trace=str(files[-1]), steps=n_steps, step_ms=span_us / 1000 / n_steps,
                       gpu=any(on_device(e) for e in events))
    return table


def span_names(events) -> set[str]:
    """Names of the labelled spans of a trace (record_function labels, ProfilerStep#N, operators...)."""
    return {str(e.get("name")) for e in events if e.get("ph") == "X"}


def collectives_in_trace(path) -> pd.DataFrame:
    """Collectives seen in a profiler trace (recorded with record_shapes): calls and MiB per kind.

    Reads the host's `c10d::<collective>` operator events, whose input shapes and dtypes give the
    message size (the same on every backend: gloo on CPUs, NCCL on GPUs).
    """
    rows = []
    for event in read_trace(path):
        event_name = str(event.get("name", ""))
        if not event_name.startswith("c10d::") or event.get("ph") != "X" or on_device(event):
            continue
        args = event.get("args") or {}
        dims, types = args.get("Input Dims") or [], args.get("Input type") or []
        elements = 0
        for dim in dims[:1]:  # the first input is the tensor (list) being communicated
            shapes = dim if dim and isinstance(dim[0], list) else [dim]
            elements = sum(math.prod(s) for s in shapes if s)
        dtype = types[0] if types and types[0] in TYPE_BYTES else "float"  # a TensorList says no dtype: fp32
        rows.append({"collective": event_name.removeprefix("c10d::").rstrip("_"), "elements": elements,
                     "bytes": elements * TYPE_BYTES.get(dtype, 4)})
    table = pd.DataFrame(rows, columns=["collective", "elements", "bytes"])
    if table.empty:
        return pd.DataFrame(columns=["collective", "calls", "MiB"])
    out = table.groupby("collective").agg(calls=("bytes", "size"), MiB=("bytes", "sum")).reset_index()
    out["MiB"] = out["MiB"] / 2**20
    return out


COMMUNICATION_PREFIXES = ("gloo:", "nccl:")  # the backend's own spans of a collective's work (its threads, or kernels)


def communication_spans(path) -> dict:
    """One profiled rank's timeline, in µs of its trace: {"steps": [(start, end)] of each profiled step, "comm": the
    union of the collectives' spans, "compute": the union of the spans that compute, "timeline": where they were read}.

    On a CUDA trace, the GPU streams ("CUDA streams"): the steps are the device copies of `ProfilerStep#N`, the
    collectives NCCL's kernels, the computation every other kernel, copy and fill (the backward runs on autograd's
    device thread and the host's operator spans only time the launches). On a CPU trace, the host ("host threads"):
    the backend's collective spans (gloo's worker threads) and the aten operators of the training loop's thread."""
    events = timed_events(read_trace(path))
    device = [e for e in events if on_device(e)]
    if any(_category(e) == "Communication" for e in device):
        steps = [e for e in device if str(e.get("name", "")).startswith(STEP_PREFIX)]
        return {"steps": _device_step_windows(steps) if steps else _step_windows(events), "timeline": "CUDA streams",
                "comm": _merge((e["ts"], e["ts"] + e["dur"]) for e in device if _category(e) == "Communication"),
                "compute": _merge((e["ts"], e["ts"] + e["dur"]) for e in device
                                  if _category(e) in ("Kernel", "Memcpy", "Memset"))}
    main = _main_thread(events)
    return {"steps": _step_windows(events), "timeline": "host threads",
            "comm": _merge((e["ts"], e["ts"] + e["dur"]) for e in events
                           if str(e.get("name", "")).startswith(COMMUNICATION_PREFIXES) or
                           (on_device(e) and is_nccl(e))),
            "compute": _merge((e["ts"], e["ts"] + e["dur"]) for e in events
                              if e.get("tid") == main and not on_device(e) and
                              str(e.get("name", "")).startswith("aten::"))}


def _device_step_windows(steps) -> list[tuple[float, float]]:
    """[start, end) of each step on the GPU: from its device span to the next one's; the last one, its own span. A
    step annotated on several streams (its kernels' and NCCL's) spans them all."""
    spans: dict[str, list[float]] = {}
    for e in steps:
        start, end = spans.setdefault(e["name"], [e["ts"], e["ts"] + e["dur"]])
        spans[e["name"]] = [min(start, e["ts"]), max(end, e["ts"] + e["dur"])]
    ordered = sorted(spans.values())
    return [(start, ordered[i + 1][0]) for i, (start, _) in enumerate(ordered[:-1])] + [tuple(ordered[-1])]


def within(spans, start: float, end: float):
    """The merged spans cut to [start, end)."""
    return _merge((max(a, start), min(b, end)) for a, b in spans if b > start and a < end)


def communication_per_step(path) -> dict:
    """How long a profiled rank communicated, per step, from the trace itself: {"steps", "step_ms", "comm_ms",
    "exposed_ms", "timeline"}. comm_ms: the collective spans within each step (communication_spans); exposed_ms: the
    part of it during which the rank computed nothing (on a GPU no other kernel on any stream, on a CPU no aten
    operator on the main thread): communication the backward pass did not hide. Means over the profiled steps."""
    spans = communication_spans(path)
    rows = []
    for start, end in spans["steps"]:
        inside = within(spans["comm"], start, end)
        rows.append((end - start, _length(inside), _length(inside) - _overlap(inside, spans["compute"])))
    n = max(1, len(rows))
    return {"steps": len(rows), "step_ms": sum(r[0] for r in rows) / n / 1e3,
            "comm_ms": sum(r[1] for r in rows) / n / 1e3, "exposed_ms": sum(r[2] for r in rows) / n / 1e3,
            "timeline": spans["timeline"]}


def allreduce_share(exposed_ms: float, lost_ms: tuple[float, float, float], profiled_step_ms: float | None = None) -> str:
    """How much of what an N-rank step lost against one rank (lost_ms: value, low, high of its 95 % interval, from
    unprofiled runs) the all-reduce time no computation hid (exposed_ms, from a profiled run) accounts for, in words
    that never say more than the numbers: a share when the exposed time is below the loss's interval, "all of it"
    inside, and an upper bound above it (a profiled step is slower than an unprofiled one)."""
    lost, low, high = lost_ms
    if low <= 0:
        return ("the N-rank step is within noise of one rank's here (the interval of its loss includes 0): no loss to "
                "attribute to the all-reduce in these runs")
    if exposed_ms < low:
        return (f"so waiting for the all-reduce is about {100 * exposed_ms / lost:.0f} % "
                f"[{100 * exposed_ms / high:.0f}–{100 * exposed_ms / low:.0f}] of the time lost per step; the rest, about "
                f"{lost - exposed_ms:.0f} ms, is not waiting for a collective (the trace does not show what it is)")
    if exposed_ms <= high:
        return (f"so waiting for the all-reduce ({exposed_ms:.0f} ms, inside the loss's interval) accounts for all of "
                "the time lost per step, within noise")
    slower = f" (its steps took {profiled_step_ms:.0f} ms: the profiler slows them)" if profiled_step_ms else ""
    return (f"the exposed all-reduce time ({exposed_ms:.0f} ms) is more than the whole loss [{low:.0f}–{high:.0f} ms]: "
            f"it was measured in a profiled job{slower}, so it is an upper bound; the all-reduce can account for all of "
            "the loss, and these runs cannot say whether anything else adds to it")


def _main_thread(events):
    """The thread of the ProfilerStep spans: the training loop's."""
    steps = profiler_steps(events)
    return steps[0].get("tid") if steps else None


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


def breakdowns_of(jobs, titles) -> dict:
    """{title: profiler_breakdown} of each job's trace (TP1.4: one per batch size); a job without a usable trace
    is said, and left out."""
    breakdowns = {}
    for job, title in zip(jobs, titles):
        try:
            table = profiler_breakdown(load_run(job).path / "profile")
        except (OSError, ValueError) as error:
            print(f"{title} (job {job}): {no_trace_because(job, error)}")
            continue
        breakdowns[title] = table
        print(f"{title}: {table.attrs['step_ms']:.1f} ms per profiled step, trace {table.attrs['trace']}")
    return breakdowns


def no_trace_because(job: str, error: Exception) -> str:
    """Why a job left no trace to read: its error where it failed (the student's file and line), else the TODO."""
    from dlokit.submission.jobs import job_outcome

    try:
        failure = job_outcome(job).error
    except (LookupError, OSError):  # no card: a run record alone
        failure = ""
    if failure:
        return f"failed: {failure}; fix it and submit again"
    return f"no usable trace ({error}): complete the TODO TP1.4 places and submit again"


def breakdown_percents(breakdowns: dict) -> pd.DataFrame:
    """Each breakdown's share of the step per category (%), one column per title (no column when none). The
    categories no trace has any time in (a CPU's: no kernel, copy or CUDA call) are said once below, not as rows of 0."""
    if not breakdowns:
        return pd.DataFrame()
    table = pd.concat([t["percent"].rename(title) for title, t in breakdowns.items()], axis=1).round(1)
    empty = table.index[(table == 0).all(axis=1)]
    shown = table.drop(index=empty)
    shown.attrs["basis"] = "% of the profiled step's time, per category (the TensorBoard profiler's)"
    if len(empty):
        shown.attrs["notes"] = [f"no time in {', '.join(map(str, empty))} in any trace"
                                + (": the runs had no GPU" if {"Kernel", "Runtime"} <= set(empty) else "")]
    return shown


def breakdown_pies(breakdowns: dict):
    """breakdown_pie of breakdowns_of's tables, or what to do when no job left a trace."""
    if not breakdowns:
        return message_figure("no profiler trace to draw: why each job left none is said above",
                              title="step-time breakdown")
    return breakdown_pie(list(breakdowns.values()), titles=list(breakdowns))


def measured_allreduce(run, traces, gradient_mib: float, active_steps: int = 2) -> pd.DataFrame:
    """TP2.3: the collectives of a profiled DDP job's last trace, MiB per step and rank (`active_steps` profiled
    steps), beside the gradients' `gradient_mib`; empty, with the reason said, when it cannot hold an all-reduce."""
    if traces and run.world_size < 2:
        print(f"job {run.run_id} ran one process: it hands nothing to another rank, so its trace holds no all-reduce "
              "(DDP needs 2 or more; ask for more with n_gpu)")
    elif not traces:
        print(f"no trace for job {run.run_id} ({run.state}): the profiler part of the script (TP1.4) is needed here")
    if not traces or run.world_size < 2:
        return pd.DataFrame(columns=["collective", "MiB", "MiB per step"])
    measured = collectives_in_trace(traces[-1])
    measured["MiB per step"] = measured["MiB"] / active_steps
    allreduce = measured.loc[measured["collective"] == "allreduce", "MiB per step"].sum()
    print(f"measured all-reduce volume: {allreduce:.1f} MiB per step per rank "
          f"(gradients: {gradient_mib:.1f} MiB; the rest are the small metric and checksum reductions)")
    return measured


def allreduce_cost(traces, by_size: dict) -> str:
    """TP2.3: what a rank's step lost on the most ranks of TP2.2's runs (`by_size`: {world size: job ids}, same
    batch per rank) against one, and the share the profiled job's exposed all-reduces explain."""
    if not traces or len(by_size) < 2:
        return "no trace or no multi-rank run: nothing to measure"
    comm = communication_per_step(traces[-1])
    ones, manys = load_runs(by_size[min(by_size)]), load_runs(by_size[max(by_size)])
    step = stats.ratio(ones, manys, "t_step")  # each rank's step time, N ranks against 1
    base_ms = 1000 * stats.estimate(ones, "t_step").value
    lost = (base_ms * (step.value - 1), base_ms * (step.low - 1), base_ms * (step.high - 1))
    return "\n".join([
        f"a rank's step: {base_ms:.0f} ms alone, ×{step.value:.2f} [{step.low:.2f}–{step.high:.2f}] on "
        f"{max(by_size)} ranks: {lost[0]:.0f} ms [{lost[1]:+.0f} to {lost[2]:+.0f}] more per step (TP2.2's runs)",
        f"the profiled {max(by_size)}-rank job ({comm['steps']} steps, {comm['step_ms']:.0f} ms each): all-reduces "
        f"ran {comm['comm_ms']:.0f} ms per step, {comm['exposed_ms']:.0f} ms of it with no computation beside them "
        f"(read from its {comm['timeline']})",
        allreduce_share(comm["exposed_ms"], lost, profiled_step_ms=comm["step_ms"])])


def ddp_buckets(sizes, cap_mb: float = 25, first_mb: float = 1) -> list[int]:
    """Bucket sizes (bytes) the way DDP fills them: parameters in reverse order, the first bucket small."""
    buckets, current, cap = [], 0, first_mb * 2**20
    for size in reversed(sizes):
        current += size
        if current >= cap:
            buckets.append(current)
            current, cap = 0, cap_mb * 2**20
    return buckets + ([current] if current else [])


def gradient_traffic(model: str, process_counts, classes: int = 10) -> pd.DataFrame:
    """TP2.3's expectation: a torchvision model's fp32 gradients, in DDP's buckets, and what a ring all-reduce
    sends per rank and step on each process count; attrs["gradient_mib"]. Prints the buckets."""
    import torchvision

    network = torchvision.models.get_model(model, num_classes=classes)
    sizes = [p.numel() * 4 for p in network.parameters() if p.requires_grad]
    buckets, mib = ddp_buckets(sizes), sum(sizes) / 2**20
    print(f"{model}: {mib:.1f} MiB of fp32 gradients per step, in {len(buckets)} buckets "
          f"({', '.join(f'{b / 2**20:.1f}' for b in buckets)} MiB)")
    table = pd.DataFrame([{"processes": n, "all-reduce calls per step": len(buckets),
                           "MiB sent per rank per step (ring)": 2 * (n - 1) / n * mib} for n in process_counts])
    table.attrs["gradient_mib"] = mib
    return table
