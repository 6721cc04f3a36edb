"""Day 2's exposed communication (TP2.3): on a CUDA trace from the GPU streams' timeline, on a CPU trace from the
host's threads. The CUDA trace is the hand-made Kineto fixture of tests/fixtures/traces (make_traces.py: per step a
conv kernel 15-55 ms and a dgrad kernel 55-80 ms on stream 7, NCCL's all-reduce kernel 70-90 ms on stream 20, a
memset 90-91 ms and the optimizer's kernel 91-96 ms; the steps' device spans start at 11 and 111 ms)."""
import json

import pytest

import dlokit
from dlokit.analysis import profiler

from test_profiler_trace import CUDA

T0 = 5301234500000  # the fixtures' first µs (make_traces.py)


def test_cuda_exposed_allreduce_is_what_no_kernel_hid():
    spans = profiler.communication_spans(CUDA)
    assert spans["timeline"] == "CUDA streams"
    assert spans["steps"] == [(T0 + 11000, T0 + 111000), (T0 + 111000, T0 + 196000)]  # the device's ProfilerStep spans
    assert spans["comm"] == [[T0 + 70000, T0 + 90000], [T0 + 170000, T0 + 190000]]  # NCCL kernels, not host launches
    per_step = profiler.communication_per_step(CUDA)
    # 20 ms of NCCL kernel per step, its first 10 ms beside the dgrad kernel: 10 ms exposed. The host's aten spans
    # (launches, done by 38 ms) would have called all 20 ms, and the host's 1.6 ms nccl:all_reduce span, exposed.
    assert per_step["comm_ms"] == pytest.approx(20) and per_step["exposed_ms"] == pytest.approx(10)
    assert (per_step["steps"], per_step["step_ms"], per_step["timeline"]) == (2, pytest.approx(92.5), "CUDA streams")


def test_a_step_annotated_on_two_streams_spans_both(tmp_path):
    trace = json.loads(CUDA.read_text())
    for n, o in ((5, 0), (6, 100000)):  # Kineto also writes the step over the NCCL stream's work (stream 20)
        trace["traceEvents"].append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{n}", "pid": 0,
                                     "tid": 20, "ts": T0 + o + 70000, "dur": 20000, "args": {"stream": 20}})
    (tmp_path / "two.pt.trace.json").write_text(json.dumps(trace))
    spans = profiler.communication_spans(tmp_path / "two.pt.trace.json")
    assert spans["steps"] == [(T0 + 11000, T0 + 111000), (T0 + 111000, T0 + 196000)]


def test_cuda_timeline_labels_its_layers_as_the_streams_they_come_from():
    ax = dlokit.analysis.communication_timeline([CUDA]).axes[0]
    labels = {c.get_label() for c in ax.collections if not c.get_label().startswith("_")}
    assert labels == {"GPU kernels, copies", "NCCL kernels"}


def gloo_trace(path):
    """Two 10 ms CPU steps of one rank: aten operators on the main thread, gloo's all-reduce on its worker thread."""
    def event(name, start, dur, tid=1, cat="cpu_op"):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": T0 + start, "dur": dur}
    events = []
    for n, o in ((3, 0), (4, 10000)):
        events += [event(f"ProfilerStep#{n}", o, 10000, cat="user_annotation"),
                   event("aten::addmm", o + 1000, 5000),
                   event("gloo:all_reduce", o + 4000, 4000, tid=2, cat="user_annotation")]  # 2 ms beside addmm
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_cpu_exposed_allreduce_still_comes_from_the_host_threads(tmp_path):
    per_step = profiler.communication_per_step(gloo_trace(tmp_path / "rank0.pt.trace.json"))
    assert per_step["timeline"] == "host threads" and per_step["steps"] == 2
    assert per_step["comm_ms"] == pytest.approx(4) and per_step["exposed_ms"] == pytest.approx(2)
