"""Analysis helpers for the notebooks: read run records and profiler traces, plot what they show.

Every function accepts run ids, run folders or Run objects, and never fails on a run that is still
running, was killed, failed or is missing: it says so in the table or figure instead. Plots return a
matplotlib Figure (shown when it is the cell's value), tables a pandas DataFrame.
"""
from dlokit.analysis.comm_timeline import communication_timeline
from dlokit.analysis.compare import Comparison, compare_runs, fastest_shown
from dlokit.analysis.compress import compression_plot, compression_table
from dlokit.analysis.batchnorm import bn_statistics_plot, bn_statistics_table, running_stats_table
from dlokit.analysis.curves import epoch_times, training_curves
from dlokit.analysis.dashboard import dashboard
from dlokit.analysis.dataloader import dataloader_trials
from dlokit.analysis.figures import message_figure
from dlokit.analysis.compile_storage import (compile_plot, compile_table, control_flow_table, fastest_read, read_plot,
                                             read_table)
from dlokit.analysis.large_batch import lr_finder_plot, lr_trials, optimizer_plot, optimizer_table
from dlokit.analysis.memory import (BatchScan, batch_scan, batch_speeds, chosen_batch, memory_fit, memory_table,
                                    memory_vs_batch, throughput_vs_batch)
from dlokit.analysis.power import power_table, power_vs_batch
from dlokit.analysis.profiler import (allreduce_share, breakdown_pie, communication_per_step, profiler_breakdown,
                                      trace_files)
from dlokit.analysis.run import Run, list_run_ids, load_run, load_runs
from dlokit.analysis.overlap import foreign_cpu_share, overlapping
from dlokit.analysis.pipeline import bubble_plot, bubble_table, bubble_trend, pipeline_events, pipeline_timeline
from dlokit.analysis.scaling import ScalingError, scaling_plot, scaling_table
from dlokit.analysis.table import config_value, runs_table
from dlokit.analysis.tp_check import tp_check_table


def run_picker(runs_dir=None, metric: str = "throughput_train"):
    """The notebook widget (imported lazily: ipywidgets is only needed here)."""
    from dlokit.analysis.picker import run_picker as make

    return make(runs_dir, metric)


__all__ = ["tp_check_table", "running_stats_table", "BatchScan", "batch_scan", "fastest_shown", "Comparison", "Run", "ScalingError", "overlapping", "foreign_cpu_share", "breakdown_pie", "communication_per_step", "allreduce_share", "compare_runs", "config_value", "dashboard",
           "dataloader_trials", "list_run_ids", "load_run", "load_runs", "batch_speeds", "chosen_batch", "memory_fit", "memory_table",
           "memory_vs_batch", "message_figure", "profiler_breakdown", "run_picker", "runs_table",
           "scaling_plot", "scaling_table", "throughput_vs_batch", "trace_files", "training_curves", "epoch_times",
           "bubble_plot", "bubble_table", "bubble_trend", "compression_plot", "compression_table", "pipeline_events",
           "pipeline_timeline", "lr_finder_plot", "lr_trials", "optimizer_plot", "optimizer_table", "compile_plot", "compile_table", "control_flow_table", "bn_statistics_plot", "bn_statistics_table", "read_plot", "read_table", "fastest_read",
           "power_table", "power_vs_batch", "communication_timeline"]
