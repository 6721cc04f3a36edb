"""Check tensor parallelism on one layer: the model's feed-forward (SwiGLU: w1 and w3 split by columns,
w2 by rows), split over the ranks, against the same layer in one process.

    torchrun --nproc_per_node=2 check_tp.py                # your parallel_tp_scratch.py (TP4.4)
    torchrun --nproc_per_node=2 check_tp.py --solution     # the reference, solutions/parallel_tp_scratch.py

Three versions of the split, each compared with the whole layer on the same input and weights:
  scratch            parallel_tp_scratch.split_sublayer: f before, g after (autograd Functions)
  dtensor            parallel_tp_dtensor.parallelize_sublayer: ColwiseParallel, RowwiseParallel
  sequence_parallel  the same with the input and the output split along the sequence
Compared: the output, the input's gradient and every weight's gradient (this rank's part of the whole
layer's). Counted, by collectives.CollectiveLog (a dispatcher hook: it sees every collective, however it is
called), forward and backward apart: the scratch and DTensor versions need one all-reduce each way,
sequence parallelism one all-gather and one reduce-scatter each way.

Run record (script `check_tp.py`): one `tp_check` line per version and, in summary.json, `tp_checks`
({version: that line}) and `all_ok`. Exit code 0 when the check ran, whatever it found; 2 for bad options.
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from dlokit.in_job import rank as dlorank
from dlokit.in_job.peers import leave_now
from dlokit.in_job.runrecord import RunRecorder, shared_run_id
from dlokit.script_modules import load_script

from llm_kit.collectives import CollectiveLog
from llm_kit.model import FeedForward, get_config
from llm_kit.parallel_tp_dtensor import parallelize_sublayer
from llm_kit.ranks_done import ranks_done

HERE = Path(__file__).resolve().parent
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall", "send", "recv", "gather",
               "scatter", "reduce")
EXPECTED = {  # collective -> calls, (forward, backward)
    "scratch": ({"allreduce": 1}, {"allreduce": 1}),
    "dtensor": ({"allreduce": 1}, {"allreduce": 1}),
    "sequence_parallel": ({"allgather": 1, "reduce_scatter": 1}, {"allgather": 1, "reduce_scatter": 1}),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--solution", action="store_true", help="check solutions/parallel_tp_scratch.py, not your copy")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--ffn-dim", type=int, default=176)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs-dir", default=None)
    return p.parse_args(argv)


def communication(counts: dict) -> dict:
    """CollectiveLog's entries that are communication (it also sees DTensor's `wrap_tensor_autograd`)."""
    return {name: n for name, n in counts.items() if name in COLLECTIVES}


def local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def run_split(layer, x, grad_out, sequence_slice):
    """Forward and backward of one split layer, counting the collectives each way. With sequence
    parallelism (`sequence_slice` not None) this rank holds x, y and their gradients for those positions only."""
    x = (x[:, sequence_slice] if sequence_slice is not None else x).detach().requires_grad_()
    with CollectiveLog() as forward:
        y = local(layer(x))
    with CollectiveLog() as backward:
        y.backward(grad_out[:, sequence_slice] if sequence_slice is not None else grad_out)
    return y.detach(), x.grad, forward, backward


def compare(version, reference, split_layer, x, grad_out, rank, world, sequence_slice=None) -> dict:
    y, x_grad, forward_log, backward_log = run_split(split_layer, x, grad_out, sequence_slice)
    forward, backward = communication(forward_log.calls), communication(backward_log.calls)
    want_y, want_x_grad, want_grads = reference
    if sequence_slice is not None:
        want_y, want_x_grad = want_y[:, sequence_slice], want_x_grad[:, sequence_slice]
    weight_diffs = []
    for name, whole in want_grads.items():  # this rank's part of each whole-layer gradient
        dim = 1 if name == "w2" else 0
        mine = local(getattr(split_layer, name).weight.grad)
        weight_diffs.append((mine - whole.chunk(world, dim=dim)[rank]).abs().max().item())
    diffs = {"max_abs_diff_output": (y - want_y).abs().max().item(),
             "max_abs_diff_input_grad": (x_grad - want_x_grad).abs().max().item(),
             "max_abs_diff_weight_grad": max(weight_diffs)}
    scale = max(want_y.abs().max().item(), want_x_grad.abs().max().item(), 1e-12)
    expected_forward, expected_backward = EXPECTED[version]
    matches = all(d <= 1e-4 * scale for d in diffs.values())
    counts_ok = forward == expected_forward and backward == expected_backward
    return {"version": version, **diffs, "matches": matches, "forward_collectives": forward,
            "backward_collectives": backward, "forward_bytes": communication(forward_log.bytes),
            "backward_bytes": communication(backward_log.bytes),
            "expected_forward": expected_forward,
            "expected_backward": expected_backward, "counts_as_expected": counts_ok, "ok": matches and counts_ok}


def main(argv=None) -> int:
    args = parse_args(argv)
    env = dlorank.detect()
    if env.world_size < 2:
        print("check_tp.py: error: run it on several processes (torchrun --nproc_per_node=2 check_tp.py)",
              file=sys.stderr)
        return 2
    if args.solution and not (HERE / "solutions").is_dir():
        print(f"check_tp.py: error: --solution: no solutions folder beside {HERE.name}/check_tp.py", file=sys.stderr)
        return 2
    for name, value in (("--ffn-dim", args.ffn_dim), ("--seq-len", args.seq_len), ("--dim", args.dim)):
        if value % env.world_size:
            print(f"check_tp.py: error: {name} {value} is not divisible by the {env.world_size} ranks", file=sys.stderr)
            return 2
    scratch = load_script((HERE / "solutions" if args.solution else HERE) / "parallel_tp_scratch.py")

    device = dlorank.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("tp",))
    module_file = str(Path(scratch.__file__).resolve().relative_to(HERE))
    recorder = RunRecorder({**vars(args), "world_size": world, "module_file": module_file}, rank=rank,
                           world_size=world, run_id=shared_run_id(), runs_dir=args.runs_dir, script="check_tp.py",
                           device=device)

    torch.manual_seed(args.seed)  # the same layer, input and output gradient on every rank
    config = get_config("tiny", dim=args.dim, ffn_dim=args.ffn_dim, n_heads=1, n_kv_heads=1)
    whole = FeedForward(config).to(device)
    x = torch.randn(args.batch_size, args.seq_len, args.dim, device=device)
    grad_out = torch.randn(args.batch_size, args.seq_len, args.dim, device=device)
    reference_layer = copy.deepcopy(whole)
    x_ref = x.clone().requires_grad_()
    y_ref = reference_layer(x_ref)
    y_ref.backward(grad_out)
    reference = (y_ref.detach(), x_ref.grad, {n: getattr(reference_layer, n).weight.grad for n in ("w1", "w3", "w2")})

    comm = scratch.TensorParallelComm(mesh.get_group())
    per_rank = args.seq_len // world
    splits = {
        "scratch": (scratch.split_sublayer(copy.deepcopy(whole), ("w1", "w3"), "w2", comm), None),
        "dtensor": (parallelize_sublayer(copy.deepcopy(whole), ("w1", "w3"), "w2", mesh), None),
        "sequence_parallel": (parallelize_sublayer(copy.deepcopy(whole), ("w1", "w3"), "w2", mesh,
                                                   sequence_parallel=True),
                              slice(rank * per_rank, (rank + 1) * per_rank)),
    }
    results = {}
    for version, (layer, sequence_slice) in splits.items():
        results[version] = compare(version, reference, layer, x, grad_out, rank, world, sequence_slice)
        recorder.log("tp_check", **results[version])
        if rank == 0:
            r = results[version]
            print(f"[check_tp] {version:18s} {'OK ' if r['ok'] else 'BAD'} output diff {r['max_abs_diff_output']:.2e}"
                  f" grads diff {max(r['max_abs_diff_input_grad'], r['max_abs_diff_weight_grad']):.2e}"
                  f" forward {r['forward_collectives']} backward {r['backward_collectives']}"
                  f" (expected {r['expected_forward']} / {r['expected_backward']})", flush=True)
    recorder.finish(tp_checks=results, all_ok=all(r["ok"] for r in results.values()), module_file=module_file)
    return ranks_done()


if __name__ == "__main__":
    leave_now(main())  # without the interpreter's teardown: see dlokit.in_job.peers.leave_now
