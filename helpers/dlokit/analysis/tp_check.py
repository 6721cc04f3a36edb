"""TP4.4's table: each tensor-parallel version against the single-process layer, one line each.

    tp_check_table(job_id)    # version, largest difference, the collectives each way (measured, and what TP expects)

check_tp.py writes a `tp_check` line per version with the collectives it counted and those tensor parallelism
expects, forward and backward, apart (eleven columns, about 1,100 px: wider than a notebook's output). Here each
direction is one cell: what ran, then "as expected" or what was expected.
"""
from __future__ import annotations

import pandas as pd

from dlokit.analysis.run import load_run


def _said(counts) -> str:
    """{'allgather': 1, 'reduce_scatter': 1} as 'allgather 1, reduce_scatter 1'."""
    return ", ".join(f"{name} {n}" for name, n in counts.items()) if isinstance(counts, dict) else str(counts)


def _collectives(counted, expected) -> str:
    return f"{_said(counted)} (as expected)" if counted == expected else f"{_said(counted)} (expected {_said(expected)})"


def tp_check_table(job_id) -> pd.DataFrame:
    run = load_run(job_id)
    lines = run.lines("tp_check")
    if lines.empty:
        return lines
    table = pd.DataFrame({
        "version": lines["version"],
        "max |Δ| output": lines["max_abs_diff_output"],
        "forward": [_collectives(c, e) for c, e in zip(lines["forward_collectives"], lines["expected_forward"])],
        "backward": [_collectives(c, e) for c, e in zip(lines["backward_collectives"], lines["expected_backward"])],
        "bytes forward": lines["forward_bytes"].map(_said),
        "bytes backward": lines["backward_bytes"].map(_said),
        "ok": lines["ok"],
    })
    table.attrs["basis"] = (f"run {run.run_id}, rank {min(run.ranks) if run.ranks else 0}: each version's output "
                            "against the single-process layer's (max |Δ|), the collectives it ran each way against "
                            "those tensor parallelism needs, and their bytes per rank")
    return table
