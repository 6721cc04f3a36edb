"""Each rank's profiled steps on one time axis: when it computed, when its collectives ran, and where it only
waited for them (Day 2's DDP trace; any job profiled with --profile on several ranks).

    communication_timeline(traces)   # one row per rank (one trace file each), its own first step at 0 ms

Each rank's clock is its own (traces of different processes share no time base), so the rows line up at
their first profiled step, not at the same instant.
"""
from __future__ import annotations

from pathlib import Path

from dlokit.analysis.figures import message_figure, new_figure
from dlokit.analysis.profiler import communication_spans, within

LAYERS = (("compute", "tab:blue"), ("comm", "tab:orange"))
LABELS = {"host threads": {"compute": "aten operators (main thread)", "comm": "collectives"},
          "CUDA streams": {"compute": "GPU kernels, copies", "comm": "NCCL kernels"}}


def communication_timeline(traces):
    traces = [Path(t) for t in traces]
    if not traces:
        return message_figure(["no profiler trace: run the job with --profile (TP1.4)"],
                              title="communication per rank and step")
    figure, axes = new_figure(size=(11, 1.0 + 0.8 * len(traces)))
    ax = axes[0, 0]
    for row, trace in enumerate(traces):
        spans = communication_spans(trace)
        first, last = spans["steps"][0][0], spans["steps"][-1][1]
        for offset, (name, color) in enumerate(LAYERS):
            label = LABELS[spans["timeline"]][name]
            bars = [((a - first) / 1e3, (b - a) / 1e3) for a, b in within(spans[name], first, last)]
            ax.broken_barh(bars, (row + 0.05 + 0.45 * offset, 0.4), color=color, label=label if row == 0 else None)
        for start, _ in spans["steps"]:
            ax.axvline((start - first) / 1e3, ymin=row / len(traces), ymax=(row + 1) / len(traces), color="black",
                       linestyle="--", linewidth=1.0)
    ax.set_yticks([r + 0.5 for r in range(len(traces))], [t.name.split(".")[0] for t in traces])
    ax.set(xlabel="ms from the rank's first profiled step (dashed: a step starts; blank: neither, e.g. waiting for "
                  "data)", ylim=(0, len(traces)))
    ax.set_title("per rank: computation and collectives, step by step", pad=22)
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=2, frameon=False)
    return figure
