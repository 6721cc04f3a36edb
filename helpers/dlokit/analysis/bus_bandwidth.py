"""Bus bandwidth of the collectives comm_bench.py timed, as nccl-tests defines it, with 95 % intervals.

    table = bandwidth_table(job_id)      # per op, ranks, size: time, algbw, busbw with their intervals
    bandwidth_plot(table)                # busbw against the message size, one line per op and group size
    busbw = bandwidth_curve(table)       # busbw(op, ranks, bytes) -> bytes/s: the step-time model's input

nccl-tests (doc/PERFORMANCE.md): algbw = size / time; busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for
all-gather and reduce-scatter (the bytes each rank's link carries, so that busbw compares with the link's rate
whatever n). A size's time is the median of its repeats, its interval a bootstrap of that median (stats.estimate_of_
samples); bandwidths are size / time, so their intervals are the time's, inverted.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlokit.analysis.figures import message_figure, new_figure
from dlokit.analysis.run import load_run
from dlokit.analysis.stats import estimate_of_samples

BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n}
COLUMNS = ["op", "ranks", "bytes", "repeats", "time_s", "time_low", "time_high", "algbw_gbs", "busbw_gbs",
           "busbw_low", "busbw_high"]


def bus_factor(op: str, ranks: int) -> float:
    """busbw / algbw for `op` on `ranks` ranks (nccl-tests)."""
    return BUS_FACTOR[op](ranks)


def algbw(size_bytes: float, seconds: float) -> float:
    return size_bytes / seconds


def busbw(op: str, ranks: int, size_bytes: float, seconds: float) -> float:
    return algbw(size_bytes, seconds) * bus_factor(op, ranks)


def collective_seconds(op: str, ranks: int, size_bytes: float, bus_bytes_per_s: float) -> float:
    """The time of one collective at a bus bandwidth: nccl-tests' definition read the other way."""
    if ranks < 2 or size_bytes <= 0:
        return 0.0
    return size_bytes * bus_factor(op, ranks) / bus_bytes_per_s


def bandwidth_table(run) -> pd.DataFrame:
    """One row per op, group size and message size of a comm_bench.py run (its first rank's lines: each time is
    already the slowest rank's): the median time and bandwidths in GB/s (1e9 bytes/s), each with its interval."""
    run = load_run(run) if isinstance(run, str) else run
    lines = run.lines("collective")
    rows = []
    if not lines.empty:
        for (op, ranks, size), group in lines.groupby(["op", "ranks", "bytes"], sort=True):
            t = estimate_of_samples([pd.to_numeric(group["time_s"]).to_numpy()])
            factor = bus_factor(op, int(ranks)) / 1e9
            rows.append({"op": op, "ranks": int(ranks), "bytes": int(size), "repeats": len(group),
                         "time_s": t.value, "time_low": t.low, "time_high": t.high,
                         "algbw_gbs": size / t.value / 1e9, "busbw_gbs": size / t.value * factor,
                         "busbw_low": size / t.high * factor, "busbw_high": size / t.low * factor})
    table = pd.DataFrame(rows, columns=COLUMNS)
    table.attrs["basis"] = ("time_s: the median of the repeats, each the slowest rank's; time_low–time_high and "
                            "busbw_low–busbw_high: 95 % intervals; algbw = bytes / time, busbw = algbw × the op's bus "
                            "factor (nccl-tests'), in GB/s (1e9 bytes/s)")
    table.attrs.update(run_id=run.run_id, backend=run.summary.get("backend"))
    return table


def bandwidth_curve(table: pd.DataFrame):
    """busbw(op, ranks, bytes) in bytes/s, interpolated in log-size between the measured sizes (the nearest group
    size measured, the end values past either end): small messages pay the latency, which is in their bandwidth."""
    curves = {key: (np.log(rows["bytes"].to_numpy(float)), rows["busbw_gbs"].to_numpy(float) * 1e9)
              for key, rows in table.sort_values("bytes").groupby(["op", "ranks"])}
    if not curves:
        raise ValueError("no collective was timed: run comm_bench.py on 2 ranks or more")

    def at(op: str, ranks: int, size_bytes: float) -> float:
        measured = [n for o, n in curves if o == op] or [n for _, n in curves]
        nearest = min(measured, key=lambda n: (abs(np.log(n) - np.log(max(ranks, 2))), -n))
        sizes, values = curves[(op, nearest)] if (op, nearest) in curves else next(
            v for (o, n), v in curves.items() if n == nearest)
        return float(np.interp(np.log(max(size_bytes, 1.0)), sizes, values))

    return at


def bandwidth_plot(table: pd.DataFrame):
    """busbw (GB/s, its interval as a band) against the message size, one line per op and group size."""
    if table.empty:
        return message_figure(["no collective timed"], title="bus bandwidth")
    figure, axes = new_figure(size=(8, 4.5))
    ax = axes[0, 0]
    for index, ((op, ranks), rows) in enumerate(table.groupby(["op", "ranks"])):
        color = f"C{index % 10}"
        ax.plot(rows["bytes"], rows["busbw_gbs"], "o-", color=color, label=f"{op}, {ranks} ranks")
        ax.fill_between(rows["bytes"], rows["busbw_low"], rows["busbw_high"], color=color, alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(xlabel="message size (bytes, as nccl-tests counts it)", ylabel="bus bandwidth (GB/s)",
           title=f"bus bandwidth ({table.attrs.get('backend') or 'backend?'}), 95 % intervals")
    ax.legend(fontsize=8)
    return figure
