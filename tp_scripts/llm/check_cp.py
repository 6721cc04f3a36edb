"""Check context parallelism on one attention: each rank holds a part of the sequence (load-balanced
chunks), attends over the whole causal window, and must give the output and gradients of the same
attention in one process.

    torchrun --nproc_per_node=2 check_cp.py                # your parallel_cp.py (TP4.5: the online softmax)
    torchrun --nproc_per_node=2 check_cp.py --solution     # the reference, solutions/parallel_cp.py

Two versions, each compared with model.causal_attention on the whole sequence:
  ring       RingAttention: K/V blocks passed around the ring, merged with the online softmax
  allgather  AllGatherKVAttention: every rank's K/V gathered, one masked attention
Compared on this rank's positions: the output and the gradients of q, k and v. Counted by
collectives.CollectiveLog, forward and backward apart: the ring sends and receives c - 1 blocks each
way; the all-gather version gathers K and V forward and all-reduces (gloo) or reduce-scatters
(NCCL) their gradients backward.

Run record (script `check_cp.py`): one `cp_check` line per version; summary.json: `cp_checks`
({version: that line}) and `all_ok`. Exit code 0 when the check ran, whatever it found; 2 for bad options.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from dlokit.in_job import rank as dlorank
from dlokit.in_job.peers import leave_now
from dlokit.in_job.runrecord import RunRecorder, shared_run_id
from dlokit.script_modules import load_script

from llm_kit.collectives import CollectiveLog
from llm_kit.model import causal_attention
from llm_kit.ranks_done import ranks_done

HERE = Path(__file__).resolve().parent
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "send", "recv")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--solution", action="store_true", help="check solutions/parallel_cp.py, not your copy")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs-dir", default=None)
    return p.parse_args(argv)


def calls(log: CollectiveLog) -> dict:
    return {name: n for name, n in log.calls.items() if name in COLLECTIVES}


def expected_calls(version: str, size: int, device) -> tuple[dict, dict]:
    if version == "ring":
        hops = {"send": size - 1, "recv": size - 1} if size > 1 else {}
        return hops, hops
    backward = {"allreduce": 2} if device.type == "cpu" else {"reduce_scatter": 2}
    return {"allgather": 2}, backward


def compare(version, attend, q, k, v, grad_out, reference, positions, device) -> dict:
    """This rank's part of q, k, v through `attend`, forward and backward, against the whole attention's."""
    mine = [t[:, :, positions].detach().requires_grad_() for t in (q, k, v)]
    with CollectiveLog() as forward:
        out = attend(*mine)
    with CollectiveLog() as backward:
        out.backward(grad_out[:, :, positions])
    want_out, want_grads = reference
    diffs = {"max_abs_diff_output": (out.detach() - want_out[:, :, positions]).abs().max().item(),
             "max_abs_diff_grads": max((t.grad - g[:, :, positions]).abs().max().item()
                                       for t, g in zip(mine, want_grads))}
    scale = max(want_out.abs().max().item(), *(g.abs().max().item() for g in want_grads))
    matches = all(d <= 1e-4 * scale for d in diffs.values())
    size = dist.get_world_size()
    expected_forward, expected_backward = expected_calls(version, size, device)
    counts_ok = calls(forward) == expected_forward and calls(backward) == expected_backward
    return {"version": version, **diffs, "matches": matches, "forward_collectives": calls(forward),
            "backward_collectives": calls(backward), "expected_forward": expected_forward,
            "expected_backward": expected_backward, "counts_as_expected": counts_ok, "ok": matches and counts_ok}


def main(argv=None) -> int:
    args = parse_args(argv)
    env = dlorank.detect()
    if env.world_size < 2:
        print("check_cp.py: error: run it on several processes (torchrun --nproc_per_node=2 check_cp.py)",
              file=sys.stderr)
        return 2
    if args.seq_len % (2 * env.world_size) or args.heads % args.kv_heads:
        print(f"check_cp.py: error: --seq-len must divide by 2 x {env.world_size} ranks and --heads by --kv-heads",
              file=sys.stderr)
        return 2
    if args.solution and not (HERE / "solutions").is_dir():
        print(f"check_cp.py: error: --solution: no solutions folder beside {HERE.name}/check_cp.py", file=sys.stderr)
        return 2
    cp = load_script((HERE / "solutions" if args.solution else HERE) / "parallel_cp.py")

    device = dlorank.init_process_group()
    group, rank, size = dist.group.WORLD, dist.get_rank(), dist.get_world_size()
    module_file = str(Path(cp.__file__).resolve().relative_to(HERE))
    recorder = RunRecorder({**vars(args), "world_size": size, "module_file": module_file}, rank=rank,
                           world_size=size, run_id=shared_run_id(), runs_dir=args.runs_dir, script="check_cp.py",
                           device=device)

    torch.manual_seed(args.seed)  # the same whole-sequence q, k, v and output gradient on every rank
    shape = (args.batch_size, args.heads, args.seq_len, args.head_dim)
    kv_shape = (args.batch_size, args.kv_heads, args.seq_len, args.head_dim)
    q, k, v = (torch.randn(s, device=device) for s in (shape, kv_shape, kv_shape))
    grad_out = torch.randn(shape, device=device)
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    out = causal_attention(*whole)
    out.backward(grad_out)
    reference = (out.detach(), [t.grad for t in whole])

    positions = cp.load_balanced_positions(args.seq_len, rank, size).to(device)
    blocks = [cp.load_balanced_positions(args.seq_len, r, size).to(device) for r in range(size)]
    versions = {"ring": cp.RingAttention(group, positions, blocks),
                "allgather": cp.AllGatherKVAttention(group, positions, torch.cat(blocks))}
    results = {}
    for version, attend in versions.items():
        results[version] = compare(version, attend, q, k, v, grad_out, reference, positions, device)
        recorder.log("cp_check", **results[version])
        if rank == 0:
            r = results[version]
            print(f"[check_cp] {version:10s} {'OK ' if r['ok'] else 'BAD'} output diff {r['max_abs_diff_output']:.2e}"
                  f" grads diff {r['max_abs_diff_grads']:.2e} forward {r['forward_collectives']}"
                  f" backward {r['backward_collectives']}", flush=True)
    recorder.finish(cp_checks=results, all_ok=all(r["ok"] for r in results.values()), module_file=module_file)
    return ranks_done()


if __name__ == "__main__":
    leave_now(main())  # without the interpreter's teardown: see dlokit.in_job.peers.leave_now
